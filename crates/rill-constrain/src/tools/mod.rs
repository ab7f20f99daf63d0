//! Tool calling: how a model writes calls (its template's own format, or a generic one), the
//! constraint that makes every call parse and match its tool's parameters, and reading calls
//! back out of the text, whole or as it streams.
//!
//! Two formats:
//! - **Hermes** (Qwen 2.5/3, Hermes, and other templates that render `<tool_call>`): each call
//!   is `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`; the template gets the
//!   tools and renders them itself.
//! - **Llama 3 JSON** (Llama 3.1, 3.2, 3.3): the answer is one call, `{"name": ...,
//!   "parameters": {...}}` (the template renders the tools and allows one call per message).
//! - **Generic**, for templates without tools (SmolLM2's, Gemma 3's): the tools are described
//!   in the system prompt and the whole answer is JSON, `{"tool_calls": [{"name": ...,
//!   "arguments": {...}}]}` or `{"response": "..."}`.
//!
//! A call's JSON is always `{"name": "<tool>", "arguments": <object>}`, with `name` first and
//! rill's layout (one space after `,` and `:`), because the constraint writes it so: the
//! streaming reader relies on it.

use serde_json::{json, Map, Value};

mod generic;

pub use generic::{generic_messages, generic_system_prompt};

use crate::native_calls::{NativeSyntax, ParamTypes};
use crate::ConstraintSpec;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema of the arguments object.
    pub parameters: Value,
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No calls: the tools are not shown to the model.
    None,
    /// The model decides; a call, once started, is constrained.
    Auto,
    /// At least one call, constrained from the first token.
    Required,
    /// A call of this function, constrained from the first token.
    Named(String),
}

/// How the model writes calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3Json,
    /// A family's own syntax, read from unconstrained text ([`crate::native_calls`]).
    Native(NativeSyntax),
    /// gpt-oss's harmony: calls are `commentary` messages addressed `to=functions.NAME`, read
    /// with the answer's channels (the server's reasoning reader), not from its text.
    Harmony,
    Generic,
}

const HERMES_OPEN: &str = "<tool_call>";
/// How a Llama 3 call begins (after an optional `<|python_tag|>`).
const LLAMA3_OPEN: &str = "{\"name\": \"";
const PYTHON_TAG: &str = "<|python_tag|>";
const HERMES_CLOSE: &str = "</tool_call>";

impl ToolFormat {
    /// The format of a chat template (`None`: the model has none): Hermes when it renders
    /// tools and writes calls as `<tool_call>` blocks of `{"name", "arguments"}` JSON (not the
    /// XML-like bodies that GLM, Qwen3-Coder and others put between the same tags).
    pub fn detect(template: Option<&str>) -> ToolFormat {
        let Some(t) = template else {
            return ToolFormat::Generic;
        };
        if t.contains("<|channel|>") && t.contains("<|call|>") {
            return ToolFormat::Harmony;
        }
        if let Some(native) = NativeSyntax::detect(t) {
            if t.contains("tools") {
                return ToolFormat::Native(native);
            }
        }
        let hermes = t.contains("tools")
            && t.contains(HERMES_OPEN)
            && t.contains(HERMES_CLOSE)
            && t.contains("\"name\"")
            && t.contains("arguments")
            && !["<function=", "arg_key", "<parameter", "<tool_calls>"]
                .iter()
                .any(|x| t.contains(x));
        // Llama 3.x: "Respond in the format {"name": function name, "parameters": ...}", and
        // calls rendered as `{"name": "` + name + `", "parameters": ` + arguments.
        let llama3 = t.contains("tools")
            && t.contains("{\"name\": function name, \"parameters\"")
            && t.contains("\"parameters\": ");
        if hermes {
            ToolFormat::Hermes
        } else if llama3 {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Generic
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3Json => "llama3_json",
            ToolFormat::Native(NativeSyntax::QwenXml) => "qwen_xml",
            ToolFormat::Native(NativeSyntax::Mistral) => "mistral",
            ToolFormat::Native(NativeSyntax::DeepSeek) => "deepseek",
            ToolFormat::Native(NativeSyntax::Gemma4) => "gemma4",
            ToolFormat::Harmony => "harmony",
            ToolFormat::Generic => "generic",
        }
    }

    /// Whether the chat template is given the tools (and tool calls and results in their own
    /// form); else the conversation is rewritten ([`generic_messages`]).
    pub fn template_renders_tools(self) -> bool {
        self != ToolFormat::Generic
    }

    /// Whether calls in this format can be enforced by the constraint stage (`required`, a
    /// named tool); the formats read from free text cannot, and such requests go through the
    /// generic format instead.
    pub fn enforces_calls(self) -> bool {
        !matches!(self, ToolFormat::Native(_) | ToolFormat::Harmony)
    }

    /// The key of a call's arguments.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3Json => "parameters",
            _ => "arguments",
        }
    }
}

/// What a request with tools generates under.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    pub format: ToolFormat,
    /// The constraint (none for `tool_choice: none`).
    pub constraint: Option<ConstraintSpec>,
    /// The constraint starts only once the model writes this token (Hermes with `auto`: the
    /// model may answer in prose; once it opens a call, the call is constrained).
    pub trigger: Option<String>,
}

/// The JSON Schema of one call object of `tools`, its arguments under `key`.
fn call_schema(tools: &[&Tool], key: &str) -> Value {
    let one = |t: &Tool| {
        let mut properties = Map::new();
        properties.insert("name".into(), json!({"const": t.name}));
        properties.insert(key.into(), arguments_schema(&t.parameters));
        json!({
            "type": "object",
            "properties": properties,
            "required": ["name", key],
            "additionalProperties": false,
        })
    };
    match tools {
        [t] => one(t),
        _ => json!({"anyOf": tools.iter().map(|t| one(t)).collect::<Vec<_>>()}),
    }
}

/// A tool's parameters as the schema of its arguments: an object, whatever was given.
fn arguments_schema(parameters: &Value) -> Value {
    match parameters {
        Value::Object(m) if !m.is_empty() => parameters.clone(),
        _ => json!({"type": "object"}),
    }
}

fn layout(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema {
        m.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// The plan for `tools` under `choice` in `format`. `open_is_token`: the vocabulary has
/// `<tool_call>` as one control token (it is then named `<tool_call>` in the grammar, which
/// Lark reads as that token).
pub fn plan(
    format: ToolFormat,
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    open_is_token: bool,
) -> ToolPlan {
    let chosen: Vec<&Tool> = match choice {
        ToolChoice::Named(name) => tools.iter().filter(|t| &t.name == name).collect(),
        _ => tools.iter().collect(),
    };
    let response = json!({
        "type": "object",
        "properties": {"response": {"type": "string"}},
        "required": ["response"],
        "additionalProperties": false,
    });
    if *choice == ToolChoice::None || chosen.is_empty() {
        // The generic format answers in JSON throughout (the history shows it so): a reply.
        return ToolPlan {
            format,
            constraint: (format == ToolFormat::Generic)
                .then(|| ConstraintSpec::JsonSchema(layout(response))),
            trigger: None,
        };
    }
    if !format.enforces_calls() {
        // Read from the model's own syntax, unconstrained.
        return ToolPlan {
            format,
            constraint: None,
            trigger: None,
        };
    }
    let call = layout(call_schema(&chosen, format.arguments_key()));
    match format {
        ToolFormat::Native(_) | ToolFormat::Harmony => unreachable!("returned above"),
        ToolFormat::Llama3Json => {
            if *choice == ToolChoice::Auto {
                // Lazy: once the answer opens `{"name": "`, the rest of one call of a tool.
                let alternatives: Vec<String> = chosen
                    .iter()
                    .map(|t| {
                        let head = format!("{}\", \"parameters\": ", t.name);
                        format!(
                            "{} %json {} \"}}\"",
                            serde_json::to_string(&head).unwrap_or_default(),
                            layout(arguments_schema(&t.parameters))
                        )
                    })
                    .collect();
                ToolPlan {
                    format,
                    constraint: Some(ConstraintSpec::Lark(format!(
                        "start: {}\n",
                        alternatives.join(" | ")
                    ))),
                    trigger: Some(LLAMA3_OPEN.to_string()),
                }
            } else {
                ToolPlan {
                    format,
                    constraint: Some(ConstraintSpec::JsonSchema(call)),
                    trigger: None,
                }
            }
        }
        ToolFormat::Hermes => {
            let open = if open_is_token {
                HERMES_OPEN.to_string()
            } else {
                serde_json::to_string(HERMES_OPEN).unwrap_or_default()
            };
            let close = serde_json::to_string(HERMES_CLOSE).unwrap_or_default();
            let body = format!("\"\\n\" %json {call} \"\\n\" {close}");
            let more = if parallel {
                format!("(\"\\n\" {open} {body})*")
            } else {
                String::new()
            };
            let lazy = *choice == ToolChoice::Auto;
            let start = if lazy {
                format!("start: {body} {more}\n")
            } else {
                format!("start: {open} {body} {more}\n")
            };
            ToolPlan {
                format,
                constraint: Some(ConstraintSpec::Lark(start)),
                trigger: lazy.then(|| HERMES_OPEN.to_string()),
            }
        }
        ToolFormat::Generic => {
            let mut calls = json!({"type": "array", "items": call, "minItems": 1});
            if !parallel {
                calls["maxItems"] = json!(1);
            }
            let calls = json!({
                "type": "object",
                "properties": {"tool_calls": calls},
                "required": ["tool_calls"],
                "additionalProperties": false,
            });
            let schema = if *choice == ToolChoice::Auto {
                json!({"anyOf": [calls, response]})
            } else {
                calls
            };
            ToolPlan {
                format,
                constraint: Some(ConstraintSpec::JsonSchema(layout(schema))),
                trigger: None,
            }
        }
    }
}

/// One call read from the text: the name and the arguments' JSON text as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// An answer read from the text: content (what is not a call) and calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedAnswer {
    pub content: String,
    pub calls: Vec<ParsedCall>,
}

/// Streamed pieces of an answer, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolDelta {
    Content(String),
    /// Call `index` begins: its name is complete.
    CallStart {
        index: usize,
        name: String,
    },
    /// More of call `index`'s arguments text.
    Arguments {
        index: usize,
        fragment: String,
    },
}

/// Reads calls out of an answer's text as it grows ([`ToolReader::update`] with the whole text
/// so far), or once it is complete ([`ToolReader::finish`]).
#[derive(Debug, Clone)]
pub struct ToolReader {
    format: ToolFormat,
    /// The tools' parameter types, which Qwen's bare XML values are read as.
    types: ParamTypes,
    content_sent: usize,
    /// Per call: its name was sent, and how many bytes of arguments.
    calls_sent: Vec<usize>,
}

/// A call object read so far: name (once complete), arguments text so far, whether complete,
/// and the bytes it spans.
struct PartialCall<'a> {
    name: Option<String>,
    arguments: std::borrow::Cow<'a, str>,
    complete: bool,
    len: usize,
}

/// Reads `{"name": "<name>", "<key>": <object>}` from the start of `s`.
fn partial_call<'a>(s: &'a str, key: &str) -> Option<PartialCall<'a>> {
    const NAME: &str = "{\"name\": ";
    let args_prefix = format!(", \"{key}\": ");
    let args_marker = args_prefix.as_str();
    if !s.starts_with(NAME) {
        return None;
    }
    let rest = &s[NAME.len()..];
    let Some(name_len) = json_string_len(rest) else {
        return Some(PartialCall {
            name: None,
            arguments: "".into(),
            complete: false,
            len: s.len(),
        });
    };
    let name: Option<String> = serde_json::from_str(&rest[..name_len]).ok();
    let after = &rest[name_len..];
    let Some(args) = after.strip_prefix(args_marker) else {
        return Some(PartialCall {
            name,
            arguments: "".into(),
            complete: false,
            len: s.len(),
        });
    };
    let start = s.len() - args.len();
    match json_value_len(args) {
        Some(n) => {
            let complete = args[n..].starts_with('}');
            Some(PartialCall {
                name,
                arguments: args[..n].into(),
                complete,
                len: start + n + usize::from(complete),
            })
        }
        None => Some(PartialCall {
            name,
            arguments: args.into(),
            complete: false,
            len: s.len(),
        }),
    }
}

/// The length of the JSON string at the start of `s` (quotes included), once it is closed.
fn json_string_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    if b.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The length of the JSON object or array at the start of `s`, once it is closed.
fn json_value_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => i += json_string_len(&s[i..])?,
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                i += 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// The longest prefix of `s` that cannot be the start of `marker` cut at its end: text safe to
/// stream before the marker could begin.
fn safe_prefix(s: &str, marker: &str) -> usize {
    for k in (1..marker.len().min(s.len() + 1)).rev() {
        if s.is_char_boundary(s.len() - k) && marker.starts_with(&s[s.len() - k..]) {
            return s.len() - k;
        }
    }
    s.len()
}

/// The decoded text of the `{"response": "...` string so far (an escape cut at the end is
/// held back).
fn partial_json_string(s: &str) -> String {
    let mut end = s.len();
    // Cut back to a point where the string can be closed: not inside an escape.
    loop {
        let candidate = format!("\"{}\"", &s[..end]);
        if let Ok(v) = serde_json::from_str::<String>(&candidate) {
            return v;
        }
        if end == 0 {
            return String::new();
        }
        end -= 1;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
    }
}

impl ToolReader {
    pub fn new(format: ToolFormat) -> ToolReader {
        ToolReader::with_types(format, ParamTypes::default())
    }

    /// A reader that types the values of calls written as bare text (Qwen's XML) by `types`.
    pub fn with_types(format: ToolFormat, types: ParamTypes) -> ToolReader {
        ToolReader {
            format,
            types,
            content_sent: 0,
            calls_sent: Vec::new(),
        }
    }

    /// The answer as read from the whole `text`: content and calls.
    pub fn parse(format: ToolFormat, text: &str) -> ParsedAnswer {
        ToolReader::parse_typed(format, text, &ParamTypes::default())
    }

    /// The whole `text` as this reader's format and types read it (see [`ToolReader::parse`]).
    pub fn read_whole(&self, text: &str) -> ParsedAnswer {
        ToolReader::parse_typed(self.format, text, &self.types)
    }

    /// [`ToolReader::parse`], bare values typed by `types`.
    pub fn parse_typed(format: ToolFormat, text: &str, types: &ParamTypes) -> ParsedAnswer {
        let (content, calls) = read(format, text, types);
        ParsedAnswer {
            content: content.trim_end().to_string(),
            calls: calls
                .into_iter()
                .filter(|c| c.complete)
                .filter_map(|c| {
                    Some(ParsedCall {
                        name: c.name?,
                        arguments: c.arguments.to_string(),
                    })
                })
                .collect(),
        }
    }

    /// What `text` (the whole answer so far) adds to what was already returned.
    pub fn update(&mut self, text: &str) -> Vec<ToolDelta> {
        let (content, calls) = read(self.format, text, &self.types);
        let mut out = Vec::new();
        // Content: what is safe (never part of a call's opening).
        // Hermes prose is held back where a call could be opening, and trailing whitespace
        // until more text follows it (the parsed content ends without it).
        let safe_content = match self.format {
            ToolFormat::Hermes => content[..safe_prefix(&content, HERMES_OPEN)].trim_end(),
            ToolFormat::Native(native) => {
                let mut end = safe_prefix(&content, native.open_marker());
                if native == NativeSyntax::DeepSeek {
                    end = end.min(safe_prefix(&content, "<｜tool▁calls▁begin｜>"));
                }
                content[..end].trim_end()
            }
            ToolFormat::Generic | ToolFormat::Llama3Json | ToolFormat::Harmony => &content[..],
        };
        if safe_content.len() > self.content_sent
            && safe_content.is_char_boundary(self.content_sent)
        {
            out.push(ToolDelta::Content(
                safe_content[self.content_sent..].to_string(),
            ));
            self.content_sent = safe_content.len();
        }
        for (index, c) in calls.iter().enumerate() {
            let Some(name) = &c.name else { break };
            if index == self.calls_sent.len() {
                self.calls_sent.push(0);
                out.push(ToolDelta::CallStart {
                    index,
                    name: name.clone(),
                });
            }
            let sent = self.calls_sent[index];
            if c.arguments.len() > sent && c.arguments.is_char_boundary(sent) {
                out.push(ToolDelta::Arguments {
                    index,
                    fragment: c.arguments[sent..].to_string(),
                });
                self.calls_sent[index] = c.arguments.len();
            }
        }
        out
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.calls_sent.len()
    }
}

/// Content and (partial) calls of `text`.
fn read<'a>(
    format: ToolFormat,
    text: &'a str,
    types: &ParamTypes,
) -> (String, Vec<PartialCall<'a>>) {
    let mut calls = Vec::new();
    match format {
        ToolFormat::Harmony => (text.to_string(), calls),
        ToolFormat::Native(native) => {
            let read = native.read_typed(text, types);
            for (name, arguments) in read.calls {
                calls.push(PartialCall {
                    name: Some(name),
                    len: 0,
                    arguments: arguments.into(),
                    complete: true,
                });
            }
            if read.open {
                calls.push(PartialCall {
                    name: None,
                    arguments: "".into(),
                    complete: false,
                    len: 0,
                });
            }
            (read.content, calls)
        }
        ToolFormat::Hermes => {
            let Some(first) = text.find(HERMES_OPEN) else {
                return (text.to_string(), calls);
            };
            let mut rest = &text[first..];
            while let Some(after) = rest.strip_prefix(HERMES_OPEN) {
                let body = after.trim_start_matches('\n');
                match partial_call(body, "arguments") {
                    Some(c) => {
                        let len = c.len;
                        let complete = c.complete;
                        calls.push(c);
                        if !complete {
                            break;
                        }
                        let tail = body[len..].trim_start_matches('\n');
                        let tail = tail.strip_prefix(HERMES_CLOSE).unwrap_or(tail);
                        rest = tail.trim_start_matches('\n');
                    }
                    None => break,
                }
            }
            (text[..first].to_string(), calls)
        }
        ToolFormat::Llama3Json => {
            let body = text.strip_prefix(PYTHON_TAG).unwrap_or(text);
            if body.starts_with(LLAMA3_OPEN) {
                calls.extend(partial_call(body, "parameters"));
                (String::new(), calls)
            } else if LLAMA3_OPEN.starts_with(body) || PYTHON_TAG.starts_with(text) {
                // Not yet decided: what is there could open a call.
                (String::new(), calls)
            } else {
                (text.to_string(), calls)
            }
        }
        ToolFormat::Generic => {
            const CALLS: &str = "{\"tool_calls\": [";
            const RESPONSE: &str = "{\"response\": \"";
            if let Some(mut rest) = text.strip_prefix(CALLS) {
                while let Some(c) = partial_call(rest, "arguments") {
                    let (len, complete) = (c.len, c.complete);
                    calls.push(c);
                    if !complete {
                        break;
                    }
                    rest = rest[len..].strip_prefix(", ").unwrap_or("");
                }
                (String::new(), calls)
            } else if let Some(s) = text.strip_prefix(RESPONSE) {
                let body = match json_string_len(&format!("\"{s}")) {
                    Some(n) => &s[..n - 2],
                    None => s,
                };
                (partial_json_string(body), calls)
            } else if CALLS.starts_with(text) || RESPONSE.starts_with(text) {
                (String::new(), calls)
            } else {
                // Not the generic format (an unconstrained answer): all content.
                (text.to_string(), calls)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_calls_stream_and_parse_alike() {
        let text = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}, {"name": "time", "arguments": {}}]}"#;
        let mut r = ToolReader::new(ToolFormat::Generic);
        let mut deltas = Vec::new();
        for end in 1..=text.len() {
            deltas.extend(r.update(&text[..end]));
        }
        let mut names = Vec::new();
        let mut args = vec![String::new(); 2];
        for d in deltas {
            match d {
                ToolDelta::CallStart { index, name } => {
                    assert_eq!(index, names.len());
                    names.push(name);
                }
                ToolDelta::Arguments { index, fragment } => args[index].push_str(&fragment),
                ToolDelta::Content(c) => panic!("content {c:?}"),
            }
        }
        assert_eq!(names, ["get_weather", "time"]);
        assert_eq!(args, [r#"{"city": "Paris", "days": [1, 2]}"#, "{}"]);
        let parsed = ToolReader::parse(ToolFormat::Generic, text);
        assert_eq!(parsed.calls.len(), 2);
        assert_eq!(parsed.calls[0].arguments, args[0]);
        assert_eq!(parsed.content, "");
    }

    #[test]
    fn generic_response_streams_its_decoded_string() {
        let text = r#"{"response": "Hi \"you\"\nbye é"}"#;
        let mut r = ToolReader::new(ToolFormat::Generic);
        let mut content = String::new();
        for end in (1..=text.len()).filter(|&e| text.is_char_boundary(e)) {
            for d in r.update(&text[..end]) {
                match d {
                    ToolDelta::Content(c) => content.push_str(&c),
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(content, "Hi \"you\"\nbye é");
        assert_eq!(
            ToolReader::parse(ToolFormat::Generic, text).content,
            content
        );
    }

    #[test]
    fn llama3_calls_and_prose() {
        let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        let mut r = ToolReader::new(ToolFormat::Llama3Json);
        let mut args = String::new();
        let mut names = Vec::new();
        for end in 1..=text.len() {
            for d in r.update(&text[..end]) {
                match d {
                    ToolDelta::CallStart { name, .. } => names.push(name),
                    ToolDelta::Arguments { fragment, .. } => args.push_str(&fragment),
                    ToolDelta::Content(c) => panic!("content {c:?}"),
                }
            }
        }
        assert_eq!(
            (names, args.as_str()),
            (vec!["get_weather".to_string()], "{\"city\": \"Paris\"}")
        );
        let tagged = ToolReader::parse(ToolFormat::Llama3Json, &format!("<|python_tag|>{text}"));
        assert_eq!(tagged.calls.len(), 1);
        let prose = ToolReader::parse(ToolFormat::Llama3Json, "It is sunny {today}.");
        assert_eq!(
            (prose.content.as_str(), prose.calls.len()),
            ("It is sunny {today}.", 0)
        );
    }

    #[test]
    fn hermes_content_then_calls() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"}\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        let mut r = ToolReader::new(ToolFormat::Hermes);
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for end in 1..=text.len() {
            for d in r.update(&text[..end]) {
                match d {
                    ToolDelta::Content(c) => content.push_str(&c),
                    ToolDelta::CallStart { name, .. } => calls.push((name, String::new())),
                    ToolDelta::Arguments { index, fragment } => calls[index].1.push_str(&fragment),
                }
            }
        }
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            [
                ("f".into(), "{\"a\": \"}\"}".into()),
                ("g".into(), "{}".into())
            ]
        );
        let parsed = ToolReader::parse(ToolFormat::Hermes, text);
        assert_eq!(parsed.content, "Let me check.");
        assert_eq!(parsed.calls.len(), 2);
        // Prose that never opens a call is all content.
        assert_eq!(
            ToolReader::parse(ToolFormat::Hermes, "Hello <tool").content,
            "Hello <tool"
        );
    }

    #[test]
    fn native_calls_stream_whole_after_their_content() {
        let text = "Let me see.\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>";
        let format = ToolFormat::Native(NativeSyntax::QwenXml);
        let mut r = ToolReader::new(format);
        let mut content = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        for end in (1..=text.len()).filter(|&e| text.is_char_boundary(e)) {
            for d in r.update(&text[..end]) {
                match d {
                    ToolDelta::Content(c) => content.push_str(&c),
                    ToolDelta::CallStart { name, .. } => calls.push((name, String::new())),
                    ToolDelta::Arguments { index, fragment } => calls[index].1.push_str(&fragment),
                }
            }
        }
        assert_eq!(content, "Let me see.");
        assert_eq!(calls, [("f".to_string(), "{\"a\":1}".to_string())]);
        let parsed = ToolReader::parse(format, text);
        assert_eq!(
            (parsed.content.as_str(), parsed.calls.len()),
            ("Let me see.", 1)
        );
        // Free text cannot be forced into a call: no constraint for any choice.
        let plan = plan(format, &[], &ToolChoice::Auto, true, false);
        assert!(plan.constraint.is_none());
        assert!(!format.enforces_calls());
    }
}
