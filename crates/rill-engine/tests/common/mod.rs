//! Shared by the engine's tests on the real models.

#![allow(dead_code)]

use std::path::PathBuf;

use rill_engine::{Engine, Precision};

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
