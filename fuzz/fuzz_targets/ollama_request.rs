//! Ollama `/api/chat` and `/api/generate` bodies through everything the server parses and
//! validates before the model (messages, tools, format, think, options).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let _ = rill_server::fuzzing::ollama_chat_body(body);
    } else {
        let _ = rill_server::fuzzing::ollama_generate_body(body);
    }
});
