//! A Responses request read into the internal chat request: `instructions`, `input` (a string,
//! or items: messages with `input_text`/`output_text` parts, `function_call`,
//! `function_call_output`, `custom_tool_call(_output)`, `reasoning`), `tools` (function tools,
//! namespaces of them, custom tools; hosted tools such as `web_search` are left out, as a
//! local model cannot run them) and `tool_choice`, `parallel_tool_calls`, `text.format`,
//! `max_output_tokens`, `temperature`/`top_p`, `reasoning`, `stream`, `store`,
//! `previous_response_id`. Fields with no meaning here (`include`, `prompt_cache_key`,
//! `metadata`, `truncation`, `service_tier`, `user`, ...) are ignored, never refused.

use std::collections::BTreeMap;

use rill_constrain::tools::{Tool, ToolChoice};
use rill_constrain::ConstraintSpec;
use rill_engine::GenerateParams;
use rill_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::fields::Fields;
use crate::generation::tools::{check_name, ToolRequest, MAX_TOOLS};
use crate::params::Common;

/// How a tool the model sees maps back to what the client declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeclaredTool {
    /// A function tool (in `namespace`, when it came in one).
    Function {
        name: String,
        namespace: Option<String>,
    },
    /// A custom tool: free-form text input, given to the model as one string argument.
    Custom { name: String },
}

/// A parsed Responses request.
pub(crate) struct ResponsesRequest {
    /// The conversation this request adds (after a previous response's, if any).
    pub input: Vec<ChatMessage>,
    pub instructions: Option<String>,
    pub tools: Option<ToolRequest>,
    /// Model-facing tool name -> the declared tool.
    pub declared: BTreeMap<String, DeclaredTool>,
    pub structured: Option<(ConstraintSpec, String)>,
    pub template_kwargs: Map<String, Value>,
    /// `reasoning.effort` as a thinking budget.
    pub thinking_budget: Option<usize>,
    pub common: Common,
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// The request's fields echoed in the response object.
    pub echo: Map<String, Value>,
}

pub(crate) fn parse(f: &Fields<'_>) -> Result<ResponsesRequest, ApiError> {
    let instructions = f.str("instructions")?.map(str::to_string);
    let input = match f.get("input") {
        Some(Value::String(s)) => vec![ChatMessage::new("user", s.clone())],
        Some(Value::Array(items)) => read_items(items)?,
        Some(v) => {
            return Err(ApiError::wrong_type(
                "input",
                "a string or an array of input items",
                v,
            ))
        }
        None => return Err(ApiError::missing("input")),
    };
    let (tools, declared) = read_tools(f)?;
    let structured = match f.object("text")? {
        Some(t) => match t.object("format")? {
            Some(format) => match format.str("type")? {
                None | Some("text") => None,
                Some("json_object") => Some((ConstraintSpec::JsonObject, "text.format".into())),
                Some("json_schema") => Some((
                    crate::generation::structured::schema_value(
                        "text.format.schema",
                        format
                            .get("schema")
                            .ok_or_else(|| ApiError::missing("text.format.schema"))?,
                    )?,
                    "text.format".into(),
                )),
                Some(other) => {
                    return Err(ApiError::param(
                        "text.format.type",
                        format!(
                            "'text.format.type' must be \"text\", \"json_object\" or \
                             \"json_schema\", got {other:?}"
                        ),
                    ))
                }
            },
            None => None,
        },
        None => None,
    };
    let mut template_kwargs = Map::new();
    let mut thinking_budget = None;
    if let Some(r) = f.object("reasoning")? {
        // `effort: "none"` turns a reasoning model's thinking off; any other effort on, with
        // the effort's budget.
        match r.str("effort")? {
            Some("none") => {
                template_kwargs.insert("enable_thinking".into(), json!(false));
            }
            Some(effort) => {
                template_kwargs.insert("enable_thinking".into(), json!(true));
                thinking_budget = crate::generation::reasoning::effort_budget(effort).flatten();
            }
            None => {}
        }
    }
    if let Some(Value::Object(kwargs)) = f.get("chat_template_kwargs") {
        template_kwargs.extend(kwargs.clone());
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let max_tokens = f
        .int("max_output_tokens", 1, i64::from(u32::MAX))?
        .map(|m| m as usize);
    let sampling = crate::params::read_temperature_top_p(f, 1.0, 2.0)?;
    let mut echo = Map::new();
    for key in [
        "instructions",
        "max_output_tokens",
        "metadata",
        "previous_response_id",
        "temperature",
        "top_p",
        "user",
    ] {
        echo.insert(key.into(), f.get(key).cloned().unwrap_or(Value::Null));
    }
    echo.insert(
        "tool_choice".into(),
        f.get("tool_choice").cloned().unwrap_or(json!("auto")),
    );
    echo.insert("tools".into(), f.get("tools").cloned().unwrap_or(json!([])));
    echo.insert(
        "parallel_tool_calls".into(),
        json!(f.bool("parallel_tool_calls")?.unwrap_or(true)),
    );
    echo.insert(
        "text".into(),
        f.get("text")
            .cloned()
            .unwrap_or(json!({"format": {"type": "text"}})),
    );
    echo.insert(
        "reasoning".into(),
        f.get("reasoning")
            .cloned()
            .unwrap_or(json!({"effort": null, "summary": null})),
    );
    let store = f.bool("store")?.unwrap_or(true);
    let mut params = GenerateParams {
        max_tokens: max_tokens.unwrap_or(1),
        sampling,
        ..GenerateParams::default()
    };
    crate::params::read_extensions(f, &mut params)?;
    echo.insert("store".into(), json!(store));
    Ok(ResponsesRequest {
        input,
        instructions,
        tools,
        declared,
        structured,
        template_kwargs,
        thinking_budget,
        common: Common {
            n: 1,
            stream,
            include_usage: true,
            max_tokens,
            top_logprobs: None,
            params,
            explain: false,
        },
        store,
        previous_response_id: f.str("previous_response_id")?.map(str::to_string),
        echo,
    })
}

/// The text of an item's `content`: a string, or parts of type `input_text`, `output_text`,
/// `text`, `refusal` (joined by newlines).
fn content_text(name: &str, v: Option<&Value>) -> Result<String, ApiError> {
    let parts = match v {
        None | Some(Value::Null) => return Ok(String::new()),
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(parts)) => parts,
        Some(v) => {
            return Err(ApiError::wrong_type(
                name,
                "a string or an array of content parts",
                v,
            ))
        }
    };
    let mut texts = Vec::new();
    for (j, p) in parts.iter().enumerate() {
        let pname = format!("{name}[{j}]");
        let Value::Object(map) = p else {
            return Err(ApiError::wrong_type(&pname, "a content part", p));
        };
        let pf = Fields::nested(map, format!("{pname}."));
        match pf.str("type")? {
            Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
                texts.push(pf.str("text")?.unwrap_or("").to_string())
            }
            Some("refusal") => texts.push(pf.str("refusal")?.unwrap_or("").to_string()),
            Some("input_image" | "input_file" | "input_audio") => {
                return Err(ApiError::param(
                    pf.name("type"),
                    "image, file and audio inputs are not supported: this model takes text only",
                ))
            }
            _ => {}
        }
    }
    Ok(texts.join("\n"))
}

/// Input items as chat messages: calls join the assistant turn before them, outputs become
/// tool messages, reasoning joins the next assistant turn.
fn read_items(items: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out: Vec<ChatMessage> = Vec::new();
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let name = format!("input[{i}]");
        let Value::Object(map) = item else {
            return Err(ApiError::wrong_type(&name, "an input item object", item));
        };
        let it = Fields::nested(map, format!("{name}."));
        let kind = match it.str("type")? {
            Some(k) => k,
            None if it.get("role").is_some() => "message",
            None => return Err(ApiError::missing(&it.name("type"))),
        };
        match kind {
            "message" => {
                let role = it
                    .str("role")?
                    .ok_or_else(|| ApiError::missing(&it.name("role")))?;
                let role = match role {
                    "user" | "assistant" | "system" => role,
                    "developer" => "system",
                    other => {
                        return Err(ApiError::param(
                            it.name("role"),
                            format!(
                                "'{}' must be user, assistant, system or developer, got {other:?}",
                                it.name("role")
                            ),
                        ))
                    }
                };
                let mut m =
                    ChatMessage::new(role, content_text(&it.name("content"), it.get("content"))?);
                if role == "assistant" {
                    m.reasoning_content = reasoning.take();
                }
                out.push(m);
            }
            "function_call" | "custom_tool_call" => {
                let fname = it
                    .str("name")?
                    .ok_or_else(|| ApiError::missing(&it.name("name")))?;
                let fname = match it.str("namespace")? {
                    Some(ns) => format!("{ns}.{fname}"),
                    None => fname.to_string(),
                };
                let call_id = it.str("call_id")?.unwrap_or("").to_string();
                let arguments = if kind == "custom_tool_call" {
                    json!({ "input": it.str("input")?.unwrap_or("") })
                } else {
                    match it.str("arguments")? {
                        Some(a) => serde_json::from_str::<Value>(a)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| Value::String(a.to_string())),
                        None => json!({}),
                    }
                };
                let call = json!({
                    "id": call_id, "type": "function",
                    "function": {"name": fname, "arguments": arguments},
                });
                match out.last_mut() {
                    Some(m) if m.role == "assistant" => m.tool_calls.push(call),
                    _ => {
                        let mut m = ChatMessage::new("assistant", "");
                        m.reasoning_content = reasoning.take();
                        m.tool_calls.push(call);
                        out.push(m);
                    }
                }
            }
            "function_call_output" | "custom_tool_call_output" => {
                let call_id = it
                    .str("call_id")?
                    .ok_or_else(|| ApiError::missing(&it.name("call_id")))?;
                let mut m =
                    ChatMessage::new("tool", content_text(&it.name("output"), it.get("output"))?);
                m.tool_call_id = Some(call_id.to_string());
                out.push(m);
            }
            "reasoning" => {
                let mut text = content_text(&it.name("content"), it.get("content"))?;
                if text.is_empty() {
                    text = content_text(&it.name("summary"), it.get("summary"))?;
                }
                if !text.is_empty() {
                    reasoning = Some(text);
                }
            }
            // Items of hosted tools and references this server has no use for.
            _ => {}
        }
    }
    Ok(out)
}

/// `tools` as the model sees them (namespaced functions as `namespace.name`, custom tools as
/// functions of one string `input`), `tool_choice` and `parallel_tool_calls`.
fn read_tools(
    f: &Fields<'_>,
) -> Result<(Option<ToolRequest>, BTreeMap<String, DeclaredTool>), ApiError> {
    let mut declared = BTreeMap::new();
    let list = match f.get("tools") {
        None | Some(Value::Null) => return Ok((None, declared)),
        Some(Value::Array(a)) => a,
        Some(v) => return Err(ApiError::wrong_type("tools", "an array of tools", v)),
    };
    let mut tools: Vec<Tool> = Vec::new();
    let mut add = |field: &str,
                   model_name: String,
                   tool: DeclaredTool,
                   description: Option<String>,
                   parameters: Value|
     -> Result<(), ApiError> {
        check_name(field, &model_name)?;
        if declared.contains_key(&model_name) {
            return Err(ApiError::param(
                field.to_string(),
                format!("two tools are named {model_name:?}"),
            ));
        }
        declared.insert(model_name.clone(), tool);
        tools.push(Tool {
            name: model_name,
            description,
            parameters,
        });
        Ok(())
    };
    for (i, t) in list.iter().enumerate() {
        let name = format!("tools[{i}]");
        let Value::Object(map) = t else {
            return Err(ApiError::wrong_type(&name, "a tool object", t));
        };
        let tf = Fields::nested(map, format!("{name}."));
        match tf.str("type")? {
            Some("function") => {
                let (n, d, p) = function(&tf)?;
                let tool = DeclaredTool::Function {
                    name: n.clone(),
                    namespace: None,
                };
                add(&tf.name("name"), n, tool, d, p)?;
            }
            Some("namespace") => {
                let ns = tf
                    .str("name")?
                    .ok_or_else(|| ApiError::missing(&tf.name("name")))?;
                if let Some(Value::Array(inner)) = tf.get("tools") {
                    for (j, t) in inner.iter().enumerate() {
                        let Value::Object(m) = t else { continue };
                        let inf = Fields::nested(m, format!("{}[{j}].", tf.name("tools")));
                        if inf.str("type")? != Some("function") {
                            continue;
                        }
                        let (n, d, p) = function(&inf)?;
                        let tool = DeclaredTool::Function {
                            name: n.clone(),
                            namespace: Some(ns.to_string()),
                        };
                        add(&inf.name("name"), format!("{ns}.{n}"), tool, d, p)?;
                    }
                }
            }
            Some("custom") => {
                let n = tf
                    .str("name")?
                    .ok_or_else(|| ApiError::missing(&tf.name("name")))?
                    .to_string();
                let d = tf.str("description")?.map(str::to_string);
                let p = json!({
                    "type": "object",
                    "properties": {"input": {"type": "string"}},
                    "required": ["input"],
                });
                add(
                    &tf.name("name"),
                    n.clone(),
                    DeclaredTool::Custom { name: n },
                    d,
                    p,
                )?;
            }
            // Hosted tools (web_search, file_search, code_interpreter, ...): not run here.
            _ => {}
        }
    }
    if tools.len() > MAX_TOOLS {
        return Err(ApiError::param(
            "tools",
            format!("at most {MAX_TOOLS} tools per request, got {}", tools.len()),
        ));
    }
    let choice = match f.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!(
                        "'tool_choice' must be \"auto\", \"none\", \"required\" or a tool, got \
                         {other:?}"
                    ),
                ))
            }
        },
        Some(Value::Object(map)) => {
            let cf = Fields::nested(map, "tool_choice.".into());
            match (cf.str("type")?, cf.str("name")?) {
                (Some("function" | "custom"), Some(name)) => {
                    if !declared.contains_key(name) {
                        return Err(ApiError::param(
                            "tool_choice.name",
                            format!("'tool_choice' names {name:?}, which is not one of 'tools'"),
                        ));
                    }
                    ToolChoice::Named(name.to_string())
                }
                // Hosted tools and allowed-tools lists: the model chooses.
                _ => ToolChoice::Auto,
            }
        }
        Some(v) => {
            return Err(ApiError::wrong_type(
                "tool_choice",
                "a string or an object",
                v,
            ))
        }
    };
    if tools.is_empty() {
        return match choice {
            ToolChoice::Auto | ToolChoice::None => Ok((None, declared)),
            _ => Err(ApiError::param(
                "tool_choice",
                "'tool_choice' asks for a tool call but the request has no function tools",
            )),
        };
    }
    let tools_json = tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.parameters,
            }})
        })
        .collect();
    Ok((
        Some(ToolRequest {
            tools,
            tools_json: Value::Array(tools_json),
            choice,
            parallel: f.bool("parallel_tool_calls")?.unwrap_or(true),
        }),
        declared,
    ))
}

/// A function tool's name, description and parameters (Responses puts them on the tool).
fn function(tf: &Fields<'_>) -> Result<(String, Option<String>, Value), ApiError> {
    let name = tf
        .str("name")?
        .ok_or_else(|| ApiError::missing(&tf.name("name")))?;
    let parameters = match tf.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(v) => {
            return Err(ApiError::wrong_type(
                &tf.name("parameters"),
                "a JSON Schema object",
                v,
            ))
        }
    };
    Ok((
        name.to_string(),
        tf.str("description")?.map(str::to_string),
        parameters,
    ))
}
