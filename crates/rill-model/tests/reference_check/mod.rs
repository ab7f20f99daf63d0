//! Checks of a model against reference outputs in the layout of `tests/data/reference/<model>/`
//! (`reference.json`, `<case>.last_logits.f32`): per-position top-1, last-position KL and greedy
//! continuations, on the exact path and on the fast path. Shared by the test binaries of real
//! models and of the tiny models of every architecture.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rill_model::{Batch, Model, Precision};
use serde_json::Value;

/// A model with its reference folder, loaded once per test binary.
pub struct Fixture {
    pub model: Mutex<Model>,
    pub dir: PathBuf,
    pub reference: Value,
}

impl Fixture {
    pub fn new(model: Model, dir: PathBuf) -> Fixture {
        let json = std::fs::read(dir.join("reference.json"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.join("reference.json").display()));
        Fixture {
            model: Mutex::new(model),
            reference: serde_json::from_slice(&json).unwrap(),
            dir,
        }
    }
}

/// `tests/data/` at the repository root.
pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln();
    logits.iter().map(|&l| l as f64 - max - log_sum).collect()
}

/// KL(p || q) from logits.
pub fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lp = log_softmax(p_logits);
    let lq = log_softmax(q_logits);
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Per-position argmax over the prompt, the last position's logits, and `n_greedy` greedy tokens.
pub fn run_case(
    model: &mut Model,
    tokens: &[u32],
    precision: Precision,
    n_greedy: usize,
) -> (Vec<u32>, Vec<f32>, Vec<u32>) {
    let vocab = model.config().vocab_size;
    let mut kv = model
        .new_kv_cache(tokens.len() + n_greedy, precision)
        .unwrap();
    kv.add_sequence(0).unwrap();
    let mut argmaxes = Vec::new();
    let mut logits = Vec::new();
    let mut last = Vec::new();
    for (c, chunk) in tokens.chunks(64).enumerate() {
        model
            .forward(
                &Batch::prompt(0, chunk, c * 64, true),
                &mut kv,
                precision,
                &mut logits,
            )
            .unwrap();
        argmaxes.extend(logits.chunks_exact(vocab).map(argmax));
        last = logits[logits.len() - vocab..].to_vec();
    }
    let last_prompt_logits = last.clone();
    let mut greedy = Vec::new();
    for i in 0..n_greedy {
        let next = argmax(&last);
        greedy.push(next);
        if i + 1 < n_greedy {
            let mut b = Batch::new();
            b.push(0, next, tokens.len() + i, true);
            model.forward(&b, &mut kv, precision, &mut last).unwrap();
        }
    }
    (argmaxes, last_prompt_logits, greedy)
}

pub fn check_exact(f: &Fixture) {
    let mut model = f.model.lock().unwrap();
    for case in f.reference["cases"].as_array().unwrap() {
        let name = case["id"].as_str().unwrap();
        let tokens = ids(&case["token_ids"]);
        let (argmaxes, last, greedy) = run_case(&mut model, &tokens, Precision::Exact, 32);
        for (i, pos) in case["positions"].as_array().unwrap().iter().enumerate() {
            let top = ids(&pos["top_ids"]);
            let lp = floats(&pos["top_logprobs"]);
            if lp[0] - lp[1] >= 1e-3 {
                assert_eq!(
                    argmaxes[i], top[0],
                    "{name}: argmax differs at position {i}"
                );
            }
        }
        let reference = read_f32(&f.dir.join(format!("{name}.last_logits.f32")));
        let d = kl(&reference, &last);
        assert!(d <= 1e-4, "{name}: KL(ref || rill) = {d} > 1e-4");
        assert_eq!(
            greedy,
            ids(&case["greedy_ids"]),
            "{name}: greedy continuation differs"
        );
        eprintln!("{name}: exact path KL {d:.2e}, greedy matches");
    }
}

/// The fast path: top-1 agreement over every prompt position at least `min_agreement`, mean
/// last-position KL at most `max_mean_kl`; returns both.
pub fn check_fast(f: &Fixture, min_agreement: f64, max_mean_kl: f64) -> (f64, f64) {
    let mut model = f.model.lock().unwrap();
    let (mut agree, mut total, mut kl_sum) = (0usize, 0usize, 0f64);
    // The reference's top-2 gap (logits) wherever the fast path's top-1 differs.
    let mut flip_gaps: Vec<f64> = Vec::new();
    let cases = f.reference["cases"].as_array().unwrap();
    for case in cases {
        let name = case["id"].as_str().unwrap();
        let tokens = ids(&case["token_ids"]);
        let (argmaxes, last, _) = run_case(&mut model, &tokens, Precision::Fast, 0);
        for (i, pos) in case["positions"].as_array().unwrap().iter().enumerate() {
            total += 1;
            let same = argmaxes[i] == ids(&pos["top_ids"])[0];
            agree += usize::from(same);
            if !same {
                let lp = floats(&pos["top_logprobs"]);
                flip_gaps.push(f64::from(lp[0] - lp[1]));
            }
        }
        let reference = read_f32(&f.dir.join(format!("{name}.last_logits.f32")));
        let d = kl(&reference, &last);
        eprintln!("{name}: fast path last-position KL {d:.5}");
        kl_sum += d;
    }
    let agreement = agree as f64 / total as f64;
    let mean_kl = kl_sum / cases.len() as f64;
    flip_gaps.sort_by(f64::total_cmp);
    eprintln!("fast path: top-1 agreement {agreement:.4} ({agree}/{total}), mean last-position KL {mean_kl:.5}; the reference's top-2 gaps where top-1 differs: {flip_gaps:.3?}");
    assert!(
        agreement >= min_agreement,
        "top-1 agreement {agreement} < {min_agreement}"
    );
    assert!(mean_kl <= max_mean_kl, "mean KL {mean_kl} > {max_mean_kl}");
    (agreement, mean_kl)
}
