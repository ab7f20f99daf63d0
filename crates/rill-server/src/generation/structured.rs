//! Structured output in requests: the fields each family of clients sends, read into one
//! [`ConstraintSpec`] and compiled off the async runtime, bounded in time. A constraint that
//! cannot be enforced is a 400 naming the field and the problem, never unconstrained output.
//!
//! - OpenAI: `response_format` `{"type": "json_object"}` or `{"type": "json_schema",
//!   "json_schema": {"name", "schema", "strict"}}` (the schema also accepted as
//!   `response_format.schema`, or as `json_schema` itself, as some clients send it);
//! - vLLM: `structured_outputs` `{json | regex | choice | grammar | json_object}` (and the
//!   older top-level `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`);
//!   `grammar` is Lark, or GBNF when it defines `root ::=`;
//! - llama.cpp: `json_schema` (a schema) and `grammar` (GBNF).

use std::sync::Arc;

use rill_constrain::{ConstraintError, ConstraintSpec, Grammar};
use serde_json::Value;

use crate::error::ApiError;
use crate::fields::Fields;
use crate::generation::request::blocking;
use crate::state::State;

/// Keys that mark an object as a JSON Schema (for `json_schema` sent without its wrapper).
const SCHEMA_KEYS: [&str; 12] = [
    "type",
    "properties",
    "$ref",
    "$defs",
    "definitions",
    "anyOf",
    "oneOf",
    "allOf",
    "enum",
    "const",
    "items",
    "$schema",
];

/// The request's constraint and the field it came from, if it asks for one; an error when it
/// asks in two places or a field is malformed.
pub(crate) fn parse(f: &Fields<'_>) -> Result<Option<(ConstraintSpec, String)>, ApiError> {
    let mut found: Vec<(ConstraintSpec, String)> = Vec::new();
    if let Some(rf) = f.object("response_format")? {
        if let Some(spec) = response_format(&rf)? {
            found.push((spec, "response_format".into()));
        }
    }
    if let Some(so) = f.object("structured_outputs")? {
        found.extend(structured_outputs(&so)?);
    }
    for (key, kind) in [
        ("guided_json", "json"),
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ] {
        if let Some(v) = f.get(key) {
            found.push((vllm_field(&f.name(key), kind, v)?, f.name(key)));
        }
    }
    if let Some(v) = f.get("json_schema") {
        found.push((
            schema_value(&f.name("json_schema"), v)?,
            f.name("json_schema"),
        ));
    }
    if let Some(g) = f.str("grammar")? {
        if !g.trim().is_empty() {
            found.push((ConstraintSpec::Gbnf(g.to_string()), f.name("grammar")));
        }
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(ApiError::param(
            found[1].1.clone(),
            format!(
                "'{}' and '{}' both constrain the output: give one",
                found[0].1, found[1].1
            ),
        )),
    }
}

fn response_format(rf: &Fields<'_>) -> Result<Option<ConstraintSpec>, ApiError> {
    let name = rf.name("type");
    match rf.str("type")? {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(match rf.get("schema") {
            // llama.cpp's form: json_object with a schema.
            Some(v) => schema_value(&rf.name("schema"), v)?,
            None => ConstraintSpec::JsonObject,
        })),
        Some("json_schema") => {
            if let Some(js) = rf.object("json_schema")? {
                if let Some(v) = js.get("schema") {
                    return schema_value(&js.name("schema"), v).map(Some);
                }
                let looks_like_schema = SCHEMA_KEYS.iter().any(|k| js.get(k).is_some());
                if looks_like_schema {
                    if let Some(Value::Object(map)) = rf.get("json_schema") {
                        return Ok(Some(ConstraintSpec::JsonSchema(Value::Object(map.clone()))));
                    }
                }
                if let Some(strict) = js.get("strict") {
                    if !strict.is_boolean() && !strict.is_null() {
                        return Err(ApiError::wrong_type(
                            &js.name("strict"),
                            "a boolean",
                            strict,
                        ));
                    }
                }
                return Err(ApiError::missing(&js.name("schema")));
            }
            match rf.get("schema") {
                Some(v) => schema_value(&rf.name("schema"), v).map(Some),
                None => Err(ApiError::missing(&rf.name("json_schema"))),
            }
        }
        Some(other) => Err(ApiError::param(
            name.clone(),
            format!("'{name}' must be \"text\", \"json_object\" or \"json_schema\"; got {other:?}"),
        )),
    }
}

fn structured_outputs(so: &Fields<'_>) -> Result<Vec<(ConstraintSpec, String)>, ApiError> {
    let mut out = Vec::new();
    for kind in ["json", "regex", "choice", "grammar"] {
        if let Some(v) = so.get(kind) {
            if !v.is_null() {
                out.push((vllm_field(&so.name(kind), kind, v)?, so.name(kind)));
            }
        }
    }
    if so.bool("json_object")?.unwrap_or(false) {
        out.push((ConstraintSpec::JsonObject, so.name("json_object")));
    }
    Ok(out)
}

/// One of vLLM's constraint fields.
fn vllm_field(name: &str, kind: &str, v: &Value) -> Result<ConstraintSpec, ApiError> {
    match kind {
        "json" => schema_value(name, v),
        "regex" => match v {
            Value::String(s) => Ok(ConstraintSpec::Regex(s.clone())),
            v => Err(ApiError::wrong_type(name, "a string", v)),
        },
        "choice" => match v {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, c)| match c {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(ApiError::wrong_type(&format!("{name}[{i}]"), "a string", v)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(ConstraintSpec::Choice),
            v => Err(ApiError::wrong_type(name, "an array of strings", v)),
        },
        _ => match v {
            Value::String(s) => Ok(ConstraintSpec::grammar(s)),
            v => Err(ApiError::wrong_type(name, "a string", v)),
        },
    }
}

/// A schema given as an object, a boolean, or a string holding one.
pub(crate) fn schema_value(name: &str, v: &Value) -> Result<ConstraintSpec, ApiError> {
    match v {
        Value::Object(_) | Value::Bool(_) => Ok(ConstraintSpec::JsonSchema(v.clone())),
        Value::String(s) => match serde_json::from_str::<Value>(s) {
            Ok(inner @ (Value::Object(_) | Value::Bool(_))) => {
                Ok(ConstraintSpec::JsonSchema(inner))
            }
            Ok(other) => Err(ApiError::wrong_type(name, "a JSON Schema object", &other)),
            Err(e) => Err(ApiError::param(
                name,
                format!("'{name}' is a string but not JSON: {e}"),
            )),
        },
        v => Err(ApiError::wrong_type(name, "a JSON Schema object", v)),
    }
}

/// Compiles the request's constraint against the served model, on a blocking thread and
/// within the server's compile limits (time included).
pub(crate) async fn compile(
    state: &Arc<State>,
    tokenizer: Arc<rill_tokenizer::Tokenizer>,
    spec: ConstraintSpec,
    field: String,
) -> Result<Grammar, ApiError> {
    let state = Arc::clone(state);
    blocking(move || {
        let constrainer = state.constrainer(tokenizer).map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                e.to_string(),
            )
        })?;
        constrainer
            .compile_with_timeout(spec)
            .map_err(|e| compile_error(&field, e))
    })
    .await
}

fn compile_error(field: &str, e: ConstraintError) -> ApiError {
    let code = match &e {
        ConstraintError::Timeout { .. } => "constraint_timeout",
        ConstraintError::Gbnf { .. } => "invalid_grammar",
        _ => "invalid_constraint",
    };
    ApiError::param(field, format!("'{field}' cannot be enforced: {e}")).with_code(code)
}
