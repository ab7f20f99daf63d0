//! Shared by the engine's tests: the real models, synthetic ones loaded from files of their
//! own, and prompts.

#![allow(dead_code)]

use std::path::PathBuf;

use rill_engine::{
    Engine, GenerateParams, Precision, SamplingParams, ServeConfig, ServeEvent, ServeHandle,
};
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

/// A tiny random model of `tests/data/tiny/` on the fast path with 2 threads.
pub fn tiny_engine(name: &str) -> Engine {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/tiny")
        .join(name)
        .join("model.gguf");
    Engine::load(&path, 2, Precision::Fast).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A prompt of `n` tokens of the tiny models' vocabulary (ordinary tokens, below its specials).
pub fn tiny_prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 31 + salt * 17 + (i * i * salt) % 11) % 500)
        .collect()
}

/// A small serving loop for the tiny models: 4 MiB of KV cache, 4 running, 32 rows a step.
pub fn tiny_serve_config() -> ServeConfig {
    ServeConfig {
        kv_cache_bytes: 4 << 20,
        max_batch_tokens: 32,
        max_running: 4,
        max_queue: 64,
        ..ServeConfig::default()
    }
}

/// The tokens of every choice and the cached prompt tokens of a finished request.
pub fn collect(mut stream: rill_engine::ResponseStream, n: usize) -> (Vec<Vec<u32>>, usize) {
    let mut tokens = vec![Vec::new(); n];
    let mut cached = None;
    while let Some(event) = stream.blocking_recv() {
        match event {
            ServeEvent::Token { choice, token, .. } => tokens[choice].push(token),
            ServeEvent::Usage {
                cached_prompt_tokens,
                ..
            } => cached = Some(cached_prompt_tokens),
            ServeEvent::Error { message } => panic!("{message}"),
            ServeEvent::Done { .. } => {}
        }
    }
    (tokens, cached.expect("usage"))
}

/// A single-choice request's tokens, streamed text and what ended it.
pub fn collect_text(
    stream: &mut rill_engine::ResponseStream,
) -> (Vec<u32>, String, Option<rill_engine::FinishCause>) {
    let (mut tokens, mut text, mut cause) = (Vec::new(), String::new(), None);
    while let Some(event) = stream.blocking_recv() {
        match event {
            ServeEvent::Token { token, text: t, .. } => {
                tokens.push(token);
                text.push_str(&t);
            }
            ServeEvent::Done { cause: c, .. } => cause = Some(c),
            ServeEvent::Error { message } => panic!("{message}"),
            _ => {}
        }
    }
    (tokens, text, cause)
}

/// What `prompt` gives alone, through a session.
pub fn alone(e: &mut Engine, prompt: &[u32], params: &GenerateParams) -> Vec<u32> {
    let mut s = e.new_session(256).unwrap();
    s.generate(e, prompt, params, |_| true).unwrap().tokens
}

/// The KV statistics after the loop's next step.
pub fn settled(h: &ServeHandle) -> rill_engine::KvStats {
    h.next_step().unwrap().blocking_recv().unwrap()
}

/// A metric's value from the loop's Prometheus text.
pub fn metric(h: &ServeHandle, name: &str) -> f64 {
    h.render_prometheus()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name}"))
}
