//! A GGUF file from arbitrary bytes: the reader, then what rill reads from a file it accepted
//! (the model's configuration, the tokenizer, every tensor's extent). Errors are fine; panics,
//! hangs and runaway allocations are not.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = rill_gguf::GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let _ = rill_model::ModelConfig::from_metadata(file.metadata(), None);
    let _ = rill_tokenizer::Tokenizer::from_gguf(file.metadata());
    for t in file.tensors() {
        let _ = (t.n_elements(), t.n_rows(), t.row_len());
        let _ = file.tensor_data(t).len();
    }
});
