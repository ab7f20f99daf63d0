//! Tool calls in the syntaxes model families were trained on, read from unconstrained text:
//! Qwen3-Coder's and Qwen3.5's XML (`<tool_call><function=NAME><parameter=KEY>VALUE</parameter>
//! </function></tool_call>`), Mistral's `[TOOL_CALLS]` (a JSON list, or `NAME[ARGS]{...}`),
//! DeepSeek V3's `<｜tool▁call▁begin｜>` blocks, and Gemma 4's `<|tool_call>call:NAME{...}
//! <tool_call|>` with its own value syntax. A call counts once it is complete; the text before
//! the first call's opening is the answer's content. Each call's arguments come out as JSON text.
//!
//! Qwen's XML writes every value as bare text, so its type comes from the tool's schema
//! ([`ParamTypes`]): `3` is the string `"3"` for a string parameter and the number 3 for an
//! integer one; where the schema says nothing, a value that reads as JSON other than a string
//! is that value.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// A family's call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeSyntax {
    QwenXml,
    Mistral,
    DeepSeek,
    Gemma4,
}

const QWEN_OPEN: &str = "<tool_call>";
const QWEN_CLOSE: &str = "</tool_call>";
const MISTRAL_OPEN: &str = "[TOOL_CALLS]";
const DEEPSEEK_CALLS: &str = "<｜tool▁calls▁begin｜>";
const DEEPSEEK_OPEN: &str = "<｜tool▁call▁begin｜>";
const DEEPSEEK_SEP: &str = "<｜tool▁sep｜>";
const DEEPSEEK_CLOSE: &str = "<｜tool▁call▁end｜>";
const GEMMA_OPEN: &str = "<|tool_call>call:";
const GEMMA_CLOSE: &str = "<tool_call|>";
const GEMMA_QUOTE: &str = "<|\"|>";

/// What text holds: content before the first call, the complete calls, and whether a call is
/// open (begun, not complete).
#[derive(Debug, Default, PartialEq)]
pub struct NativeRead {
    pub content: String,
    pub calls: Vec<(String, String)>,
    pub open: bool,
}

impl NativeSyntax {
    /// The syntax a chat template writes calls in, if one of these.
    pub fn detect(template: &str) -> Option<NativeSyntax> {
        if template.contains("<function=")
            && template.contains("<parameter=")
            && template.contains(QWEN_OPEN)
        {
            Some(NativeSyntax::QwenXml)
        } else if template.contains(MISTRAL_OPEN) {
            Some(NativeSyntax::Mistral)
        } else if template.contains("tool▁call▁begin") {
            Some(NativeSyntax::DeepSeek)
        } else if template.contains("<|tool_call>call:") {
            Some(NativeSyntax::Gemma4)
        } else {
            None
        }
    }

    /// The marker a call's text opens with.
    pub fn open_marker(self) -> &'static str {
        match self {
            NativeSyntax::QwenXml => QWEN_OPEN,
            NativeSyntax::Mistral => MISTRAL_OPEN,
            NativeSyntax::DeepSeek => DEEPSEEK_OPEN,
            NativeSyntax::Gemma4 => "<|tool_call>",
        }
    }

    /// Reads `text` (the answer so far, control tokens spelled out), with no schemas.
    pub fn read(self, text: &str) -> NativeRead {
        self.read_typed(text, &ParamTypes::default())
    }

    /// Reads `text`, typing bare values by their tools' parameter schemas (Qwen's XML).
    pub fn read_typed(self, text: &str, types: &ParamTypes) -> NativeRead {
        let open = match self {
            // DeepSeek opens the list with its own marker; either marker starts the calls.
            NativeSyntax::DeepSeek => [DEEPSEEK_CALLS, DEEPSEEK_OPEN]
                .iter()
                .filter_map(|m| text.find(m))
                .min(),
            _ => text.find(self.open_marker()),
        };
        let Some(start) = open else {
            return NativeRead {
                content: text.to_string(),
                ..NativeRead::default()
            };
        };
        let mut out = NativeRead {
            content: text[..start].trim_end().to_string(),
            ..NativeRead::default()
        };
        let rest = &text[start..];
        match self {
            NativeSyntax::QwenXml => qwen(rest, types, &mut out),
            NativeSyntax::Mistral => mistral(rest, &mut out),
            NativeSyntax::DeepSeek => deepseek(rest, &mut out),
            NativeSyntax::Gemma4 => gemma(rest, &mut out),
        }
        out
    }
}

/// The JSON types the tools' schemas declare for their parameters: tool → parameter → types
/// (a schema's `type`, a list of them, or those of its `anyOf`/`oneOf` branches; `enum` values'
/// own types where no `type` is given).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ParamTypes(HashMap<String, HashMap<String, Vec<String>>>);

impl ParamTypes {
    /// From each tool's name and arguments schema (an object schema's `properties`).
    pub fn from_schemas<'a>(tools: impl IntoIterator<Item = (&'a str, &'a Value)>) -> ParamTypes {
        let mut out = HashMap::new();
        for (name, schema) in tools {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                continue;
            };
            let params: HashMap<String, Vec<String>> = props
                .iter()
                .map(|(key, s)| {
                    let mut types = Vec::new();
                    declared_types(s, &mut types);
                    (key.clone(), types)
                })
                .filter(|(_, types)| !types.is_empty())
                .collect();
            out.insert(name.to_string(), params);
        }
        ParamTypes(out)
    }

    fn of(&self, tool: &str, param: &str) -> &[String] {
        self.0
            .get(tool)
            .and_then(|p| p.get(param))
            .map_or(&[], Vec::as_slice)
    }
}

fn declared_types(schema: &Value, out: &mut Vec<String>) {
    let mut add = |t: &str| {
        if !out.iter().any(|o| o == t) {
            out.push(t.to_string());
        }
    };
    match schema.get("type") {
        Some(Value::String(t)) => add(t),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).for_each(add),
        _ => {
            for v in schema
                .get("enum")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                add(json_type(v));
            }
        }
    }
    for key in ["anyOf", "oneOf"] {
        for branch in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            declared_types(branch, out);
        }
    }
}

/// A JSON value's type, as a schema names it (`integer` for whole numbers).
fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A bare XML value read as the schema's `types` allow: a string parameter keeps its text as
/// written; a non-string one takes the JSON the text spells when its type is declared (and
/// `true`/`false` in any case for a boolean); otherwise the text, which the tool's validation
/// then refuses. With no declared type: JSON other than a string, else the text.
fn typed_value(raw: &str, types: &[String]) -> Value {
    let declared = |t: &str| types.iter().any(|d| d == t);
    let text = || Value::String(raw.to_string());
    if types.is_empty() {
        return match serde_json::from_str::<Value>(raw) {
            Ok(v) if !v.is_string() => v,
            _ => text(),
        };
    }
    let trimmed = raw.trim();
    if declared("boolean") {
        for (word, b) in [("true", true), ("false", false)] {
            if trimmed.eq_ignore_ascii_case(word) {
                return Value::Bool(b);
            }
        }
    }
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        let t = json_type(&v);
        let fits = declared(t) || (t == "integer" && declared("number"));
        if fits && !v.is_string() {
            return v;
        }
        if v.is_string() && !declared("string") {
            // A quoted string for a non-string parameter: its contents.
            return v;
        }
    }
    if declared("string") {
        return text();
    }
    // No declared type fits: the JSON the text spells, if any, for validation to judge.
    serde_json::from_str::<Value>(trimmed).unwrap_or_else(|_| text())
}

/// `<tool_call>` blocks of `<function=NAME>` and `<parameter=KEY>VALUE</parameter>`, each value
/// typed by its parameter's schema ([`typed_value`]).
fn qwen(mut rest: &str, types: &ParamTypes, out: &mut NativeRead) {
    while let Some(after) = rest.trim_start().strip_prefix(QWEN_OPEN) {
        let Some(end) = after.find(QWEN_CLOSE) else {
            out.open = true;
            return;
        };
        let body = &after[..end];
        rest = &after[end + QWEN_CLOSE.len()..];
        let Some(f) = body.find("<function=") else {
            continue;
        };
        let head = &body[f + "<function=".len()..];
        let Some(gt) = head.find('>') else { continue };
        let name = head[..gt].trim().to_string();
        let mut args = Map::new();
        let mut params = &head[gt + 1..];
        while let Some(p) = params.find("<parameter=") {
            let after = &params[p + "<parameter=".len()..];
            let Some(gt) = after.find('>') else { break };
            let key = after[..gt].trim().to_string();
            let value_and_rest = &after[gt + 1..];
            let Some(close) = value_and_rest.find("</parameter>") else {
                break;
            };
            let raw = value_and_rest[..close]
                .strip_prefix('\n')
                .unwrap_or(&value_and_rest[..close]);
            let raw = raw.strip_suffix('\n').unwrap_or(raw);
            let value = typed_value(raw, types.of(&name, &key));
            args.insert(key, value);
            params = &value_and_rest[close + "</parameter>".len()..];
        }
        out.calls.push((name, Value::Object(args).to_string()));
    }
}

/// `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`, or (newer models) one or more
/// `NAME[ARGS]{...}`.
fn mistral(rest: &str, out: &mut NativeRead) {
    let mut rest = rest;
    while let Some(after) = rest.trim_start().strip_prefix(MISTRAL_OPEN) {
        let after = after.trim_start();
        if after.starts_with('[') {
            let mut stream = serde_json::Deserializer::from_str(after).into_iter::<Value>();
            match stream.next() {
                Some(Ok(Value::Array(list))) => {
                    for c in list {
                        let Some(name) = c.get("name").and_then(Value::as_str) else {
                            continue;
                        };
                        let args = c
                            .get("arguments")
                            .cloned()
                            .unwrap_or(Value::Object(Map::new()));
                        let args = match args {
                            Value::String(s) => s,
                            v => v.to_string(),
                        };
                        out.calls.push((name.to_string(), args));
                    }
                    rest = &after[stream.byte_offset()..];
                }
                _ => {
                    out.open = true;
                    return;
                }
            }
        } else {
            let Some(a) = after.find("[ARGS]") else {
                out.open = true;
                return;
            };
            let name = after[..a].trim().to_string();
            let json = &after[a + "[ARGS]".len()..];
            let mut stream = serde_json::Deserializer::from_str(json).into_iter::<Value>();
            match stream.next() {
                Some(Ok(v)) => {
                    out.calls.push((name, v.to_string()));
                    rest = &json[stream.byte_offset()..];
                }
                _ => {
                    out.open = true;
                    return;
                }
            }
        }
    }
}

/// `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>` (V3.1 and later), or
/// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` then a fenced JSON block (V3, R1).
fn deepseek(rest: &str, out: &mut NativeRead) {
    let mut rest = rest.strip_prefix(DEEPSEEK_CALLS).unwrap_or(rest);
    while let Some(after) = rest.trim_start().strip_prefix(DEEPSEEK_OPEN) {
        let Some(end) = after.find(DEEPSEEK_CLOSE) else {
            out.open = true;
            return;
        };
        let body = &after[..end];
        rest = &after[end + DEEPSEEK_CLOSE.len()..];
        let Some(sep) = body.find(DEEPSEEK_SEP) else {
            continue;
        };
        let (head, tail) = (&body[..sep], &body[sep + DEEPSEEK_SEP.len()..]);
        let (name, json) = if head.trim() == "function" {
            let (name, block) = tail.split_once('\n').unwrap_or((tail, ""));
            (name.trim(), strip_fence(block))
        } else {
            (head.trim(), tail.trim())
        };
        if let Ok(v) = serde_json::from_str::<Value>(json) {
            out.calls.push((name.to_string(), v.to_string()));
        }
    }
}

/// A fenced code block's body (```json ... ```), or the text itself.
fn strip_fence(s: &str) -> &str {
    let s = s.trim();
    match s.strip_prefix("```") {
        Some(inner) => {
            let inner = inner.split_once('\n').map_or(inner, |(_, b)| b);
            inner.trim_end().strip_suffix("```").unwrap_or(inner).trim()
        }
        None => s,
    }
}

/// `<|tool_call>call:NAME{key:value,...}<tool_call|>`: Gemma 4's value syntax (strings between
/// `<|"|>` marks, bare keys) read into JSON.
fn gemma(rest: &str, out: &mut NativeRead) {
    let mut rest = rest;
    while let Some(after) = rest.trim_start().strip_prefix(GEMMA_OPEN) {
        let Some(end) = after.find(GEMMA_CLOSE) else {
            out.open = true;
            return;
        };
        let body = &after[..end];
        rest = &after[end + GEMMA_CLOSE.len()..];
        let Some(brace) = body.find('{') else {
            continue;
        };
        let name = body[..brace].trim().to_string();
        let mut p = GemmaValue {
            s: &body[brace..],
            at: 0,
        };
        if let Some(v) = p.value() {
            out.calls.push((name, v.to_string()));
        }
    }
}

struct GemmaValue<'a> {
    s: &'a str,
    at: usize,
}

impl GemmaValue<'_> {
    fn rest(&self) -> &str {
        &self.s[self.at..]
    }

    fn skip_space(&mut self) {
        let trimmed = self.rest().trim_start();
        self.at = self.s.len() - trimmed.len();
    }

    fn eat(&mut self, t: &str) -> bool {
        self.skip_space();
        if self.rest().starts_with(t) {
            self.at += t.len();
            true
        } else {
            false
        }
    }

    fn string(&mut self) -> Option<String> {
        if !self.eat(GEMMA_QUOTE) {
            return None;
        }
        let end = self.rest().find(GEMMA_QUOTE)?;
        let s = self.rest()[..end].to_string();
        self.at += end + GEMMA_QUOTE.len();
        Some(s)
    }

    fn key(&mut self) -> Option<String> {
        if let Some(s) = self.string() {
            return Some(s);
        }
        self.skip_space();
        let end = self.rest().find(':')?;
        let k = self.rest()[..end].trim().to_string();
        self.at += end;
        Some(k)
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_space();
        if self.rest().starts_with(GEMMA_QUOTE) {
            return self.string().map(Value::String);
        }
        if self.eat("{") {
            let mut m = Map::new();
            if self.eat("}") {
                return Some(Value::Object(m));
            }
            loop {
                let k = self.key()?;
                if !self.eat(":") {
                    return None;
                }
                m.insert(k, self.value()?);
                if self.eat("}") {
                    return Some(Value::Object(m));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat("[") {
            let mut a = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(a));
            }
            loop {
                a.push(self.value()?);
                if self.eat("]") {
                    return Some(Value::Array(a));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        // A number, true, false or null: up to the next delimiter.
        let end = self
            .rest()
            .find([',', '}', ']'])
            .unwrap_or(self.rest().len());
        let value = serde_json::from_str(self.rest()[..end].trim()).ok();
        self.at += end;
        value
    }
}

/// A whole answer that is only a JSON object (bare, or in a ```json fence) naming one of
/// `tools` with its `arguments` (or `parameters`): the call small models write when their
/// template has no call syntax of its own (a Qwen2.5-Coder answering tools in a fenced block).
pub fn json_call(text: &str, tools: &[&str]) -> Option<(String, String)> {
    let body = strip_fence(text);
    let v: Value = serde_json::from_str(body).ok()?;
    let name = v.get("name")?.as_str()?;
    if !tools.contains(&name) {
        return None;
    }
    let args = v.get("arguments").or_else(|| v.get("parameters"))?;
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
        v => v.clone(),
    };
    args.is_object()
        .then(|| (name.to_string(), args.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(r: &NativeRead) -> Vec<(&str, Value)> {
        r.calls
            .iter()
            .map(|(n, a)| (n.as_str(), serde_json::from_str(a).unwrap()))
            .collect()
    }

    #[test]
    fn qwen_xml() {
        let text = "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>";
        let r = NativeSyntax::QwenXml.read(text);
        assert_eq!(r.content, "I will check.");
        assert_eq!(
            calls(&r),
            [
                (
                    "get_weather",
                    serde_json::json!({"city": "Paris", "days": 3})
                ),
                ("now", serde_json::json!({}))
            ]
        );
        assert!(!r.open);
        // Cut inside a call: content only, a call open.
        let r = NativeSyntax::QwenXml.read(&text[..40]);
        assert!(r.open && r.calls.is_empty() && r.content == "I will check.");
    }

    /// Qwen's bare values take their parameters' declared types: digits stay text for a string
    /// parameter, `True` is a boolean, a number fits a `number`, an object parses; undeclared
    /// parameters and unknown tools keep the guess.
    #[test]
    fn qwen_xml_values_follow_the_schema() {
        let schema = serde_json::json!({"type": "object", "properties": {
            "zip": {"type": "string"},
            "days": {"type": "integer"},
            "ratio": {"type": "number"},
            "exact": {"type": "boolean"},
            "filter": {"type": "object"},
            "tags": {"type": ["array", "null"]},
            "unit": {"enum": ["c", "f"]},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        }});
        let types = ParamTypes::from_schemas([("w", &schema)]);
        let call = |body: &str| {
            let text = format!("<tool_call>\n<function=w>\n{body}</function>\n</tool_call>");
            let r = NativeSyntax::QwenXml.read_typed(&text, &types);
            serde_json::from_str::<Value>(&r.calls[0].1).unwrap()
        };
        let p = |k: &str, v: &str| format!("<parameter={k}>\n{v}\n</parameter>\n");
        assert_eq!(
            call(&p("zip", "02139")),
            serde_json::json!({"zip": "02139"})
        );
        assert_eq!(
            call(&p("zip", "75001")),
            serde_json::json!({"zip": "75001"})
        );
        assert_eq!(call(&p("zip", "null")), serde_json::json!({"zip": "null"}));
        assert_eq!(call(&p("days", "3")), serde_json::json!({"days": 3}));
        assert_eq!(call(&p("ratio", "2")), serde_json::json!({"ratio": 2}));
        assert_eq!(call(&p("ratio", "0.5")), serde_json::json!({"ratio": 0.5}));
        assert_eq!(
            call(&p("exact", "True")),
            serde_json::json!({"exact": true})
        );
        assert_eq!(
            call(&p("filter", "{\"a\": 1}")),
            serde_json::json!({"filter": {"a": 1}})
        );
        assert_eq!(call(&p("tags", "null")), serde_json::json!({"tags": null}));
        assert_eq!(
            call(&p("tags", "[1, 2]")),
            serde_json::json!({"tags": [1, 2]})
        );
        assert_eq!(call(&p("unit", "c")), serde_json::json!({"unit": "c"}));
        assert_eq!(call(&p("note", "42")), serde_json::json!({"note": "42"}));
        // A value the type cannot take stays as written, for the tool's validation to refuse.
        assert_eq!(
            call(&p("days", "three")),
            serde_json::json!({"days": "three"})
        );
        // A quoted string for an integer parameter: its contents.
        assert_eq!(call(&p("days", "\"4\"")), serde_json::json!({"days": "4"}));
        // Undeclared: the guess (JSON other than a string, else the text).
        assert_eq!(call(&p("other", "7")), serde_json::json!({"other": 7}));
        assert_eq!(
            call(&p("other", "Paris")),
            serde_json::json!({"other": "Paris"})
        );
    }

    #[test]
    fn mistral_both_forms() {
        let r = NativeSyntax::Mistral
            .read("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"name\": \"g\", \"arguments\": {}}]");
        assert_eq!(
            calls(&r),
            [
                ("f", serde_json::json!({"a": 1})),
                ("g", serde_json::json!({}))
            ]
        );
        let r = NativeSyntax::Mistral.read("[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]{}");
        assert_eq!(
            calls(&r),
            [
                ("f", serde_json::json!({"a": 1})),
                ("g", serde_json::json!({}))
            ]
        );
        assert!(
            NativeSyntax::Mistral
                .read("[TOOL_CALLS]f[ARGS]{\"a\": ")
                .open
        );
    }

    #[test]
    fn deepseek_both_generations() {
        let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(
            calls(&NativeSyntax::DeepSeek.read(v31)),
            [("f", serde_json::json!({"a": 1}))]
        );
        let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜>";
        assert_eq!(
            calls(&NativeSyntax::DeepSeek.read(v3)),
            [("f", serde_json::json!({"a": 1}))]
        );
    }

    #[test]
    fn gemma4_values() {
        let text = "<|tool_call>call:get_weather{city:<|\"|>Paris, FR<|\"|>,days:3,opts:{metric:true,tags:[<|\"|>a<|\"|>,2]}}<tool_call|>";
        let r = NativeSyntax::Gemma4.read(text);
        assert_eq!(
            calls(&r),
            [(
                "get_weather",
                serde_json::json!({"city": "Paris, FR", "days": 3, "opts": {"metric": true, "tags": ["a", 2]}})
            )]
        );
    }

    #[test]
    fn fenced_or_bare_json_naming_a_tool() {
        let tools = ["get_weather"];
        let fenced =
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```";
        assert_eq!(
            json_call(fenced, &tools),
            Some(("get_weather".into(), "{\"city\":\"Paris\"}".into()))
        );
        assert!(json_call("{\"name\": \"other\", \"arguments\": {}}", &tools).is_none());
        assert!(json_call("It is sunny.", &tools).is_none());
    }

    #[test]
    fn detects_the_templates() {
        assert_eq!(
            NativeSyntax::detect("<tool_call><function=x><parameter=y>"),
            Some(NativeSyntax::QwenXml)
        );
        assert_eq!(
            NativeSyntax::detect("[TOOL_CALLS]"),
            Some(NativeSyntax::Mistral)
        );
        assert_eq!(
            NativeSyntax::detect("<｜tool▁call▁begin｜>"),
            Some(NativeSyntax::DeepSeek)
        );
        assert_eq!(
            NativeSyntax::detect("'<|tool_call>call:'"),
            Some(NativeSyntax::Gemma4)
        );
        assert_eq!(NativeSyntax::detect("<tool_call>{\"name\""), None);
    }
}
