//! Anthropic Messages bodies through everything the server parses and validates before the
//! model (system, content blocks, tools and tool choice, thinking, output_config, sampling).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = rill_server::fuzzing::messages_body(data);
});
