//! Ollama's API, for the tools that speak only it (VS Code's Ollama models, Open WebUI, ...):
//! `/api/version`, `/api/tags`, `/api/show`, `/api/ps`, `/api/chat` and `/api/generate` (NDJSON
//! streams by default, `stream: false` whole), with Ollama's error shape (`{"error": "..."}`).
//! Model names resolve as for `/v1/models`, a `:latest` tag accepted. `options.num_ctx` narrows
//! the context a request may use (never past the server's); an answer ends at the context
//! with `done_reason: "length"`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use rill_engine::serve::{ModelInfo, ServeHandle};
use rill_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generation::answer::ReadOptions;
use crate::generation::chat::{prepare, start, ChatRequest, PreparedChat};
use crate::generation::deliver::{collect, stream, Framing};
use crate::generation::embed::{embed as embed_inputs, EmbedInput};
use crate::generation::request::{blocking, read_json};
use crate::request_log::GenerationNote;
use crate::state::State;

mod render;
pub(crate) mod request;

use render::{now_rfc3339, OllamaRender};

type AppState = Arc<State>;

/// The version of Ollama's API this server speaks (clients check it before using newer
/// fields such as `think`).
const API_VERSION: &str = "0.12.0";

/// An error in Ollama's shape.
pub(crate) fn error_response(e: ApiError) -> Response {
    let mut r = (e.status, json_body(&json!({ "error": e.message }))).into_response();
    if let Some(s) = e.retry_after {
        r.headers_mut()
            .insert(axum::http::header::RETRY_AFTER, s.into());
    }
    r
}

fn respond(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(error_response)
}

/// The served name a request's `model` names (a `:latest` tag allowed), or Ollama's 404.
fn check_model(state: &State, map: &Map<String, Value>, served: &str) -> Result<(), ApiError> {
    let name = match map.get("model").or_else(|| map.get("name")) {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) => s.as_str(),
        Some(v) => return Err(ApiError::wrong_type("model", "a string", v)),
    };
    let bare = name.strip_suffix(":latest").unwrap_or(name);
    if bare.is_empty()
        || state.options.accept_any_model
        || crate::options::MODEL_PLACEHOLDERS.contains(&bare)
        || state.serves(bare, served)
    {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("model '{name}' not found (this server serves '{served}')"),
        ))
    }
}

async fn open(
    state: &State,
    body: Body,
) -> Result<(ServeHandle, Map<String, Value>, ModelInfo), ApiError> {
    let handle = state.handle()?;
    let map = read_json(body, state.options.max_body_bytes).await?;
    let info = handle.model_info();
    check_model(state, &map, &info.name)?;
    Ok((handle, map, info))
}

/// The model's description as Ollama lists it.
async fn model_entry(state: &State, handle: &ServeHandle) -> Result<Value, ApiError> {
    let info = handle.model_info();
    let summary = handle.model_summary();
    let identity = state.model_identity(handle).await?;
    let modified = state
        .model_path()
        .and_then(|p| std::fs::metadata(p).ok())
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or_else(now_rfc3339, |d| {
            render::rfc3339(d.as_secs(), d.subsec_nanos())
        });
    let family = format!("{:?}", summary.config.architecture).to_lowercase();
    Ok(json!({
        "name": format!("{}:latest", info.name),
        "model": format!("{}:latest", info.name),
        "modified_at": modified,
        "size": identity.bytes,
        "digest": identity.sha256,
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family],
            "parameter_size": parameter_size(summary.cost.parameters),
            "quantization_level": "",
        },
    }))
}

/// A parameter count as Ollama writes it ("135M", "1.2B").
fn parameter_size(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else {
        format!("{:.0}M", n / 1e6)
    }
}

/// `GET /api/version`.
pub(crate) async fn version() -> Response {
    json_body(&json!({ "version": API_VERSION }))
}

/// `GET /api/tags`: the served model.
pub(crate) async fn tags(Extract(state): Extract<AppState>) -> Response {
    respond(
        async {
            let handle = state.handle()?;
            let entry = model_entry(&state, &handle).await?;
            Ok(json_body(&json!({ "models": [entry] })))
        }
        .await,
    )
}

/// `GET /api/ps`: the served model, loaded.
pub(crate) async fn ps(Extract(state): Extract<AppState>) -> Response {
    respond(
        async {
            let handle = state.handle()?;
            let mut entry = model_entry(&state, &handle).await?;
            entry["expires_at"] = json!("9999-12-31T23:59:59Z");
            entry["size_vram"] = json!(0);
            entry["context_length"] = json!(handle.model_info().context);
            Ok(json_body(&json!({ "models": [entry] })))
        }
        .await,
    )
}

/// `POST /api/show`: the model's details, template and capabilities.
pub(crate) async fn show(Extract(state): Extract<AppState>, body: Body) -> Response {
    respond(
        async {
            let (handle, _, info) = open(&state, body).await?;
            let entry = model_entry(&state, &handle).await?;
            let summary = handle.model_summary();
            let tokenizer = handle.tokenizer();
            let template = tokenizer.chat_template().unwrap_or("").to_string();
            let family = entry["details"]["family"].clone();
            let arch = family.as_str().unwrap_or("").to_string();
            let mut capabilities = vec!["completion"];
            if template.contains("tools") {
                capabilities.push("tools");
            }
            if crate::generation::reasoning::ReasoningSyntax::detect(Some(&template)).is_some() {
                capabilities.push("thinking");
            }
            Ok(json_body(&json!({
                "modelfile": "",
                "parameters": "",
                "template": template,
                "details": entry["details"],
                "model_info": {
                    "general.architecture": arch,
                    "general.parameter_count": summary.cost.parameters,
                    format!("{arch}.context_length"): info.context,
                    format!("{arch}.embedding_length"): summary.config.d_model,
                    format!("{arch}.block_count"): summary.config.n_layers,
                },
                "capabilities": capabilities,
                "modified_at": entry["modified_at"],
            })))
        }
        .await,
    )
}

/// Submits a prepared chat and answers in Ollama's shape.
async fn answer(
    state: AppState,
    handle: ServeHandle,
    info: ModelInfo,
    prepared: PreparedChat,
    shared: request::Shared,
    mut render: OllamaRender,
    note: GenerationNote,
) -> Result<Response, ApiError> {
    let streamed = shared.common.stream;
    let context = shared.num_ctx.map_or(info.context, |n| n.min(info.context));
    let (answer, _) = start(&handle, prepared, shared.common, info.name, context, note)?;
    if streamed {
        return Ok(stream(state, answer, render, Framing::Ndjson));
    }
    let usage = collect(state, answer, &mut render).await?;
    Ok(json_body(&render.last(usage)))
}

fn model_name(map: &Map<String, Value>, info: &ModelInfo) -> String {
    map.get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map_or_else(|| format!("{}:latest", info.name), str::to_string)
}

/// `POST /api/embed`: `input` a string or strings; `truncate` (true: inputs past the context
/// are cut to it); `dimensions`.
pub(crate) async fn embed(Extract(state): Extract<AppState>, body: Body) -> Response {
    respond(
        async {
            let started = std::time::Instant::now();
            let (handle, map, info) = open(&state, body).await?;
            let f = Fields::new(&map);
            let inputs = match f.get("input") {
                Some(Value::String(s)) => vec![EmbedInput::Text(s.clone())],
                Some(Value::Array(a)) => a
                    .iter()
                    .enumerate()
                    .map(|(i, x)| match x {
                        Value::String(s) => Ok(EmbedInput::Text(s.clone())),
                        v => Err(ApiError::wrong_type(&format!("input[{i}]"), "a string", v)),
                    })
                    .collect::<Result<_, _>>()?,
                Some(v) => return Err(ApiError::wrong_type("input", "a string or strings", v)),
                None => return Err(ApiError::missing("input")),
            };
            let truncate = f.bool("truncate")?.unwrap_or(true);
            let dimensions = f
                .int("dimensions", 1, i64::from(u32::MAX))?
                .map(|n| n as usize);
            let embedded = embed_inputs(&handle, inputs, truncate, dimensions, "input").await?;
            let nanos = started.elapsed().as_nanos() as u64;
            Ok(json_body(&json!({
                "model": model_name(&map, &info),
                "embeddings": embedded.vectors,
                "total_duration": nanos,
                "load_duration": 0,
                "prompt_eval_count": embedded.tokens,
            })))
        }
        .await,
    )
}

/// `POST /api/embeddings` (Ollama's older endpoint): `prompt`, one vector.
pub(crate) async fn embeddings(Extract(state): Extract<AppState>, body: Body) -> Response {
    respond(
        async {
            let (handle, map, _) = open(&state, body).await?;
            let f = Fields::new(&map);
            let prompt = f
                .str("prompt")?
                .ok_or_else(|| ApiError::missing("prompt"))?
                .to_string();
            let embedded = embed_inputs(
                &handle,
                vec![EmbedInput::Text(prompt)],
                true,
                None,
                "prompt",
            )
            .await?;
            Ok(json_body(&json!({ "embedding": embedded.vectors[0] })))
        }
        .await,
    )
}

/// The chat request of Ollama's `messages` (or a generate's prompt) and shared fields.
fn chat_request(
    messages: Vec<ChatMessage>,
    tools: Option<crate::generation::tools::ToolRequest>,
    shared: &request::Shared,
) -> ChatRequest {
    ChatRequest {
        messages,
        tools,
        structured: shared.structured.clone(),
        template_kwargs: shared.template_kwargs.clone(),
        add_generation_prompt: true,
        separate_reasoning: true,
        thinking_budget: shared.thinking_budget,
    }
}

/// `POST /api/chat`.
pub(crate) async fn chat(
    Extract(state): Extract<AppState>,
    axum::Extension(note): axum::Extension<GenerationNote>,
    body: Body,
) -> Response {
    respond(
        async {
            let (handle, map, info) = open(&state, body).await?;
            let body = request::chat(&Fields::new(&map))?;
            let model = model_name(&map, &info);
            if body.messages.is_empty() {
                // Ollama's way of loading a model: an empty conversation answers at once.
                return Ok(json_body(&json!({
                    "model": model, "created_at": now_rfc3339(),
                    "message": {"role": "assistant", "content": ""},
                    "done": true, "done_reason": "load",
                })));
            }
            let prepared = prepare(
                &state,
                &handle,
                chat_request(body.messages, body.tools, &body.shared),
            )
            .await?;
            let render =
                OllamaRender::new(render::Endpoint::Chat, model, !body.shared.common.stream);
            answer(state, handle, info, prepared, body.shared, render, note).await
        }
        .await,
    )
}

/// `POST /api/generate`.
pub(crate) async fn generate(
    Extract(state): Extract<AppState>,
    axum::Extension(note): axum::Extension<GenerationNote>,
    body: Body,
) -> Response {
    respond(
        async {
            let (handle, map, info) = open(&state, body).await?;
            let body = request::generate(&Fields::new(&map))?;
            let model = model_name(&map, &info);
            if body.prompt.is_empty() {
                return Ok(json_body(&json!({
                    "model": model, "created_at": now_rfc3339(), "response": "",
                    "done": true, "done_reason": "load",
                })));
            }
            let prepared = if body.raw {
                let tokenizer = handle.tokenizer();
                let prompt = body.prompt.clone();
                let ids = blocking(move || Ok(tokenizer.encode_with_special(&prompt, true, true)))
                    .await?;
                let constraint = match body.shared.structured.clone() {
                    Some((spec, field)) => Some(
                        crate::generation::structured::compile(
                            &state,
                            handle.tokenizer(),
                            spec,
                            field,
                        )
                        .await?,
                    ),
                    None => None,
                };
                PreparedChat {
                    prompt: ids,
                    constraint,
                    tool_format: None,
                    read: ReadOptions::text(),
                    thinking_budget: None,
                }
            } else {
                let mut messages = Vec::new();
                if let Some(system) = &body.system {
                    messages.push(ChatMessage::new("system", system.clone()));
                }
                messages.push(ChatMessage::new("user", body.prompt.clone()));
                prepare(&state, &handle, chat_request(messages, None, &body.shared)).await?
            };
            let render = OllamaRender::new(
                render::Endpoint::Generate,
                model,
                !body.shared.common.stream,
            );
            answer(state, handle, info, prepared, body.shared, render, note).await
        }
        .await,
    )
}
