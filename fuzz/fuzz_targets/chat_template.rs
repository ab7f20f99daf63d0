//! Chat templates: arbitrary template source rendered over a fixed conversation (a hostile
//! template must fail within its fuel and output limits, reach no file, environment or host
//! attribute), and real templates rendered over arbitrary message text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rill_tokenizer::{ChatMessage, ChatTemplate, TemplateLimits};

const LIMITS: TemplateLimits = TemplateLimits {
    fuel: 200_000,
    max_output_bytes: 1 << 20,
    recursion_limit: 50,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    if mode & 1 == 0 {
        let messages = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello."),
        ];
        let _ = ChatTemplate::new(&text, "<s>", "</s>")
            .with_limits(LIMITS)
            .render(&messages, mode & 2 == 2);
    } else {
        // Two messages from the text, split at its first NUL (or not at all).
        let (a, b) = text.split_once('\0').unwrap_or((&text, ""));
        let messages = [
            ChatMessage::new("user", a),
            ChatMessage::new(if mode & 4 == 4 { b } else { "assistant" }, b),
        ];
        let source = if mode & 2 == 2 { ChatTemplate::GEMMA3 } else { ChatTemplate::CHATML };
        let _ = ChatTemplate::new(source, "<s>", "</s>")
            .with_limits(LIMITS)
            .render(&messages, true);
    }
});
