//! Shared helpers for the integration tests: the two reference models, loaded once per test
//! binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use rill_tokenizer::Tokenizer;

/// The model directory: `$RILL_HOME/models`, else `$HOME/.cache/rill/models`.
pub fn model_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("RILL_HOME") {
        return PathBuf::from(home).join("models");
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home)
        .join(".cache")
        .join("rill")
        .join("models")
}

fn load(file: &str, pull_name: &str) -> Tokenizer {
    let path = model_dir().join(file);
    assert!(
        path.exists(),
        "model file {} is missing: run `cargo run --release -- pull {pull_name}` first",
        path.display()
    );
    let gguf = rill_gguf::GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    Tokenizer::from_gguf(gguf.metadata())
        .unwrap_or_else(|e| panic!("cannot build the tokenizer of {}: {e}", path.display()))
}

pub fn smollm2() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| load("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m"))
}

pub fn gemma3() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| load("gemma-3-270m-q4_k_m.gguf", "gemma3-270m"))
}

/// One case of a `tokenization.json` reference file.
pub struct Case {
    pub text: String,
    pub ids: Vec<u32>,
    pub ids_parse_special: Vec<u32>,
}

/// The reference cases (copied from `/work/shared/reference/<model>/tokenization.json`; computed
/// with llama.cpp's tokenizer and identical to HF transformers').
pub fn cases(model: &str) -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(format!("{model}.tokenization.json"));
    let json = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let doc: serde_json::Value = serde_json::from_str(&json).expect("reference JSON parses");
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .expect("id array")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    doc["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| Case {
            text: c["text"].as_str().expect("text").to_string(),
            ids: ids(&c["ids"]),
            ids_parse_special: ids(&c["ids_parse_special"]),
        })
        .collect()
}
