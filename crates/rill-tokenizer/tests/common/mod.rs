//! Shared helpers for the integration tests: the two reference models, loaded once per test
//! binary.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use rill_tokenizer::Tokenizer;

/// Builds the tokenizer of a built-in model, fetching the model on first use.
fn load(builtin: &str) -> Tokenizer {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::resolve(builtin, &opts)
        .unwrap_or_else(|e| panic!("{e} (or run `cargo run --release -- pull {builtin}`)"));
    let gguf = rill_gguf::GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let start = std::time::Instant::now();
    let tokenizer = Tokenizer::from_gguf(gguf.metadata())
        .unwrap_or_else(|e| panic!("cannot build the tokenizer of {}: {e}", path.display()));
    eprintln!("built the {builtin} tokenizer in {:?}", start.elapsed());
    tokenizer
}

pub fn smollm2() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| load("smollm2-135m"))
}

pub fn gemma3() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| load("gemma3-270m"))
}

/// One case of a `tokenization.json` reference file.
pub struct Case {
    pub text: String,
    pub ids: Vec<u32>,
    pub ids_parse_special: Vec<u32>,
}

/// The reference cases of `tests/data/reference/<model>/tokenization.json` (computed with
/// llama.cpp's tokenizer and identical to HF transformers'; made by `tools/reference/`).
pub fn cases(model: &str) -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/reference")
        .join(model)
        .join("tokenization.json");
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
