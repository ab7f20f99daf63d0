//! The two real models at long prompts against transformers in f32 (`long_context.json`, made by
//! `tools/reference/long_context.py`): 2,048 and 8,192 tokens for both, 30,000 for Gemma 3 (its
//! sliding windows included). The exact path holds the bars it holds on short prompts (KL of the
//! last position ≤ 1e-4, the same argmax where the reference's top-2 gap is ≥ 1e-3); the fast
//! path is measured with each KV cache type against the same reference.
//!
//! The 2k cases run in CI. The 8k and 30k ones take minutes on two cores and run on demand:
//! `cargo test --release -p rill-model --test long_context -- --ignored --nocapture`.

mod reference_check;

use std::sync::Mutex;

use reference_check::{argmax, data_dir, ids, kl, read_f32};
use rill_model::{Batch, KvDtype, Model, Precision};
use serde_json::Value;

/// One model, loaded once per test binary (tests share it one at a time).
fn load(builtin: &str) -> Mutex<Model> {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::resolve(builtin, &opts)
        .unwrap_or_else(|e| panic!("{e} (run `cargo run --release -- pull {builtin}`)"));
    Mutex::new(Model::load(&path, 0).expect("model loads"))
}

fn smollm2() -> &'static Mutex<Model> {
    static M: std::sync::OnceLock<Mutex<Model>> = std::sync::OnceLock::new();
    M.get_or_init(|| load("smollm2-135m"))
}

fn gemma3() -> &'static Mutex<Model> {
    static M: std::sync::OnceLock<Mutex<Model>> = std::sync::OnceLock::new();
    M.get_or_init(|| load("gemma3-270m"))
}

/// The reference case `long-<n>` of a model folder: its ids, last logits and top-2 gap.
fn case(folder: &str, n: usize) -> (Vec<u32>, Vec<f32>, f64) {
    let dir = data_dir().join("reference").join(folder);
    let doc: Value =
        serde_json::from_slice(&std::fs::read(dir.join("long_context.json")).unwrap()).unwrap();
    let id = format!("long-{n}");
    let case = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{folder}: no case {id}"));
    let logits = read_f32(&dir.join(format!("{id}.last_logits.f32")));
    (
        ids(&case["token_ids"]),
        logits,
        case["top2_gap"].as_f64().unwrap(),
    )
}

/// The last position's logits after `tokens`, prefilled in passes of 512 (as a server does).
/// Sliding-window layers get room for one window, a pass and the rollback slack only, so
/// Gemma 3's windowed layers let go of all but the last ~1,100 positions as the prompt goes in.
fn last_logits(model: &mut Model, tokens: &[u32], precision: Precision) -> Vec<f32> {
    let vocab = model.config().vocab_size;
    let window = model.config().sliding_window.unwrap_or(0);
    let held = window + 512 + rill_model::SlidingWindow::DEFAULT_ROLLBACK_SLACK + 32;
    let mut kv = model
        .new_windowed_kv_cache(tokens.len(), held, precision)
        .unwrap();
    if model.config().sliding_window.is_some() {
        assert!(kv.window_capacity_tokens() < tokens.len().max(2048));
    }
    kv.add_sequence(0).unwrap();
    let mut logits = Vec::new();
    for (c, chunk) in tokens.chunks(512).enumerate() {
        let batch = Batch::prompt(0, chunk, c * 512, false);
        model
            .forward(&batch, &mut kv, precision, &mut logits)
            .unwrap();
    }
    logits[logits.len() - vocab..].to_vec()
}

fn check_exact(model: &Mutex<Model>, folder: &str, n: usize) {
    let (tokens, reference, gap) = case(folder, n);
    let mut model = model.lock().unwrap_or_else(|e| e.into_inner());
    model.set_kv_types(None).unwrap();
    let got = last_logits(&mut model, &tokens, Precision::Exact);
    let d = kl(&reference, &got);
    eprintln!("{folder} {n} tokens: exact path KL {d:.2e}");
    assert!(d <= 1e-4, "{folder} {n}: KL(ref || rill) = {d} > 1e-4");
    if gap >= 1e-3 {
        assert_eq!(argmax(&got), argmax(&reference), "{folder} {n}: argmax");
    }
}

/// The fast path with each KV type: KL and top-1 against the reference (printed; the closing
/// note of the long-context issue tabulates them). f16, the default, holds the bar the fast
/// path holds on short prompts (mean KL of `reference.rs`); Q8_0 holds the same bar.
fn check_fast(model: &Mutex<Model>, folder: &str, n: usize, max_kl: f64) {
    let (tokens, reference, _) = case(folder, n);
    let mut model = model.lock().unwrap_or_else(|e| e.into_inner());
    for dtype in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        model.set_kv_types(Some(dtype.into())).unwrap();
        let got = last_logits(&mut model, &tokens, Precision::Fast);
        let d = kl(&reference, &got);
        let same = argmax(&got) == argmax(&reference);
        eprintln!("{folder} {n} tokens: fast path, KV {dtype}: KL {d:.5}, top-1 agrees: {same}");
        if dtype != KvDtype::Q4_0 {
            assert!(d <= max_kl, "{folder} {n} KV {dtype}: KL {d} > {max_kl}");
        }
    }
    model.set_kv_types(None).unwrap();
}

const SMOLLM2: &str = "smollm2-135m-instruct-q4_1";
const GEMMA3: &str = "gemma3-270m-q4_k_m";

#[test]
fn smollm2_2k_exact() {
    check_exact(smollm2(), SMOLLM2, 2048);
}

#[test]
fn gemma3_2k_exact() {
    check_exact(gemma3(), GEMMA3, 2048);
}

#[test]
fn smollm2_2k_fast_per_kv_type() {
    check_fast(smollm2(), SMOLLM2, 2048, 0.0085);
}

#[test]
fn gemma3_2k_fast_per_kv_type() {
    check_fast(gemma3(), GEMMA3, 2048, 0.006);
}

#[test]
#[ignore = "minutes on two cores: run with --ignored"]
fn smollm2_8k_exact_and_fast() {
    check_exact(smollm2(), SMOLLM2, 8192);
    check_fast(smollm2(), SMOLLM2, 8192, 0.0085);
}

#[test]
#[ignore = "minutes on two cores: run with --ignored"]
fn gemma3_8k_exact_and_fast() {
    check_exact(gemma3(), GEMMA3, 8192);
    check_fast(gemma3(), GEMMA3, 8192, 0.006);
}

#[test]
#[ignore = "minutes on two cores: run with --ignored"]
fn gemma3_30k_exact_and_fast() {
    check_exact(gemma3(), GEMMA3, 30000);
    check_fast(gemma3(), GEMMA3, 30000, 0.006);
}
