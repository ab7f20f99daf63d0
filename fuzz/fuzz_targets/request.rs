//! Request bodies of /v1/chat/completions and /v1/completions through everything the server
//! parses and validates before the model (JSON, messages, sampling parameters, tools, structured
//! output fields, prompts as text or token ids).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let _ = rill_server::fuzzing::chat_body(body, 49_152);
    } else {
        let _ = rill_server::fuzzing::completions_body(body, 49_152);
    }
});
