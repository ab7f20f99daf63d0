//! Inputs the fuzzers (fuzz/, tools/fuzz.sh) found crashing, kept as regression tests: each must
//! render or fail with a template error, never panic or overflow the stack.

use rill_tokenizer::{ChatMessage, ChatTemplate, TemplateLimits, TokenizerError};

/// What rendering says when it caught a panic of the template engine.
const ENGINE_FAILED: &str = "the template engine failed";

/// Renders `template` over the fuzz target's conversation within its limits.
fn render(template: &str, add_generation_prompt: bool) -> Result<String, TokenizerError> {
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello."),
    ];
    let limits = TemplateLimits {
        fuel: 200_000,
        max_output_bytes: 1 << 20,
        recursion_limit: 50,
    };
    ChatTemplate::new(template, "<s>", "</s>")
        .with_limits(limits)
        .render(&messages, add_generation_prompt)
}

#[test]
fn format_with_a_huge_field_index() {
    for template in [
        "{{ 'a{4444444444444444444444444444444444444444444444}b'.format(1) }}",
        "{{ 'a{4444444[44444444444444444444444444444444444444]}b'.format(1) }}",
        "{{ 'a{0[44444444444444444444444444444]}b'.format([1]) }}",
        "{{ '{99999999999}'.format(1) }}",
        "{{ '{:99999999999}'.format(1) }}",
        "{{ '{:>99999999999}'.format('x') }}",
        "{{ '{:.99999999999f}'.format(1.5) }}",
        "{{ '{:{}}'.format(1, 99999999999) }}",
        "{{ '{0:{1}}'.format(1, 99999999999) }}",
        "{{ 'x'.ljust(99999999999) }}",
        "{{ '%99999999999d' | format(1) }}",
        "{{ '%.99999999999f' | format(1.5) }}",
        "{{ '{{{z{{snk{}\u{fffd}'.format(1) }}",
        "{{ 'a{0[44}\u{ff5c}if'.format([1]) }}",
    ] {
        match render(template, true) {
            Ok(out) => assert!(out.len() <= 1 << 20, "{template}"),
            Err(e) => assert!(
                matches!(
                    e,
                    TokenizerError::Template(_) | TokenizerError::TemplateOutputTooLarge { .. }
                ) && !e.to_string().contains(ENGINE_FAILED),
                "{template}: {e}"
            ),
        }
    }
}

/// The chat-template fuzzer's crashes themselves (templates from real ones, mutated), every
/// file of `fuzz_crashes/chat_template-*`: the first byte is the fuzz target's mode (even: the
/// rest is the template).
#[test]
fn the_fuzzers_crashes_render_or_fail_cleanly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_crashes");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("chat_template-") {
            continue;
        }
        seen += 1;
        let data = std::fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&data[1..]);
        if let Err(e) = render(&text, data[0] & 2 == 2) {
            assert!(matches!(e, TokenizerError::Template(_)), "{name}: {e}");
            // Refused before the engine, not caught panicking inside it (a fuzzer aborts on
            // the panic whatever catches it).
            assert!(!e.to_string().contains(ENGINE_FAILED), "{name}: {e}");
        }
    }
    assert!(
        seen >= 2,
        "the crash files are missing from {}",
        dir.display()
    );
}
