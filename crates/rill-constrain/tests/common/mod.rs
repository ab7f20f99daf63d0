//! The two real models' tokenizers and constrainers, built once per test binary, and walking
//! a text through a constraint token by token.

#![allow(dead_code)]

pub mod replay;

use std::sync::{Arc, OnceLock};

use rill_constrain::{Constrainer, ConstraintSpec, TokenConstraint};
use rill_tokenizer::Tokenizer;

fn load(builtin: &str) -> Arc<Tokenizer> {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::resolve(builtin, &opts)
        .unwrap_or_else(|e| panic!("{e} (or run `cargo run --release -- pull {builtin}`)"));
    let gguf = rill_gguf::GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    Arc::new(Tokenizer::from_gguf(gguf.metadata()).expect("tokenizer"))
}

pub fn smollm2() -> &'static (Arc<Tokenizer>, Arc<Constrainer>) {
    static M: OnceLock<(Arc<Tokenizer>, Arc<Constrainer>)> = OnceLock::new();
    M.get_or_init(|| {
        let t = load("smollm2-135m");
        let c = Arc::new(Constrainer::new(t.clone()).expect("constrainer"));
        (t, c)
    })
}

pub fn gemma3() -> &'static (Arc<Tokenizer>, Arc<Constrainer>) {
    static M: OnceLock<(Arc<Tokenizer>, Arc<Constrainer>)> = OnceLock::new();
    M.get_or_init(|| {
        let t = load("gemma3-270m");
        let c = Arc::new(Constrainer::new(t.clone()).expect("constrainer"));
        (t, c)
    })
}

/// A JSON Schema constraint.
pub fn schema(v: serde_json::Value) -> ConstraintSpec {
    ConstraintSpec::JsonSchema(v)
}

/// A fresh constraint for `spec` on SmolLM2.
pub fn start(spec: ConstraintSpec) -> TokenConstraint {
    let (_, c) = smollm2();
    c.compile(&spec)
        .unwrap_or_else(|e| panic!("{spec:?}: {e}"))
        .start()
}

/// How far `text` (tokenized by `tokenizer`) gets through `c`: `Ok(accepting)` when every
/// token was allowed, else `Err(index of the first refused token)`.
pub fn walk(c: &mut TokenConstraint, tokenizer: &Tokenizer, text: &str) -> Result<bool, usize> {
    for (i, t) in tokenizer.encode(text, false).into_iter().enumerate() {
        if c.commit(t).is_err() {
            return Err(i);
        }
    }
    Ok(c.is_accepting())
}

/// Whether `text` is a complete match of `spec` on SmolLM2.
pub fn matches(spec: &ConstraintSpec, text: &str) -> bool {
    let (t, _) = smollm2();
    let mut c = start(spec.clone());
    walk(&mut c, t, text) == Ok(true)
}
