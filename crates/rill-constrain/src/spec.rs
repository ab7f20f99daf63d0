//! What a request asks its output to be, and the llguidance grammar that says it.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use crate::{gbnf, ConstraintError};

/// One constraint on a generation's text.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstraintSpec {
    /// A JSON value matching this JSON Schema (drafts 4 to 2020-12, as llguidance supports
    /// them; an unsupported keyword is an error, never ignored).
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `json_object` mode).
    JsonObject,
    /// Text matching this regular expression, whole (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (vLLM's `grammar`).
    Lark(String),
    /// A grammar in llama.cpp's GBNF (its `grammar` field), lowered to Lark.
    Gbnf(String),
}

/// `value` as rill writes JSON (Python's `json.dumps` with its default separators: one space
/// after `,` and `:`, nowhere else; non-ASCII as is): the text a constraint with the default
/// layout accepts.
pub fn layout_json(value: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Array(items) => {
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write(x, out);
                }
                out.push(']');
            }
            Value::Object(map) => {
                out.push('{');
                for (i, (k, x)) in map.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push_str(": ");
                    write(x, out);
                }
                out.push('}');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// How generated JSON is spaced unless the schema says otherwise (its `x-guidance` key): one
/// space after `,` and `:` as Python's `json.dumps` writes it, and nowhere else. Free
/// whitespace would let a small model loop on newlines until it runs out of tokens.
fn json_layout() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

impl ConstraintSpec {
    /// A grammar in either syntax: GBNF when it defines `root ::=` on a line of its own (no
    /// Lark grammar can), else llguidance's Lark.
    pub fn grammar(text: &str) -> ConstraintSpec {
        let gbnf = text.lines().any(|l| {
            l.trim_start()
                .strip_prefix("root")
                .is_some_and(|rest| rest.trim_start().starts_with("::="))
        });
        if gbnf {
            ConstraintSpec::Gbnf(text.to_string())
        } else {
            ConstraintSpec::Lark(text.to_string())
        }
    }

    /// A short name of the kind of constraint, for errors and the glass box.
    pub fn kind(&self) -> &'static str {
        match self {
            ConstraintSpec::JsonSchema(_) => "json_schema",
            ConstraintSpec::JsonObject => "json_object",
            ConstraintSpec::Regex(_) => "regex",
            ConstraintSpec::Choice(_) => "choice",
            ConstraintSpec::Lark(_) => "lark grammar",
            ConstraintSpec::Gbnf(_) => "GBNF grammar",
        }
    }

    /// The llguidance grammar of the constraint (checked for what can be checked without
    /// compiling it).
    pub(crate) fn to_grammar(&self) -> Result<TopLevelGrammar, ConstraintError> {
        let invalid = |message: String| ConstraintError::Invalid {
            kind: self.kind(),
            message,
        };
        Ok(match self {
            ConstraintSpec::JsonSchema(schema) => {
                let schema = match schema {
                    Value::Object(map) => {
                        let mut schema = Value::Object(map.clone());
                        strict_dates(&mut schema);
                        if let Value::Object(m) = &mut schema {
                            m.entry("x-guidance").or_insert_with(json_layout);
                        }
                        schema
                    }
                    // `true` accepts anything (any JSON value), `false` nothing.
                    Value::Bool(true) => json!({ "x-guidance": json_layout() }),
                    Value::Bool(false) => {
                        return Err(invalid("the schema `false` accepts no value".into()))
                    }
                    other => {
                        return Err(invalid(format!(
                            "a schema is an object or a boolean, not {}",
                            json_type(other)
                        )))
                    }
                };
                TopLevelGrammar::from_json_schema(schema)
            }
            ConstraintSpec::JsonObject => TopLevelGrammar::from_json_schema(
                json!({"type": "object", "x-guidance": json_layout()}),
            ),
            ConstraintSpec::Regex(rx) => {
                if rx.is_empty() {
                    return Err(invalid("the regular expression is empty".into()));
                }
                TopLevelGrammar::from_regex(rx)
            }
            ConstraintSpec::Choice(choices) => {
                if choices.is_empty() {
                    return Err(invalid("no choices given".into()));
                }
                if let Some(i) = choices.iter().position(|c| c.is_empty()) {
                    return Err(invalid(format!("choice {i} is empty")));
                }
                // JSON string syntax is Lark's string literal syntax.
                let alternatives: Vec<String> = choices
                    .iter()
                    .map(|c| serde_json::to_string(c).unwrap_or_default())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}\n", alternatives.join(" | ")))
            }
            ConstraintSpec::Lark(grammar) => {
                if grammar.trim().is_empty() {
                    return Err(invalid("the grammar is empty".into()));
                }
                TopLevelGrammar::from_lark(grammar.clone())
            }
            ConstraintSpec::Gbnf(grammar) => TopLevelGrammar::from_lark(gbnf::to_lark(grammar)?),
        })
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Years 0001 to 9999 (RFC 3339 has no year 0).
const YEAR: &str = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])";
/// Leap years among them: divisible by 4, centuries only when divisible by 400.
const LEAP_YEAR: &str =
    "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)";

fn date_regex() -> String {
    format!(
        "(?:{YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|{LEAP_YEAR}-02-29)"
    )
}

/// Seconds 00 to 59: a leap second (`:60`) is valid only at the end of particular days, which
/// no regular expression can know.
const TIME: &str = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";

/// The JSON Schema keywords whose values are data, not schemas (left as they are).
const DATA_KEYWORDS: [&str; 5] = ["const", "enum", "default", "examples", "x-guidance"];

/// Narrows the `date-time`, `date` and `time` formats to values every validator accepts: no
/// February 29 outside leap years, no year 0, no leap seconds (llguidance's own formats allow
/// them, which strict RFC 3339 validators such as Python's `rfc3339-validator` reject). Only
/// where the schema has no `pattern` of its own; what is generated is then a subset of what
/// the format allows.
fn strict_dates(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let narrowed = match map.get("format").and_then(Value::as_str) {
                Some("date-time") => Some(format!("^{}[Tt]{TIME}$", date_regex())),
                Some("date") => Some(format!("^{}$", date_regex())),
                Some("time") => Some(format!("^{TIME}$")),
                _ => None,
            };
            if let (Some(pattern), false) = (narrowed, map.contains_key("pattern")) {
                map.remove("format");
                map.insert("pattern".into(), Value::String(pattern));
            }
            for (key, value) in map.iter_mut() {
                if !DATA_KEYWORDS.contains(&key.as_str()) {
                    strict_dates(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strict_dates),
        _ => {}
    }
}
