//! Tool calling in the chat API (OpenAI's shape): `tools`, `tool_choice`,
//! `parallel_tool_calls`, assistant `tool_calls` and `tool` messages in the history, calls in
//! responses (`message.tool_calls`, `finish_reason: "tool_calls"`) and in streams (the first
//! delta of a call carries its id and name, later ones fragments of `arguments`). The format
//! and the constraint are `rill_constrain::tools`'.

use rill_constrain::tools::{
    generic_messages, plan, ParsedCall, Tool, ToolChoice, ToolFormat, ToolPlan,
};
use rill_tokenizer::{ChatMessage, TokenType, Tokenizer};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::fields::Fields;

/// Most tools one request may give.
pub const MAX_TOOLS: usize = 128;

/// What a request asks of tools.
#[derive(Debug, Clone)]
pub(crate) struct ToolRequest {
    pub tools: Vec<Tool>,
    /// `tools` as given, for templates that render them.
    pub tools_json: Value,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolRequest {
    /// Whether the model is shown the tools and may call them.
    pub fn active(&self) -> bool {
        self.choice != ToolChoice::None
    }
}

/// `tools`, `tool_choice` and `parallel_tool_calls`; `None` when the request has no tools.
pub(crate) fn parse(f: &Fields<'_>) -> Result<Option<ToolRequest>, ApiError> {
    for key in ["functions", "function_call"] {
        if f.get(key).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::param(
                key,
                format!("'{key}' is deprecated and not supported: use 'tools' and 'tool_choice'"),
            ));
        }
    }
    let list = match f.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(Value::Array(a)) => Some(a),
        Some(v) => return Err(ApiError::wrong_type("tools", "an array", v)),
    };
    let choice_value = f.get("tool_choice").filter(|v| !v.is_null());
    let Some(list) = list else {
        return match choice_value {
            None => Ok(None),
            Some(Value::String(s)) if s == "none" || s == "auto" => Ok(None),
            Some(_) => Err(ApiError::param(
                "tool_choice",
                "'tool_choice' asks for a tool call but the request has no 'tools'",
            )),
        };
    };
    if list.len() > MAX_TOOLS {
        return Err(ApiError::param(
            "tools",
            format!("at most {MAX_TOOLS} tools per request, got {}", list.len()),
        ));
    }
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let name = format!("tools[{i}]");
        let Value::Object(map) = t else {
            return Err(ApiError::wrong_type(&name, "a tool object", t));
        };
        let tf = Fields::nested(map, format!("{name}."));
        match tf.str("type")? {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::param(
                    tf.name("type"),
                    format!("only tools of type \"function\" are supported, got {other:?}"),
                ))
            }
            None => return Err(ApiError::missing(&tf.name("type"))),
        }
        let func = tf
            .object("function")?
            .ok_or_else(|| ApiError::missing(&tf.name("function")))?;
        let fname = func
            .str("name")?
            .ok_or_else(|| ApiError::missing(&func.name("name")))?;
        check_name(&func.name("name"), fname)?;
        if tools.iter().any(|t: &Tool| t.name == fname) {
            return Err(ApiError::param(
                func.name("name"),
                format!("two tools are named {fname:?}"),
            ));
        }
        let parameters = match func.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(v @ Value::Object(_)) => v.clone(),
            Some(v) => {
                return Err(ApiError::wrong_type(
                    &func.name("parameters"),
                    "a JSON Schema object",
                    v,
                ))
            }
        };
        func.bool("strict")?;
        tools.push(Tool {
            name: fname.to_string(),
            description: func.str("description")?.map(str::to_string),
            parameters,
        });
    }
    let choice = match choice_value {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!("'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, got {other:?}"),
                ))
            }
        },
        Some(Value::Object(map)) => {
            let cf = Fields::nested(map, "tool_choice.".into());
            let func = cf
                .object("function")?
                .ok_or_else(|| ApiError::missing("tool_choice.function"))?;
            let name = func
                .str("name")?
                .ok_or_else(|| ApiError::missing("tool_choice.function.name"))?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::param(
                    "tool_choice.function.name",
                    format!("'tool_choice' names {name:?}, which is not one of 'tools'"),
                ));
            }
            ToolChoice::Named(name.to_string())
        }
        Some(v) => return Err(ApiError::wrong_type("tool_choice", "a string or an object", v)),
    };
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    Ok(Some(ToolRequest {
        tools,
        tools_json: Value::Array(list.clone()),
        choice,
        parallel,
    }))
}

/// A tool's name: 1 to 64 letters, digits, `_`, `-` or `.` (what every API allows).
pub(crate) fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if valid {
        Ok(())
    } else {
        Err(ApiError::param(
            field.to_string(),
            format!("'{field}' must be 1 to 64 letters, digits, '_', '-' or '.', got {name:?}"),
        ))
    }
}

/// An assistant message's `tool_calls` as chat templates get them (transformers' form:
/// `arguments` a dict when the string holds a JSON object).
pub(crate) fn history_calls(name: &str, v: &Value) -> Result<Vec<Value>, ApiError> {
    let Value::Array(calls) = v else {
        return Err(ApiError::wrong_type(name, "an array of tool calls", v));
    };
    let mut out = Vec::with_capacity(calls.len());
    for (i, c) in calls.iter().enumerate() {
        let cname = format!("{name}[{i}]");
        let Value::Object(map) = c else {
            return Err(ApiError::wrong_type(&cname, "a tool call object", c));
        };
        let cf = Fields::nested(map, format!("{cname}."));
        let id = cf.str("id")?.unwrap_or("");
        let func = cf
            .object("function")?
            .ok_or_else(|| ApiError::missing(&cf.name("function")))?;
        let fname = func
            .str("name")?
            .ok_or_else(|| ApiError::missing(&func.name("name")))?;
        let arguments = match func.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v @ Value::Object(_)) => v,
                _ => Value::String(s.clone()),
            },
            Some(v) => v.clone(),
        };
        out.push(json!({
            "id": id,
            "type": "function",
            "function": {"name": fname, "arguments": arguments},
        }));
    }
    Ok(out)
}

/// The format of the served model's template, and whether `<tool_call>` is one control token.
pub(crate) fn format_of(tokenizer: &Tokenizer) -> (ToolFormat, bool) {
    let format = ToolFormat::detect(tokenizer.chat_template());
    let open_is_token = tokenizer
        .token_id("<tool_call>")
        .is_some_and(|id| tokenizer.token_type(id) == Some(TokenType::Control));
    (format, open_is_token)
}

/// The conversation the template renders, and the tools it is given.
pub(crate) fn prompt_messages(
    messages: Vec<ChatMessage>,
    request: &ToolRequest,
    format: ToolFormat,
) -> (Vec<ChatMessage>, Option<Value>) {
    if format.template_renders_tools() {
        let tools = request.active().then(|| request.tools_json.clone());
        return (messages, tools);
    }
    let rows: Vec<(String, String, Vec<ParsedCall>, Option<String>)> = messages
        .into_iter()
        .map(|m| {
            let calls = m
                .tool_calls
                .iter()
                .map(|c| ParsedCall {
                    name: c["function"]["name"].as_str().unwrap_or("").to_string(),
                    arguments: match &c["function"]["arguments"] {
                        Value::String(s) => s.clone(),
                        v => rill_constrain::layout_json(v),
                    },
                })
                .collect();
            (m.role, m.content, calls, m.tool_call_id)
        })
        .collect();
    let shown: &[Tool] = if request.active() {
        &request.tools
    } else {
        &[]
    };
    let rewritten = generic_messages(&rows, shown, &request.choice)
        .into_iter()
        .map(|(role, content)| ChatMessage::new(role, content))
        .collect();
    (rewritten, None)
}

/// The constraint plan of a request.
pub(crate) fn request_plan(
    request: &ToolRequest,
    format: ToolFormat,
    open_is_token: bool,
) -> ToolPlan {
    plan(
        format,
        &request.tools,
        &request.choice,
        request.parallel,
        open_is_token,
    )
}

/// A new call id, as OpenAI writes them.
pub(crate) fn call_id() -> String {
    format!("call_{:016x}", crate::params::random_seed())
}
