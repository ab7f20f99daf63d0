//! Encoding arbitrary text and decoding arbitrary ids with real vocabularies (llama.cpp's
//! `ggml-vocab-*.gguf`, named by RILL_FUZZ_VOCAB): BPE with its pre-tokenizer regexes, SPM, or
//! WordPiece (`ggml-vocab-bert-bge.gguf`).
//! The first byte picks special-token parsing; the rest is the text, and as ids the bytes read
//! as little-endian u32s modulo the vocabulary.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rill_tokenizer::Tokenizer;

fn tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        let path = std::env::var("RILL_FUZZ_VOCAB").expect("set RILL_FUZZ_VOCAB to a vocab GGUF");
        let file = rill_gguf::GgufFile::open(&path).expect("cannot read the vocab");
        Tokenizer::from_gguf(file.metadata()).expect("cannot build the tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    let t = tokenizer();
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let ids = t.encode(&text, mode & 1 == 1);
    // What came from text decodes back to text (no special tokens parsed, nothing lost).
    if mode & 1 == 0 && !ids.is_empty() {
        let _ = t.decode(&ids);
    }
    let vocab = t.vocab_size() as u32;
    let ids: Vec<u32> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % vocab)
        .collect();
    let _ = t.decode_with(&ids, mode & 2 == 2);
    let mut stream = t.stream_decoder();
    for &id in &ids {
        let _ = stream.push(id);
    }
});
