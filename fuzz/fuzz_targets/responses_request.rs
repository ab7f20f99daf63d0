//! OpenAI Responses bodies through everything the server parses and validates before the model
//! (input items, instructions, tools and namespaces, tool choice, text.format, reasoning).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = rill_server::fuzzing::responses_body(data);
});
