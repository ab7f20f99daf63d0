//! Chat templates: the model's Jinja template rendered with `minijinja` in a bounded sandbox.
//!
//! The reference is Hugging Face transformers' `apply_chat_template`: Jinja2 with `trim_blocks`
//! and `lstrip_blocks`, the `loopcontrols` extension, the globals `raise_exception(msg)`,
//! `strftime_now(format)`, `namespace(...)` and `dict(...)`, its own `tojson` filter (Python's
//! `json.dumps`, see [`json`]), the `{% generation %}` block tag (rendered as its body), and the
//! variables `messages`, `tools` and `documents` (`None` here), `add_generation_prompt` and the
//! special tokens. Python's string and dict methods come from `minijinja_contrib::pycompat`.
//! `tests/chat_templates.rs` checks real templates against it byte for byte.
//!
//! The environment has no loader (no file access; `include`/`import` can only name the template
//! itself), a fuel limit bounds the number of executed instructions so an endless or huge loop
//! fails instead of hanging, the recursion depth is limited, and the output is capped.

mod date;
mod json;
mod python;

use std::io;

use minijinja::value::Kwargs;
use minijinja::{context, Environment, Error, ErrorKind, State, Value};
use serde::Serialize;

pub use date::TemplateDate;

use crate::error::{Result, TokenizerError};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    pub content: String,
    /// An assistant's tool calls, as transformers passes them: `{"id", "type": "function",
    /// "function": {"name", "arguments"}}` with `arguments` a dict. Absent when empty (as
    /// transformers leaves out what a message does not have).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// A tool message's call id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant's thinking before its answer, as reasoning templates read it back
    /// (`message.reasoning_content`; Gemma 4's also reads it under this name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning_content: None,
        }
    }
}

/// Where a tokenizer's chat template came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatTemplateSource {
    /// `tokenizer.chat_template` in the model's metadata.
    Metadata,
    /// Built in: the metadata has none, but the vocabulary has `<start_of_turn>` /
    /// `<end_of_turn>`, so the published Gemma 3 template is used (the Gemma 3 270M GGUF ships
    /// without a template).
    BuiltinGemma,
    /// Built in: the metadata has none, but the vocabulary has `<|im_start|>` / `<|im_end|>`, so
    /// plain ChatML is used (llama.cpp's own fallback is ChatML as well).
    BuiltinChatMl,
}

/// The chat template of the Gemma 3 instruction-tuned models, as published with them.
const GEMMA3_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

/// Plain ChatML.
const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A built-in template for a vocabulary without `tokenizer.chat_template`, if its turn markers
/// identify the format unambiguously.
pub(crate) fn builtin_for_vocab(
    has: impl Fn(&str) -> bool,
) -> Option<(&'static str, ChatTemplateSource)> {
    if has("<start_of_turn>") && has("<end_of_turn>") {
        Some((GEMMA3_TEMPLATE, ChatTemplateSource::BuiltinGemma))
    } else if has("<|im_start|>") && has("<|im_end|>") {
        Some((CHATML_TEMPLATE, ChatTemplateSource::BuiltinChatMl))
    } else {
        None
    }
}

/// Bounds on one template rendering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLimits {
    /// minijinja fuel: roughly the number of template instructions executed.
    pub fuel: u64,
    /// Maximum rendered size in bytes.
    pub max_output_bytes: usize,
    /// Maximum nesting of loops, macro calls and includes.
    pub recursion_limit: usize,
}

impl Default for TemplateLimits {
    /// Generous for real conversations (a long tool-calling template over hundreds of messages
    /// uses well under a tenth of the fuel), small enough that a runaway template fails within a
    /// fraction of a second.
    fn default() -> TemplateLimits {
        TemplateLimits {
            fuel: 2_000_000,
            max_output_bytes: 8 << 20,
            recursion_limit: 100,
        }
    }
}

/// A chat template with the special-token texts it may refer to.
#[derive(Debug, Clone)]
pub struct ChatTemplate<'s> {
    source: &'s str,
    bos_token: &'s str,
    eos_token: &'s str,
    limits: TemplateLimits,
    /// What `strftime_now` formats; `None`: the current time (UTC) at each rendering.
    date: Option<TemplateDate>,
}

impl<'s> ChatTemplate<'s> {
    /// The built-in Gemma 3 template (see [`ChatTemplateSource::BuiltinGemma`]).
    pub const GEMMA3: &'static str = GEMMA3_TEMPLATE;
    /// The built-in ChatML template (see [`ChatTemplateSource::BuiltinChatMl`]).
    pub const CHATML: &'static str = CHATML_TEMPLATE;

    pub fn new(source: &'s str, bos_token: &'s str, eos_token: &'s str) -> ChatTemplate<'s> {
        ChatTemplate {
            source,
            bos_token,
            eos_token,
            limits: TemplateLimits::default(),
            date: None,
        }
    }

    /// Fixes the date and time `strftime_now(format)` formats (tests; by default it is the
    /// current time in UTC).
    pub fn with_date(mut self, date: TemplateDate) -> ChatTemplate<'s> {
        self.date = Some(date);
        self
    }

    /// Replaces the default limits.
    pub fn with_limits(mut self, limits: TemplateLimits) -> ChatTemplate<'s> {
        self.limits = limits;
        self
    }

    /// Renders the conversation. Variables: `messages` (list of `{role, content}`),
    /// `add_generation_prompt`, `bos_token`, `eos_token`, and `tools` / `documents` set to none;
    /// see the module documentation for the functions and filters.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with `tools` (OpenAI's list of `{"type": "function",
    /// "function": {...}}`, as transformers passes it) instead of none.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with_options(messages, tools, add_generation_prompt, None)
    }

    /// [`ChatTemplate::render_with_tools`] with extra template variables (transformers'
    /// `apply_chat_template(**kwargs)`, e.g. `enable_thinking`). They never replace the
    /// variables the template is always given (`messages`, `tools`, `add_generation_prompt`,
    /// ...); a variable the template does not read changes nothing.
    pub fn render_with_options(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String> {
        let env = self.environment();
        let source = rewrite_generation_tags(self.source);
        let template = env
            .template_from_named_str("chat_template", &source)
            .map_err(|e| TokenizerError::Template(describe(&e)))?;
        let ctx = context! {
            messages => messages,
            tools => match tools {
                Some(t) => Value::from_serialize(t),
                None => python::py_none(),
            },
            documents => python::py_none(),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        let ctx = match kwargs {
            Some(extra) if !extra.is_empty() => {
                let extra: std::collections::BTreeMap<String, Value> = extra
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::from_serialize(v)))
                    .collect();
                // The first context that has a name wins: the fixed variables first.
                context! { ..ctx, ..Value::from(extra) }
            }
            _ => ctx,
        };
        let mut out = CappedWriter {
            buf: Vec::new(),
            limit: self.limits.max_output_bytes,
            exceeded: false,
        };
        // A panic inside the template engine (a bug there, reached by a hostile template) is
        // this rendering's error, not the caller's crash.
        let rendered = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            template.render_captured_to(ctx, &mut out).map(drop)
        })) {
            Ok(r) => r,
            Err(_) => {
                return Err(TokenizerError::Template(
                    "the template engine failed on this template".into(),
                ))
            }
        };
        match rendered {
            Ok(()) => String::from_utf8(out.buf)
                .map_err(|_| TokenizerError::Template("rendered output is not UTF-8".into())),
            Err(_) if out.exceeded => Err(TokenizerError::TemplateOutputTooLarge {
                limit: self.limits.max_output_bytes,
            }),
            Err(e) => Err(TokenizerError::Template(describe(&e))),
        }
    }

    /// The Jinja environment transformers sets up, within this template's limits.
    fn environment<'a>(&self) -> Environment<'a> {
        let mut env = Environment::new();
        env.set_fuel(Some(self.limits.fuel));
        env.set_recursion_limit(self.limits.recursion_limit);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(python::string_method);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        let date = self.date;
        env.add_function(
            "strftime_now",
            move |format: String| -> std::result::Result<String, Error> {
                date.unwrap_or_else(TemplateDate::now_utc)
                    .strftime(&format)
                    .map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
            },
        );
        env.add_filter("tojson", json::tojson);
        python::install(&mut env);
        env.add_function(GENERATION_FN, generation_block);
        env
    }
}

/// The function a `{% generation %}` block is rewritten to call (see [`rewrite_generation_tags`]).
const GENERATION_FN: &str = "__rill_generation_block";

/// `{% call __rill_generation_block() %}`: renders the block's body, as transformers'
/// `AssistantTracker` extension does outside of `return_assistant_tokens_mask`.
fn generation_block(state: &State, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let caller: Value = kwargs.get("caller")?;
    kwargs.assert_all_used()?;
    caller.call(state, &[])
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` tags (an extension tag
/// minijinja does not know) into a call block with the same whitespace control: like the
/// extension's `CallBlock`, the body renders in a scope of its own.
fn rewrite_generation_tags(source: &str) -> std::borrow::Cow<'_, str> {
    if !source.contains("generation") {
        return std::borrow::Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len() + 64);
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        match parse_generation_tag(tag) {
            Some((len, open_ws, end, close_ws)) => {
                out.push_str("{%");
                out.push_str(open_ws);
                if end {
                    out.push_str(" endcall ");
                } else {
                    out.push_str(" call ");
                    out.push_str(GENERATION_FN);
                    out.push_str("() ");
                }
                // Keep the line count, so error messages name the template's own lines.
                let newlines = tag[..len].matches('\n').count();
                out.extend(std::iter::repeat_n('\n', newlines));
                out.push_str(close_ws);
                out.push_str("%}");
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// `{%[-+]? generation|endgeneration [-+]?%}` at the start of `s`: its length, the whitespace
/// modifiers and whether it is the end tag.
fn parse_generation_tag(s: &str) -> Option<(usize, &str, bool, &str)> {
    let body = s.strip_prefix("{%")?;
    let open_ws = if body.starts_with(['-', '+']) {
        &body[..1]
    } else {
        ""
    };
    let inner = body[open_ws.len()..].trim_start_matches([' ', '\t', '\n', '\r']);
    let (end, after) = if let Some(a) = inner.strip_prefix("endgeneration") {
        (true, a)
    } else {
        (false, inner.strip_prefix("generation")?)
    };
    let after_ws = after.trim_start_matches([' ', '\t', '\n', '\r']);
    if after_ws.len() == after.len() && !after.starts_with(['-', '+', '%']) {
        return None; // `generations`, `generation_x`, ...
    }
    let close_ws = if after_ws.starts_with(['-', '+']) {
        &after_ws[..1]
    } else {
        ""
    };
    let tail = after_ws[close_ws.len()..].strip_prefix("%}")?;
    Some((s.len() - tail.len(), open_ws, end, close_ws))
}

/// The error with its chain of causes (minijinja puts template-raised messages in the detail).
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// An output buffer that refuses to grow past `limit` (the write error aborts rendering).
struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("chat template output limit exceeded"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello!"),
            ChatMessage::new("user", "How are you?"),
        ]
    }

    #[test]
    fn gemma_builtin_renders() {
        let out = ChatTemplate::new(GEMMA3_TEMPLATE, "<bos>", "<eos>")
            .render(&conversation(), true)
            .unwrap();
        assert_eq!(
            out,
            "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn gemma_system_prompt_and_alternation_error() {
        let msgs = vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "  Hi  "),
        ];
        let out = ChatTemplate::new(GEMMA3_TEMPLATE, "<bos>", "<eos>")
            .render(&msgs, false)
            .unwrap();
        assert_eq!(
            out,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        );
        let bad = vec![ChatMessage::new("assistant", "x")];
        let err = ChatTemplate::new(GEMMA3_TEMPLATE, "<bos>", "<eos>")
            .render(&bad, false)
            .unwrap_err();
        assert!(err.to_string().contains("must alternate"), "{err}");
    }

    #[test]
    fn chatml_builtin_renders() {
        let out = ChatTemplate::new(CHATML_TEMPLATE, "", "")
            .render(&[ChatMessage::new("user", "Hi")], true)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_work() {
        let t = "{{ messages[0].content.strip().upper() }}{% if messages[0].role.startswith('us') %}!{% endif %}";
        let out = ChatTemplate::new(t, "", "")
            .render(&[ChatMessage::new("user", "  hi ")], false)
            .unwrap();
        assert_eq!(out, "HI!");
    }

    #[test]
    fn runaway_loop_runs_out_of_fuel() {
        // 10^10 iterations: only the fuel limit ends it (the error says so).
        let t = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let err = ChatTemplate::new(t, "", "").render(&[], false).unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)), "{err}");
        assert!(err.to_string().contains("fuel"), "{err}");
    }

    #[test]
    fn huge_output_is_capped() {
        let t = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}";
        let err = ChatTemplate::new(t, "", "")
            .with_limits(TemplateLimits {
                max_output_bytes: 1 << 20,
                ..TemplateLimits::default()
            })
            .render(&[], false)
            .unwrap_err();
        assert!(
            matches!(err, TokenizerError::TemplateOutputTooLarge { .. }),
            "{err}"
        );
    }

    #[test]
    fn no_file_access_and_bounded_recursion() {
        let err = ChatTemplate::new("{% include '/etc/passwd' %}", "", "")
            .render(&[], false)
            .unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)));
        let err = ChatTemplate::new("{% include 'chat_template' %}", "", "")
            .render(&[], false)
            .unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)));
        let err = ChatTemplate::new(
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
            "",
            "",
        )
        .render(&[], false)
        .unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)));
    }

    #[test]
    fn generation_tags_become_call_blocks() {
        let t = "{%- generation -%}a{% set x = 1 %}{%+ endgeneration %}{{ x is defined }}\
                 {{ 'generation' }}{% if generations is defined %}{% endif %}";
        let rewritten = rewrite_generation_tags(t);
        assert_eq!(
            rewritten,
            "{%- call __rill_generation_block() -%}a{% set x = 1 %}{%+ endcall %}\
             {{ x is defined }}{{ 'generation' }}{% if generations is defined %}{% endif %}"
        );
        // The body renders in a scope of its own, as transformers' CallBlock does.
        let out = ChatTemplate::new(t, "", "").render(&[], false).unwrap();
        assert_eq!(out, "aFalsegeneration");
        // Lines stay where they were.
        let t = "{%\ngeneration\n%}\n{% endgeneration %}{{ nope.x }}";
        assert_eq!(
            rewrite_generation_tags(t).lines().count(),
            t.lines().count()
        );
        let err = ChatTemplate::new(t, "", "").render(&[], false).unwrap_err();
        assert!(err.to_string().contains("chat_template:4"), "{err}");
    }

    #[test]
    fn strftime_now_uses_the_fixed_date_or_the_clock() {
        let t = "{{ strftime_now('%d %b %Y') }}";
        let date = TemplateDate::from_ymd(2026, 1, 15).unwrap();
        let out = ChatTemplate::new(t, "", "")
            .with_date(date)
            .render(&[], false)
            .unwrap();
        assert_eq!(out, "15 Jan 2026");
        let now = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "")
            .render(&[], false)
            .unwrap();
        assert!(now.parse::<u32>().is_ok_and(|y| y >= 2024), "{now}");
        let err = ChatTemplate::new("{{ strftime_now('%Q') }}", "", "")
            .render(&[], false)
            .unwrap_err();
        assert!(err.to_string().contains("%Q"), "{err}");
    }

    #[test]
    fn tojson_is_python_json_dumps() {
        let t = "{{ {'b': 'é<&>', 'a': [1.0, none, true]} | tojson }}|\
                 {{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=(',', ':')) }}|\
                 {{ ['é'] | tojson(ensure_ascii=true) }}|{{ [1] | tojson(indent=2) }}";
        let out = ChatTemplate::new(t, "", "").render(&[], false).unwrap();
        assert_eq!(
            out,
            "{\"b\": \"é<&>\", \"a\": [1.0, null, true]}|{\"a\":2,\"b\":1}|[\"\\u00e9\"]|[\n  1\n]"
        );
    }

    #[test]
    fn tools_is_a_python_none() {
        let t = "{{ tools is none }}{{ tools is iterable }}{{ tools }}{{ tools | tojson }}\
                 {% if not documents %}!{% endif %}{{ tools | selectattr('type') | list | length }}";
        let out = ChatTemplate::new(t, "", "").render(&[], false).unwrap();
        assert_eq!(out, "TrueFalseNonenull!0");
        let err = ChatTemplate::new("{% for t in tools %}{% endfor %}", "", "")
            .render(&[], false)
            .unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)), "{err}");
    }

    #[test]
    fn syntax_errors_are_errors() {
        let err = ChatTemplate::new("{% for %}", "", "")
            .render(&[], false)
            .unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)));
    }
}
