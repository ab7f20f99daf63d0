//! Shared by the engine's tests: the real models, synthetic ones loaded from files of their
//! own, and prompts.

#![allow(dead_code)]

use std::path::PathBuf;

use rill_engine::{Engine, GenerateParams, Precision, SamplingParams};
use rill_model::synthetic::SyntheticModel;

/// A built-in model's file, fetched on first use.
pub fn model_path(builtin: &str) -> PathBuf {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    rill_fetch::resolve(builtin, &opts)
        .unwrap_or_else(|e| panic!("{e} (run `cargo run --release -- pull {builtin}`)"))
}

/// A built-in model loaded with 2 threads.
pub fn engine(builtin: &str, precision: Precision) -> Engine {
    Engine::load(model_path(builtin), 2, precision).unwrap()
}

/// A synthetic model on the fast path with 2 threads, loaded from a temp file of its own (another
/// test's engine may still have its file mapped) that is deleted once loaded.
pub fn load_synthetic(model: &SyntheticModel) -> Engine {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("rill-engine-test-{}-{n}.gguf", std::process::id());
    let path = std::env::temp_dir().join(name);
    model.write_to_path(&path).unwrap();
    let engine = Engine::load(&path, 2, Precision::Fast).unwrap();
    std::fs::remove_file(path).unwrap();
    engine
}

/// A prompt of `n` byte tokens (32 to 121), different for each `salt`.
pub fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 32 + (i * 31 + salt * 17 + (i * i * salt) % 11) % 90)
        .collect()
}

/// Sampled generation (temperature 0.9, top-k 40, top-p 0.95, repetition penalty 1.1) of
/// `max_tokens` past any end token, seeded.
pub fn sampled(seed: u64, max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            repeat_penalty: 1.1,
            seed,
            ..SamplingParams::default()
        },
        ignore_eos: true,
        ..GenerateParams::default()
    }
}

/// Greedy generation of `max_tokens` past any end token.
pub fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        ignore_eos: true,
        ..GenerateParams::default()
    }
}
