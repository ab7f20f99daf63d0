//! The model against the exact f32 references in `tests/data/reference/` (computed by an
//! independent implementation, HF transformers, with `tools/reference/`): dequantization of real tensors, per-position top-1, last-position KL and
//! greedy continuations, on both the exact path and the fast path. Each model is loaded once.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use rill_model::{Batch, Model, Precision};
use serde_json::Value;

fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/reference")
}

struct Fixture {
    model: Mutex<Model>,
    dir: PathBuf,
    reference: Value,
}

fn load(builtin: &str, folder: &str) -> Fixture {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::resolve(builtin, &opts)
        .unwrap_or_else(|e| panic!("{e} (run `cargo run --release -- pull {builtin}`)"));
    let model = Model::load(&path, 0).expect("model loads");
    let dir = reference_dir().join(folder);
    let reference: Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    Fixture {
        model: Mutex::new(model),
        dir,
        reference,
    }
}

fn smollm2() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| load("smollm2-135m", "smollm2-135m-instruct-q4_1"))
}

fn gemma3() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| load("gemma3-270m", "gemma3-270m-q4_k_m"))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn read_f32(path: &std::path::Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_sum = logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln();
    logits.iter().map(|&l| l as f64 - max - log_sum).collect()
}

/// KL(p || q) from logits.
fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let lp = log_softmax(p_logits);
    let lq = log_softmax(q_logits);
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Per-position argmax over the prompt, the last position's logits, and `n_greedy` greedy tokens.
fn run_case(
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

fn check_exact(f: &Fixture) {
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

fn check_fast(f: &Fixture, max_mean_kl: f64) {
    let mut model = f.model.lock().unwrap();
    let (mut agree, mut total, mut kl_sum) = (0usize, 0usize, 0f64);
    let cases = f.reference["cases"].as_array().unwrap();
    for case in cases {
        let name = case["id"].as_str().unwrap();
        let tokens = ids(&case["token_ids"]);
        let (argmaxes, last, _) = run_case(&mut model, &tokens, Precision::Fast, 0);
        for (i, pos) in case["positions"].as_array().unwrap().iter().enumerate() {
            total += 1;
            agree += usize::from(argmaxes[i] == ids(&pos["top_ids"])[0]);
        }
        let reference = read_f32(&f.dir.join(format!("{name}.last_logits.f32")));
        let d = kl(&reference, &last);
        eprintln!("{name}: fast path last-position KL {d:.5}");
        kl_sum += d;
    }
    let agreement = agree as f64 / total as f64;
    let mean_kl = kl_sum / cases.len() as f64;
    eprintln!("fast path: top-1 agreement {agreement:.4} ({agree}/{total}), mean last-position KL {mean_kl:.5}");
    assert!(agreement >= 0.96, "top-1 agreement {agreement} < 0.96");
    assert!(mean_kl <= max_mean_kl, "mean KL {mean_kl} > {max_mean_kl}");
}

fn check_dequant(f: &Fixture) {
    let model = f.model.lock().unwrap();
    let list: Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("dequant.json")).unwrap()).unwrap();
    let file = model.file();
    for entry in list.as_array().unwrap() {
        let name = entry["tensor"].as_str().unwrap();
        let row_len = entry["row_length"].as_u64().unwrap() as usize;
        let expected = read_f32(&f.dir.join(entry["file"].as_str().unwrap()));
        let info = file.tensor(name).unwrap();
        let ty = rill_kernels::QuantType::from_ggml_id(info.ggml_type.id()).unwrap();
        let row_bytes = ty.row_bytes(row_len).unwrap();
        let mut got = vec![0f32; 2 * row_len];
        let data = file.tensor_data(info);
        for r in 0..2 {
            rill_kernels::dequantize_row(
                ty,
                &data[r * row_bytes..(r + 1) * row_bytes],
                &mut got[r * row_len..(r + 1) * row_len],
            )
            .unwrap();
        }
        let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(&expected).enumerate() {
            assert!((a - b).abs() <= 1e-6 * scale, "{name}[{i}]: {a} vs {b}");
        }
    }
}

#[test]
fn smollm2_dequantizes_real_tensors() {
    check_dequant(smollm2());
}

#[test]
fn gemma3_dequantizes_real_tensors() {
    check_dequant(gemma3());
}

#[test]
fn smollm2_exact_path_matches_reference() {
    check_exact(smollm2());
}

#[test]
fn gemma3_exact_path_matches_reference() {
    check_exact(gemma3());
}

#[test]
fn smollm2_fast_path_is_as_close_as_llama_cpp() {
    check_fast(smollm2(), 0.0085);
}

#[test]
fn gemma3_fast_path_is_as_close_as_llama_cpp() {
    check_fast(gemma3(), 0.006);
}
