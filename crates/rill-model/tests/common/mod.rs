//! Helpers shared by the KV-cache test binaries: a tiny synthetic model, caches of small blocks
//! shaped for it, token sequences, and forward passes that return every row's logits.

use rill_gguf::GgufFile;
use rill_model::synthetic::{SyntheticSpec, VOCAB_SIZE};
use rill_model::{Batch, KvCache, KvDtype, Model, Precision};

/// Positions per block in these tests: small, so short sequences cross blocks.
pub const BS: usize = 4;

pub fn model() -> Model {
    let bytes = SyntheticSpec::llama_tiny().to_bytes().unwrap();
    Model::from_file(GgufFile::from_bytes(bytes).unwrap(), 2).unwrap()
}

/// A cache of `blocks` blocks of [`BS`] positions shaped for `model`.
pub fn cache(model: &Model, blocks: usize) -> KvCache {
    let c = model.config();
    KvCache::new(
        c.n_layers,
        c.n_kv_heads,
        c.head_dim,
        blocks * BS,
        BS,
        KvDtype::F32,
    )
    .unwrap()
}

pub fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7 + salt * 13 + (i * i) % 5) % VOCAB_SIZE as u32)
        .collect()
}

/// Appends `toks` to `seq` (which holds `start` positions) and returns every row's logits.
pub fn extend(
    model: &mut Model,
    kv: &mut KvCache,
    seq: u64,
    toks: &[u32],
    start: usize,
) -> Vec<f32> {
    let mut logits = Vec::new();
    model
        .forward(
            &Batch::prompt(seq, toks, start, true),
            kv,
            Precision::Exact,
            &mut logits,
        )
        .unwrap();
    logits
}

/// Logits of every position of `toks` computed alone in a fresh cache, from position `from` on.
pub fn fresh(model: &mut Model, toks: &[u32], from: usize) -> Vec<f32> {
    let mut kv = cache(model, toks.len().div_ceil(BS));
    kv.add_sequence(0).unwrap();
    extend(model, &mut kv, 0, toks, 0)[from * VOCAB_SIZE..].to_vec()
}

/// Asserts two logit vectors are the same bits.
pub fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let first = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits());
    assert!(first.is_none(), "{what}: logits differ at {first:?}");
}
