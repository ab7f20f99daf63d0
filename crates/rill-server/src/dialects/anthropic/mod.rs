//! Anthropic's Messages API: `POST /v1/messages` (whole, or streamed in Anthropic's event
//! sequence) and `POST /v1/messages/count_tokens`, with Anthropic's error shape
//! (`{"type": "error", "error": {"type", "message"}}`). The thinking of reasoning models comes
//! back as `thinking` blocks, calls as `tool_use` blocks. A `max_tokens` past what the context
//! leaves is a cap: the answer ends at the context with `stop_reason: "max_tokens"`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generation::chat::{prepare, prompt_only, start, ChatRequest};
use crate::generation::deliver::{stream, Framing, Tracker};
use crate::generation::request::{open_request, request_id};
use crate::request_log::GenerationNote;
use crate::state::State;

mod render;
pub(crate) mod request;

type AppState = Arc<State>;

/// An error in Anthropic's shape.
pub(crate) fn error_response(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    let mut response = (
        e.status,
        json_body(&json!({"type": "error", "error": {"type": kind, "message": e.message}})),
    )
        .into_response();
    if let Some(s) = e.retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    response
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    Extract(state): Extract<AppState>,
    axum::Extension(note): axum::Extension<GenerationNote>,
    body: Body,
) -> Response {
    match create(state, note, body).await {
        Ok(r) => r,
        Err(e) => error_response(e),
    }
}

async fn create(state: AppState, note: GenerationNote, body: Body) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let request = request::parse(&Fields::new(&map))?;
    let prepared = prepare(
        &state,
        &handle,
        ChatRequest {
            messages: request.messages,
            tools: request.tools,
            structured: request.structured,
            template_kwargs: request.template_kwargs,
            add_generation_prompt: true,
            separate_reasoning: true,
            thinking_budget: request.thinking_budget,
        },
    )
    .await?;
    let show_thinking = request.show_thinking;
    let stream_it = request.common.stream;
    let (answer, prompt_tokens) = start(
        &handle,
        prepared,
        request.common,
        info.name.clone(),
        info.context,
        note,
    )?;
    let id = request_id("msg");
    let model = request.model.filter(|m| !m.is_empty()).unwrap_or(info.name);
    if stream_it {
        let render = render::MessagesStream::new(id, model, prompt_tokens, show_thinking);
        return Ok(stream(state, answer, render, Framing::ServerSentEvents));
    }
    let mut tracker = Tracker::new(state, false);
    let whole = answer.whole().await?;
    tracker.finish();
    Ok(json_body(&render::message(
        &id,
        &model,
        &whole,
        show_thinking,
    )))
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as the model would see it.
pub(crate) async fn count_tokens(Extract(state): Extract<AppState>, body: Body) -> Response {
    let result = async {
        let (handle, map, _) = open_request(&state, body).await?;
        let request = request::parse(&Fields::new(&map))?;
        let prompt = prompt_only(
            &handle,
            ChatRequest {
                messages: request.messages,
                tools: request.tools,
                structured: None,
                template_kwargs: request.template_kwargs,
                add_generation_prompt: true,
                separate_reasoning: true,
                thinking_budget: None,
            },
        )
        .await?;
        Ok::<_, ApiError>(json_body(&json!({ "input_tokens": prompt.len() })))
    }
    .await;
    result.unwrap_or_else(error_response)
}
