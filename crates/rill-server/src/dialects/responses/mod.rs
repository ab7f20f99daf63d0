//! OpenAI's Responses API: `POST /v1/responses` (whole, or streamed as Responses events),
//! `GET /v1/responses/ID` and `DELETE /v1/responses/ID` for stored responses. Errors keep
//! OpenAI's shape. Reasoning models' thinking comes back as `reasoning` items, calls as
//! `function_call` (or `custom_tool_call`) items. A `max_output_tokens` past what the context
//! leaves is a cap (the response is `incomplete`, reason `max_output_tokens`). Responses are
//! stored (unless `store: false`) in a bounded in-memory store ([`crate::stored_responses`]), so
//! `previous_response_id` continues a conversation; an unknown or expired id is a 404.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::Response;
use rill_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generation::chat::{prepare, start, ChatRequest};
use crate::generation::deliver::{collect, stream, Framing};
use crate::generation::request::{open_request, request_id, unix_time};
use crate::request_log::GenerationNote;
use crate::state::State;
use crate::stored_responses::StoredResponse;

pub(crate) mod render;
pub(crate) mod request;

use render::ResponsesRender;

type AppState = Arc<State>;

fn not_found(id: &str, param: Option<&str>) -> ApiError {
    let e = ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("No response with id '{id}' is stored here (responses are kept for an hour, the newest 256)"),
    )
    .with_code(if param.is_some() {
        "previous_response_not_found"
    } else {
        "response_not_found"
    });
    match param {
        Some(p) => e.with_param(p),
        None => e,
    }
}

/// `POST /v1/responses`.
pub(crate) async fn create(
    Extract(state): Extract<AppState>,
    axum::Extension(note): axum::Extension<GenerationNote>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let request = request::parse(&Fields::new(&map))?;
    let mut conversation: Vec<ChatMessage> = Vec::new();
    if let Some(prev) = &request.previous_response_id {
        let stored = state
            .responses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(prev)
            .ok_or_else(|| not_found(prev, Some("previous_response_id")))?;
        conversation = stored.conversation;
    }
    conversation.extend(request.input);
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = &request.instructions {
        messages.push(ChatMessage::new("system", i.clone()));
    }
    messages.extend(conversation.iter().cloned());
    let prepared = prepare(
        &state,
        &handle,
        ChatRequest {
            messages,
            tools: request.tools,
            structured: request.structured,
            template_kwargs: request.template_kwargs,
            add_generation_prompt: true,
            separate_reasoning: true,
            thinking_budget: request.thinking_budget,
        },
    )
    .await
    .map_err(|e| match e.param.as_deref() {
        Some("messages") => e.with_param("input"),
        _ => e,
    })?;
    let streamed = request.common.stream;
    let (answer, _) = start(
        &handle,
        prepared,
        request.common,
        info.name.clone(),
        info.context,
        note,
    )
    .map_err(|e| match e.param.as_deref() {
        Some("messages") => e.with_param("input"),
        _ => e,
    })?;
    let id = request_id("resp");
    let mut base = request.echo;
    base.insert("id".into(), json!(id));
    base.insert("object".into(), json!("response"));
    base.insert("created_at".into(), json!(unix_time()));
    base.insert(
        "model".into(),
        json!(map
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&info.name)),
    );
    let store = request.store.then(|| {
        let state = state.clone();
        let id = id.clone();
        Box::new(move |response: &Value| {
            let mut conversation = conversation;
            conversation.extend(assistant_turn(response));
            state
                .responses
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(
                    id,
                    StoredResponse {
                        conversation,
                        response: response.clone(),
                    },
                );
        }) as render::OnEnd
    });
    let mut render = ResponsesRender::new(base, request.declared, store);
    if streamed {
        return Ok(stream(state, answer, render, Framing::ServerSentEvents));
    }
    // Whole: the same renderer, its frames dropped, gives the response object.
    let usage = collect(state, answer, &mut render).await?;
    Ok(json_body(&render.whole(usage)))
}

/// The assistant turn a response's output adds to the conversation.
fn assistant_turn(response: &Value) -> Option<ChatMessage> {
    let mut m = ChatMessage::new("assistant", "");
    let mut texts = Vec::new();
    for item in response["output"].as_array()? {
        match item["type"].as_str() {
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    if let Some(t) = part["text"].as_str() {
                        texts.push(t.to_string());
                    }
                }
            }
            Some("reasoning") => {
                let text: Vec<&str> = (item["content"].as_array().into_iter().flatten())
                    .filter_map(|p| p["text"].as_str())
                    .collect();
                m.reasoning_content = Some(text.join("\n"));
            }
            Some("function_call") => {
                let name = match (item["namespace"].as_str(), item["name"].as_str()) {
                    (Some(ns), Some(n)) => format!("{ns}.{n}"),
                    (_, n) => n.unwrap_or("").to_string(),
                };
                let arguments = item["arguments"].as_str().unwrap_or("{}");
                let arguments = serde_json::from_str::<Value>(arguments)
                    .unwrap_or_else(|_| Value::String(arguments.to_string()));
                m.tool_calls
                    .push(json!({"id": item["call_id"], "type": "function",
                    "function": {"name": name, "arguments": arguments}}));
            }
            Some("custom_tool_call") => {
                m.tool_calls
                    .push(json!({"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": {"input": item["input"]}}}));
            }
            _ => {}
        }
    }
    m.content = texts.join("\n");
    Some(m)
}

/// `GET /v1/responses/ID`: a stored response.
pub(crate) async fn get(
    Extract(state): Extract<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.handle()?;
    let stored = state
        .responses
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .ok_or_else(|| not_found(&id, None))?;
    Ok(json_body(&stored.response))
}

/// `DELETE /v1/responses/ID`.
pub(crate) async fn delete(
    Extract(state): Extract<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.handle()?;
    let removed = state
        .responses
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);
    if !removed {
        return Err(not_found(&id, None));
    }
    let mut body = Map::new();
    body.insert("id".into(), json!(id));
    body.insert("object".into(), json!("response"));
    body.insert("deleted".into(), json!(true));
    Ok(json_body(&Value::Object(body)))
}
