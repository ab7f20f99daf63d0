//! A Messages request read into the internal chat request: `system` (a string or text blocks,
//! and `role: "system"` entries inside `messages`, as Claude Code sends them), content blocks
//! (`text`, `tool_use`, `tool_result`, `thinking`; `redacted_thinking` and cache controls
//! ignored), `tools` (custom tools; Anthropic's server tools ignored) and `tool_choice`,
//! `thinking`, `output_config.format` (a JSON schema), `stop_sequences`, `max_tokens`, and
//! `temperature`/`top_p`/`top_k` (which the 2026 SDKs no longer send, but older clients and
//! `extra_body` do). Fields this server has no use for (`metadata`, `context_management`,
//! `output_config.effort`, `service_tier`, ...) are ignored.

use rill_constrain::tools::{Tool, ToolChoice};
use rill_engine::GenerateParams;
use rill_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::fields::Fields;
use crate::generation::tools::{ToolRequest, MAX_TOOLS};
use crate::params::{Common, MAX_STOP_BYTES, MAX_STOP_STRINGS};

/// A parsed Messages request.
pub(crate) struct MessagesRequest {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<ToolRequest>,
    /// `output_config.format`: a JSON schema the answer follows.
    pub structured: Option<(rill_constrain::ConstraintSpec, String)>,
    /// `thinking.display` is not `"omitted"`.
    pub show_thinking: bool,
    /// `thinking.budget_tokens`.
    pub thinking_budget: Option<usize>,
    pub template_kwargs: Map<String, Value>,
    pub common: Common,
    /// The model name as the client gave it (echoed in the answer).
    pub model: Option<String>,
}

/// Reads a Messages body.
pub(crate) fn parse(f: &Fields<'_>) -> Result<MessagesRequest, ApiError> {
    let model = f.str("model")?.map(str::to_string);
    let mut messages = Vec::new();
    match f.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(ChatMessage::new("system", s.clone())),
        Some(Value::Array(blocks)) => {
            messages.push(ChatMessage::new("system", text_blocks("system", blocks)?))
        }
        Some(v) => {
            return Err(ApiError::wrong_type(
                "system",
                "a string or an array of text blocks",
                v,
            ))
        }
    }
    let list = match f.get("messages") {
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::wrong_type("messages", "an array of messages", v)),
        None => return Err(ApiError::missing("messages")),
    };
    if list.is_empty() {
        return Err(ApiError::param(
            "messages",
            "'messages' must hold at least one message",
        ));
    }
    for (i, m) in list.iter().enumerate() {
        read_message(&format!("messages[{i}]"), m, &mut messages)?;
    }
    // A system message in the middle is folded into the first one: templates take one, first.
    let mut system: Vec<String> = Vec::new();
    messages.retain(|m| {
        if m.role == "system" {
            system.push(m.content.clone());
            false
        } else {
            true
        }
    });
    if !system.is_empty() {
        messages.insert(0, ChatMessage::new("system", system.join("\n\n")));
    }
    let tools = read_tools(f)?;
    let mut template_kwargs = Map::new();
    let mut show_thinking = true;
    let mut thinking_budget = None;
    if let Some(t) = f.object("thinking")? {
        thinking_budget = t
            .int("budget_tokens", 0, i64::from(u32::MAX))?
            .map(|n| n as usize);
        // Kinds this server does not know (Anthropic adds them) leave the template's default.
        match t.str("type")? {
            Some("enabled" | "adaptive" | "between_tools") => {
                template_kwargs.insert("enable_thinking".into(), json!(true));
            }
            Some("disabled") => {
                template_kwargs.insert("enable_thinking".into(), json!(false));
            }
            Some(_) => {}
            None => return Err(ApiError::missing("thinking.type")),
        }
        show_thinking = t.str("display")? != Some("omitted");
    }
    let structured = match f.object("output_config")? {
        Some(o) => match o.object("format")? {
            Some(format) => match format.str("type")? {
                Some("json_schema") => Some((
                    crate::generation::structured::schema_value(
                        "output_config.format.schema",
                        format
                            .get("schema")
                            .ok_or_else(|| ApiError::missing("output_config.format.schema"))?,
                    )?,
                    "output_config.format".to_string(),
                )),
                Some(other) => {
                    return Err(ApiError::param(
                        "output_config.format.type",
                        format!(
                            "'output_config.format.type' must be \"json_schema\", got {other:?}"
                        ),
                    ))
                }
                None => return Err(ApiError::missing("output_config.format.type")),
            },
            None => None,
        },
        None => None,
    };
    let common = read_sampling(f)?;
    Ok(MessagesRequest {
        messages,
        tools,
        structured,
        show_thinking,
        thinking_budget,
        template_kwargs,
        common,
        model,
    })
}

fn read_message(name: &str, m: &Value, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let Value::Object(map) = m else {
        return Err(ApiError::wrong_type(name, "a message object", m));
    };
    let mf = Fields::nested(map, format!("{name}."));
    let role = mf
        .str("role")?
        .ok_or_else(|| ApiError::missing(&mf.name("role")))?;
    if !matches!(role, "user" | "assistant" | "system") {
        return Err(ApiError::param(
            mf.name("role"),
            format!(
                "'{}' must be \"user\" or \"assistant\", got {role:?}",
                mf.name("role")
            ),
        ));
    }
    let blocks = match mf.get("content") {
        Some(Value::String(s)) => {
            out.push(ChatMessage::new(role, s.clone()));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        Some(v) => {
            return Err(ApiError::wrong_type(
                &mf.name("content"),
                "a string or an array of content blocks",
                v,
            ))
        }
        None => return Err(ApiError::missing(&mf.name("content"))),
    };
    let mut message = ChatMessage::new(role, String::new());
    let mut texts = Vec::new();
    let mut thinking = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bname = format!("{}[{j}]", mf.name("content"));
        let Value::Object(bmap) = b else {
            return Err(ApiError::wrong_type(&bname, "a content block", b));
        };
        let bf = Fields::nested(bmap, format!("{bname}."));
        match bf.str("type")? {
            Some("text") => texts.push(
                bf.str("text")?
                    .ok_or_else(|| ApiError::missing(&bf.name("text")))?
                    .to_string(),
            ),
            Some("thinking") if role == "assistant" => {
                thinking.push(bf.str("thinking")?.unwrap_or("").to_string())
            }
            Some("thinking") | Some("redacted_thinking") => {}
            Some("tool_use") if role == "assistant" => {
                let id = bf.str("id")?.unwrap_or("");
                let tool = bf
                    .str("name")?
                    .ok_or_else(|| ApiError::missing(&bf.name("name")))?;
                let input = match bf.get("input") {
                    None | Some(Value::Null) => json!({}),
                    Some(v) => v.clone(),
                };
                message.tool_calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": tool, "arguments": input},
                }));
            }
            Some("tool_result") if role == "user" => {
                let id = bf
                    .str("tool_use_id")?
                    .ok_or_else(|| ApiError::missing(&bf.name("tool_use_id")))?;
                let content = match bf.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => text_blocks(&bf.name("content"), parts)?,
                    Some(v) => {
                        return Err(ApiError::wrong_type(
                            &bf.name("content"),
                            "a string or an array of text blocks",
                            v,
                        ))
                    }
                };
                let mut result = ChatMessage::new("tool", content);
                result.tool_call_id = Some(id.to_string());
                out.push(result);
            }
            Some(kind @ ("tool_use" | "tool_result")) => {
                return Err(ApiError::param(
                    bf.name("type"),
                    format!("a {kind} block belongs in a message of the other role"),
                ))
            }
            Some("image") | Some("document") => {
                return Err(ApiError::param(
                    bf.name("type"),
                    "image and document blocks are not supported: this model takes text only",
                ))
            }
            Some(other) => {
                return Err(ApiError::param(
                    bf.name("type"),
                    format!("content blocks of type {other:?} are not supported"),
                ))
            }
            None => return Err(ApiError::missing(&bf.name("type"))),
        }
    }
    let has_text = !texts.is_empty();
    message.content = texts.join("\n");
    if !thinking.is_empty() {
        message.reasoning_content = Some(thinking.join("\n"));
    }
    // A user turn of only tool results is those results; an empty text turn is left out.
    if has_text || !message.tool_calls.is_empty() || message.reasoning_content.is_some() {
        out.push(message);
    }
    Ok(())
}

/// The text of blocks `[{"type": "text", "text": ...}]` (other kinds skipped), joined by
/// newlines.
fn text_blocks(name: &str, blocks: &[Value]) -> Result<String, ApiError> {
    let mut texts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bname = format!("{name}[{j}]");
        let Value::Object(map) = b else {
            return Err(ApiError::wrong_type(&bname, "a text block", b));
        };
        let bf = Fields::nested(map, format!("{bname}."));
        if bf.str("type")? == Some("text") {
            texts.push(
                bf.str("text")?
                    .ok_or_else(|| ApiError::missing(&bf.name("text")))?,
            );
        }
    }
    Ok(texts.join("\n"))
}

/// `tools` (custom tools: `name`, `description`, `input_schema`; server tools, which name a
/// `type` of Anthropic's, are left out) and `tool_choice`.
fn read_tools(f: &Fields<'_>) -> Result<Option<ToolRequest>, ApiError> {
    let list = match f.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::wrong_type("tools", "an array of tools", v)),
    };
    let mut tools: Vec<Tool> = Vec::new();
    let mut openai_tools = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let name = format!("tools[{i}]");
        let Value::Object(map) = t else {
            return Err(ApiError::wrong_type(&name, "a tool object", t));
        };
        let tf = Fields::nested(map, format!("{name}."));
        if !matches!(tf.str("type")?, None | Some("custom")) {
            continue;
        }
        let tool = tf
            .str("name")?
            .ok_or_else(|| ApiError::missing(&tf.name("name")))?;
        crate::generation::tools::check_name(&tf.name("name"), tool)?;
        if tools.iter().any(|t| t.name == tool) {
            return Err(ApiError::param(
                tf.name("name"),
                format!("two tools are named {tool:?}"),
            ));
        }
        let schema = match tf.get("input_schema") {
            Some(v @ Value::Object(_)) => v.clone(),
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(v) => {
                return Err(ApiError::wrong_type(
                    &tf.name("input_schema"),
                    "a JSON Schema object",
                    v,
                ))
            }
        };
        let description = tf.str("description")?.map(str::to_string);
        openai_tools.push(json!({
            "type": "function",
            "function": {"name": tool, "description": description, "parameters": schema},
        }));
        tools.push(Tool {
            name: tool.to_string(),
            description,
            parameters: schema,
        });
    }
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::param(
            "tools",
            format!("at most {MAX_TOOLS} tools per request, got {}", tools.len()),
        ));
    }
    let mut parallel = true;
    let choice = match f.object("tool_choice")? {
        None => ToolChoice::Auto,
        Some(c) => {
            parallel = !c.bool("disable_parallel_tool_use")?.unwrap_or(false);
            match c.str("type")? {
                Some("auto") => ToolChoice::Auto,
                Some("any") => ToolChoice::Required,
                Some("none") => ToolChoice::None,
                Some("tool") => {
                    let name = c
                        .str("name")?
                        .ok_or_else(|| ApiError::missing("tool_choice.name"))?;
                    if !tools.iter().any(|t| t.name == name) {
                        return Err(ApiError::param(
                            "tool_choice.name",
                            format!("'tool_choice' names {name:?}, which is not one of 'tools'"),
                        ));
                    }
                    ToolChoice::Named(name.to_string())
                }
                Some(other) => {
                    return Err(ApiError::param(
                        "tool_choice.type",
                        format!(
                            "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\", \
                             got {other:?}"
                        ),
                    ))
                }
                None => return Err(ApiError::missing("tool_choice.type")),
            }
        }
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Ok(None),
            _ => Err(ApiError::param(
                "tool_choice",
                "'tool_choice' asks for a tool call but the request has no 'tools'",
            )),
        };
    }
    Ok(Some(ToolRequest {
        tools,
        tools_json: Value::Array(openai_tools),
        choice,
        parallel,
    }))
}

/// `max_tokens`, `temperature` (Anthropic's range, 0 to 1), `top_p`, `top_k`,
/// `stop_sequences`, `stream`.
fn read_sampling(f: &Fields<'_>) -> Result<Common, ApiError> {
    let stream = f.bool("stream")?.unwrap_or(false);
    let max_tokens = f
        .int("max_tokens", 1, i64::from(u32::MAX))?
        .map(|m| m as usize);
    // Anthropic's temperature range is [0, 1].
    let mut sampling = crate::params::read_temperature_top_p(f, 1.0, 1.0)?;
    if let Some(k) = f.int("top_k", 0, i64::from(u32::MAX))? {
        sampling.top_k = k as usize;
    }
    let stop = match f.get("stop_sequences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => {
            if list.len() > MAX_STOP_STRINGS {
                return Err(ApiError::param(
                    "stop_sequences",
                    format!(
                        "at most {MAX_STOP_STRINGS} stop sequences, got {}",
                        list.len()
                    ),
                ));
            }
            let mut out = Vec::with_capacity(list.len());
            for (i, s) in list.iter().enumerate() {
                match s {
                    Value::String(s) if !s.is_empty() && s.len() <= MAX_STOP_BYTES => {
                        out.push(s.clone())
                    }
                    Value::String(_) => {
                        return Err(ApiError::param(
                            format!("stop_sequences[{i}]"),
                            format!("stop sequences must be 1 to {MAX_STOP_BYTES} bytes"),
                        ))
                    }
                    v => {
                        return Err(ApiError::wrong_type(
                            &format!("stop_sequences[{i}]"),
                            "a string",
                            v,
                        ))
                    }
                }
            }
            out
        }
        Some(v) => {
            return Err(ApiError::wrong_type(
                "stop_sequences",
                "an array of strings",
                v,
            ))
        }
    };
    let mut params = GenerateParams {
        max_tokens: max_tokens.unwrap_or(1),
        sampling,
        stop,
        ..GenerateParams::default()
    };
    crate::params::read_extensions(f, &mut params)?;
    Ok(Common {
        n: 1,
        stream,
        include_usage: true,
        max_tokens,
        top_logprobs: None,
        params,
        explain: false,
    })
}
