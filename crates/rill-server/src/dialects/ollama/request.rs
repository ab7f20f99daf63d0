//! Ollama's `/api/chat` and `/api/generate` bodies read into the internal request: `messages`
//! (with `tool_calls`, `thinking`, tool results), `prompt`/`system`/`raw` for generate, `tools`,
//! `format` (`"json"` or a JSON schema), `think`, `stream` (true by default), and `options`
//! mapped to rill's sampling (`temperature`, `top_k`, `top_p`, `min_p`, `typical_p`,
//! `num_predict`, `stop`, `seed`, `repeat_penalty`, `repeat_last_n`, `presence_penalty`,
//! `frequency_penalty`, `num_ctx`). Options rill has no use for (`num_gpu`, `num_thread`,
//! `mirostat`, ...) and `keep_alive` are ignored.

use rill_constrain::tools::{Tool, ToolChoice};
use rill_constrain::ConstraintSpec;
use rill_engine::GenerateParams;
use rill_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::fields::Fields;
use crate::generation::tools::{check_name, ToolRequest, MAX_TOOLS};
use crate::params::{Common, MAX_STOP_BYTES, MAX_STOP_STRINGS};

/// What `/api/chat` and `/api/generate` share.
pub(crate) struct Shared {
    pub structured: Option<(ConstraintSpec, String)>,
    pub template_kwargs: Map<String, Value>,
    pub common: Common,
    /// `options.num_ctx`: the context this request may use (the server's when larger).
    pub num_ctx: Option<usize>,
    /// `think` as a level: its thinking budget.
    pub thinking_budget: Option<usize>,
}

/// A parsed `/api/chat` body.
pub(crate) struct ChatBody {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<ToolRequest>,
    pub shared: Shared,
}

/// A parsed `/api/generate` body.
pub(crate) struct GenerateBody {
    pub prompt: String,
    pub system: Option<String>,
    /// The prompt as is, without the chat template.
    pub raw: bool,
    pub shared: Shared,
}

pub(crate) fn chat(f: &Fields<'_>) -> Result<ChatBody, ApiError> {
    let list = match f.get("messages") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::wrong_type("messages", "an array of messages", v)),
    };
    let mut messages = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let name = format!("messages[{i}]");
        let Value::Object(map) = m else {
            return Err(ApiError::wrong_type(&name, "a message object", m));
        };
        let mf = Fields::nested(map, format!("{name}."));
        let role = mf
            .str("role")?
            .ok_or_else(|| ApiError::missing(&mf.name("role")))?;
        if !matches!(role, "system" | "user" | "assistant" | "tool") {
            return Err(ApiError::param(
                mf.name("role"),
                format!(
                    "'{}' must be system, user, assistant or tool, got {role:?}",
                    mf.name("role")
                ),
            ));
        }
        if mf.get("images").is_some_and(|v| !v.is_null()) {
            return Err(ApiError::param(
                mf.name("images"),
                "images are not supported: this model takes text only",
            ));
        }
        let mut message = ChatMessage::new(role, mf.str("content")?.unwrap_or(""));
        if role == "assistant" {
            message.reasoning_content = mf.str("thinking")?.map(str::to_string);
            if let Some(calls) = mf.get("tool_calls") {
                let Value::Array(calls) = calls else {
                    return Err(ApiError::wrong_type(
                        &mf.name("tool_calls"),
                        "an array of tool calls",
                        calls,
                    ));
                };
                for (j, c) in calls.iter().enumerate() {
                    let function = c.get("function").unwrap_or(&Value::Null);
                    let Some(fname) = function.get("name").and_then(Value::as_str) else {
                        return Err(ApiError::missing(&format!(
                            "{}[{j}].function.name",
                            mf.name("tool_calls")
                        )));
                    };
                    let arguments = function.get("arguments").cloned().unwrap_or(json!({}));
                    message.tool_calls.push(json!({
                        "id": "", "type": "function",
                        "function": {"name": fname, "arguments": arguments},
                    }));
                }
            }
        }
        if role == "tool" {
            message.tool_call_id = mf.str("tool_name")?.map(str::to_string);
        }
        messages.push(message);
    }
    Ok(ChatBody {
        messages,
        tools: tools(f)?,
        shared: shared(f)?,
    })
}

pub(crate) fn generate(f: &Fields<'_>) -> Result<GenerateBody, ApiError> {
    if f.get("images").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::param(
            "images",
            "images are not supported: this model takes text only",
        ));
    }
    if f.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::param(
            "suffix",
            "'suffix' (fill in the middle) is not supported",
        ));
    }
    Ok(GenerateBody {
        prompt: f.str("prompt")?.unwrap_or("").to_string(),
        system: f.str("system")?.map(str::to_string),
        raw: f.bool("raw")?.unwrap_or(false),
        shared: shared(f)?,
    })
}

/// Ollama's `tools` (OpenAI's shape: `{"type": "function", "function": {...}}`); the model
/// chooses whether to call.
fn tools(f: &Fields<'_>) -> Result<Option<ToolRequest>, ApiError> {
    let list = match f.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) if a.is_empty() => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::wrong_type("tools", "an array of tools", v)),
    };
    if list.len() > MAX_TOOLS {
        return Err(ApiError::param(
            "tools",
            format!("at most {MAX_TOOLS} tools per request, got {}", list.len()),
        ));
    }
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let name = format!("tools[{i}]");
        let Value::Object(map) = t else {
            return Err(ApiError::wrong_type(&name, "a tool object", t));
        };
        let tf = Fields::nested(map, format!("{name}."));
        let func = tf
            .object("function")?
            .ok_or_else(|| ApiError::missing(&tf.name("function")))?;
        let fname = func
            .str("name")?
            .ok_or_else(|| ApiError::missing(&func.name("name")))?;
        check_name(&func.name("name"), fname)?;
        if tools.iter().any(|t| t.name == fname) {
            return Err(ApiError::param(
                func.name("name"),
                format!("two tools are named {fname:?}"),
            ));
        }
        let parameters = match func.get("parameters") {
            Some(v @ Value::Object(_)) => v.clone(),
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(v) => {
                return Err(ApiError::wrong_type(
                    &func.name("parameters"),
                    "a JSON Schema object",
                    v,
                ))
            }
        };
        tools.push(Tool {
            name: fname.to_string(),
            description: func.str("description")?.map(str::to_string),
            parameters,
        });
    }
    let tools_json = Value::Array(
        tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters,
                }})
            })
            .collect(),
    );
    Ok(Some(ToolRequest {
        tools,
        tools_json,
        choice: ToolChoice::Auto,
        parallel: true,
    }))
}

/// `format`, `think`, `stream` and `options`.
fn shared(f: &Fields<'_>) -> Result<Shared, ApiError> {
    let structured = match f.get("format") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "json" => {
            Some((ConstraintSpec::JsonObject, "format".into()))
        }
        Some(Value::String(s)) if s.is_empty() => None,
        Some(v @ Value::Object(_)) => Some((
            crate::generation::structured::schema_value("format", v)?,
            "format".into(),
        )),
        Some(v) => {
            return Err(ApiError::wrong_type(
                "format",
                "\"json\" or a JSON schema object",
                v,
            ))
        }
    };
    let mut template_kwargs = Map::new();
    let mut thinking_budget = None;
    match f.get("think") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => {
            template_kwargs.insert("enable_thinking".into(), json!(b));
        }
        // gpt-oss's levels ("low", "medium", "high"): thinking on.
        Some(Value::String(level)) => {
            template_kwargs.insert("enable_thinking".into(), json!(true));
            thinking_budget = crate::generation::reasoning::effort_budget(level).flatten();
        }
        Some(v) => return Err(ApiError::wrong_type("think", "a boolean or a level", v)),
    }
    let stream = f.bool("stream")?.unwrap_or(true);
    // Ollama's default temperature is 0.8.
    let options = f.object("options")?;
    let mut sampling = match &options {
        Some(o) => crate::params::read_temperature_top_p(o, 0.8, 2.0)?,
        None => crate::params::fresh_sampling(0.8),
    };
    let mut max_tokens = None;
    let mut stop = Vec::new();
    let mut num_ctx = None;
    if let Some(o) = options {
        if let Some(k) = o.int("top_k", -1, i64::from(u32::MAX))? {
            sampling.top_k = k.max(0) as usize;
        }
        if let Some(p) = o.number("min_p", |p| (0.0..=1.0).contains(&p), "in [0, 1]")? {
            sampling.min_p = p as f32;
        }
        if let Some(p) = o.number("typical_p", |p| p > 0.0 && p <= 1.0, "in (0, 1]")? {
            sampling.typical_p = p as f32;
        }
        if let Some(r) = o.number("repeat_penalty", |r| r > 0.0 && r <= 100.0, "in (0, 100]")? {
            sampling.repeat_penalty = r as f32;
        }
        if let Some(n) = o.int("repeat_last_n", -1, i64::from(u32::MAX))? {
            sampling.repeat_last_n = if n < 0 { usize::MAX } else { n as usize };
        }
        for (key, slot) in [
            ("presence_penalty", &mut sampling.presence_penalty),
            ("frequency_penalty", &mut sampling.frequency_penalty),
        ] {
            if let Some(x) = o.number(key, |x| (-2.0..=2.0).contains(&x), "in [-2, 2]")? {
                *slot = x as f32;
            }
        }
        if let Some(v) = o.get("seed") {
            sampling.seed = crate::fields::seed_value("options.seed", v)?;
        }
        // -1: until the model stops (or the context is full); -2: fill the context.
        if let Some(n) = o.int("num_predict", -2, i64::from(u32::MAX))? {
            max_tokens = (n > 0).then_some(n as usize);
        }
        if let Some(n) = o.int("num_ctx", 1, i64::from(u32::MAX))? {
            num_ctx = Some(n as usize);
        }
        match o.get("stop") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) if list.len() <= MAX_STOP_STRINGS => {
                for (i, s) in list.iter().enumerate() {
                    match s {
                        Value::String(s) if !s.is_empty() && s.len() <= MAX_STOP_BYTES => {
                            stop.push(s.clone())
                        }
                        v => {
                            return Err(ApiError::wrong_type(
                                &format!("options.stop[{i}]"),
                                &format!("a string of 1 to {MAX_STOP_BYTES} bytes"),
                                v,
                            ))
                        }
                    }
                }
            }
            Some(Value::Array(list)) => {
                return Err(ApiError::param(
                    "options.stop",
                    format!(
                        "at most {MAX_STOP_STRINGS} stop strings, got {}",
                        list.len()
                    ),
                ))
            }
            Some(v) => {
                return Err(ApiError::wrong_type(
                    "options.stop",
                    "an array of strings",
                    v,
                ))
            }
        }
    }
    Ok(Shared {
        structured,
        template_kwargs,
        num_ctx,
        thinking_budget,
        common: Common {
            n: 1,
            stream,
            include_usage: true,
            max_tokens,
            top_logprobs: None,
            params: GenerateParams {
                max_tokens: max_tokens.unwrap_or(1),
                sampling,
                stop,
                ..GenerateParams::default()
            },
            explain: false,
        },
    })
}
