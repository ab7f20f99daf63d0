//! Hostile chat templates (a GGUF's `tokenizer.chat_template` is the model author's code, run on
//! every request): CVE-2024-34359 reached Python's object graph from a template in
//! llama-cpp-python's Jinja2 sandbox-less rendering. Here every attempt to reach files, the
//! environment, the host or object internals renders nothing of them or fails with a template
//! error, and templates that loop or allocate without bound fail within their limits, without
//! taking the process's memory.

use rill_tokenizer::{ChatMessage, ChatTemplate, TokenizerError};

fn conversation() -> Vec<ChatMessage> {
    vec![ChatMessage::new("user", "Hi")]
}

fn render(template: &str) -> Result<String, TokenizerError> {
    ChatTemplate::new(template, "<s>", "</s>").render(&conversation(), true)
}

#[test]
fn object_internals_files_and_environment_are_out_of_reach() {
    let path_value = std::env::var("PATH").unwrap_or_default();
    let payloads = [
        // CVE-2024-34359's shape: from a string to Python's classes and `os`.
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ self.__init__.__globals__.__builtins__.__import__('os').popen('id').read() }}",
        "{{ cycler.__init__.__globals__.os.environ }}",
        "{{ joiner.__init__.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ lipsum.__globals__['os'].popen('id').read() }}",
        "{{ config.items() }}{{ request.environ }}{{ environ }}{{ env }}",
        "{{ messages[0].__dict__ }}{{ messages[0].content.__len__() }}",
        "{% include '/etc/passwd' %}",
        "{% import '/etc/hostname' as h %}{{ h }}",
        "{% extends '/proc/self/environ' %}",
        "{% from '/etc/passwd' import x %}{{ x }}",
        "{{ open('/etc/passwd').read() }}",
        "{{ raise_exception('boom') }}",
    ];
    for p in payloads {
        match render(p) {
            Ok(out) => {
                assert!(!out.contains("root:"), "{p} read a file: {out:.200}");
                assert!(!out.contains("uid="), "{p} ran a command: {out:.200}");
                assert!(
                    path_value.is_empty() || !out.contains(&path_value),
                    "{p} read the environment: {out:.200}"
                );
                assert!(
                    !out.contains("class '"),
                    "{p} reached object internals: {out:.200}"
                );
            }
            Err(e) => assert!(
                matches!(
                    e,
                    TokenizerError::Template(_) | TokenizerError::TemplateOutputTooLarge { .. }
                ),
                "{p}: {e}"
            ),
        }
    }
}

#[test]
fn unbounded_loops_recursion_and_allocation_fail_within_limits() {
    let payloads = [
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{{ 'a' * 4000000000 }}",
        "{% set x = 'a' * 100000000 %}{{ x * 100 }}",
        "{{ [0] * 4000000000 }}",
        "{{ ([0] * 4000000000) | list | length }}",
        "{{ ([0] * 4000000000) | join(',') }}",
        "{{ ([0] * 4000000000) | tojson }}",
        "{{ [[0] * 4000000000] }}",
        "{{ [[0] * 4000000000] | tojson }}",
        "{{ (['a' * 100000000] * 1000) | join }}",
        "{{ ('a' * 100000000) | list | length }}",
        "{{ ([0] * 4000000000) | sort | first }}",
        "{{ ([0] * 4000000000) | map('string') | list }}",
        "{{ ([0] * 4000000000) | unique | list }}",
        "{{ ([0] * 4000000000) | reverse | first }}",
        "{{ ([0] * 4000000000) | sum }}",
        "{% set x = range(100000000) | list %}{{ x | length }}",
        "{{ 'abc' | center(4000000000) }}",
        "{{ '%s' * 100000000 }}",
        "{% for i in range(30) %}{% set s = 'x' ~ s %}{% endfor %}",
        "{{ ('a' * 1000000) | replace('a', 'aaaaaaaaaa') | replace('a', 'aaaaaaaaaa') | replace('a', 'aaaaaaaaaa') }}",
        "{{ 'x' | indent(4000000000) }}",
        "{{ 'x\ny' | indent(4000000000) }}",
        "{{ 'x'.ljust(4000000000) }}",
        "{{ 'x'.rjust(4000000000) }}",
        "{{ 'x'.center(4000000000) }}",
        "{{ 'x'.zfill(4000000000) }}",
        "{{ ('a' * 1000000).replace('a', 'aaaaaaaaaa').replace('a', 'aaaaaaaaaa').replace('a', 'aaaaaaaaaa') }}",
        "{{ ('a' * 10000000).split('') | length }}",
        "{{ ('a,' * 10000000).split(',') | length }}",
        "{{ ('a\n' * 10000000).splitlines() | length }}",
        "{{ ('a b ' * 10000000).split() | length }}",
        "{{ ('a' * 100000000) | wordwrap(1) | length }}",
        "{{ ('a' * 100000000) | format }}",
        "{{ ' ' | join(range(100000000)) }}",
    ];
    for p in payloads {
        match render(p) {
            Ok(out) => assert!(out.len() <= 8 << 20, "{p} rendered {} bytes", out.len()),
            Err(e) => assert!(
                matches!(
                    e,
                    TokenizerError::Template(_) | TokenizerError::TemplateOutputTooLarge { .. }
                ),
                "{p}: {e}"
            ),
        }
    }
}
