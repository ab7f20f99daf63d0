//! `/v1/completions/render` and `/v1/chat/completions/render`: a request's prompt as the model
//! would see it (the chat template applied, then tokens) without generating, in vLLM's shape
//! (its `GenerateRequest`), for routers and gateways that tokenize to route by prefix (llm-d
//! reads `token_ids`). Plus sglang's `/server_info` and `/model_info`, which sglang-router reads
//! to learn a worker's model name.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::response::Response;
use serde_json::{json, Value};

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generation::prompt::{
    chat_tokens_with_tools, parse_messages, parse_prompts, tokenize_prompts,
};
use crate::generation::request::request_id;
use crate::generation::request::{blocking, open_request};
use crate::generation::submit::max_tokens_for;
use crate::params::{parse_common, Common, Endpoint};
use crate::state::State;

type AppState = Arc<State>;

/// `POST /v1/chat/completions/render`: one object.
pub(crate) async fn chat(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let messages = parse_messages(&f)?;
    let agp = f.bool("add_generation_prompt")?.unwrap_or(true);
    let common = parse_common(&f, Endpoint::Chat, info.vocab_size)?;
    let tools = crate::generation::tools::parse(&f)?;
    let tokenizer = handle.tokenizer();
    let (format, _) = crate::generation::tools::format_of(&tokenizer);
    // The conversation the template is given, as generation would build it.
    let (messages, template_tools) = match &tools {
        Some(t) if t.active() || format == rill_constrain::tools::ToolFormat::Generic => {
            crate::generation::tools::prompt_messages(messages, t, format)
        }
        _ => (messages, None),
    };
    let ids = blocking(move || {
        chat_tokens_with_tools(&tokenizer, &messages, template_tools.as_ref(), agp, true)
    })
    .await?;
    let model = f.str("model")?.map(str::to_string);
    let max_tokens = max_tokens_for(Endpoint::Chat, common.max_tokens, info.context, ids.len());
    Ok(json_body(&generate_request(
        "chatcmpl", ids, &common, max_tokens, model,
    )))
}

/// `POST /v1/completions/render`: an array, one object per prompt.
pub(crate) async fn completions(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let prompts = parse_prompts(&f, info.vocab_size)?;
    let common = parse_common(&f, Endpoint::Completions, info.vocab_size)?;
    let tokenizer = handle.tokenizer();
    let (ids, _) = blocking(move || Ok(tokenize_prompts(&tokenizer, prompts))).await?;
    let model = f.str("model")?.map(str::to_string);
    let rendered: Vec<Value> = ids
        .into_iter()
        .map(|ids| {
            let max_tokens = max_tokens_for(
                Endpoint::Completions,
                common.max_tokens,
                info.context,
                ids.len(),
            );
            generate_request("cmpl", ids, &common, max_tokens, model.clone())
        })
        .collect();
    Ok(json_body(&Value::Array(rendered)))
}

/// vLLM's `GenerateRequest`: the prompt's ids and the sampling parameters, field for field.
fn generate_request(
    prefix: &str,
    token_ids: Vec<u32>,
    common: &Common,
    max_tokens: usize,
    model: Option<String>,
) -> Value {
    let p = &common.params;
    let s = &p.sampling;
    json!({
        "request_id": request_id(prefix),
        "token_ids": token_ids,
        "features": null,
        "sampling_params": {
            "n": common.n,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "typical_p": s.typical_p,
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "repetition_penalty": s.repeat_penalty,
            "seed": s.seed,
            "stop": p.stop,
            "stop_token_ids": p.stop_token_ids,
            "ignore_eos": p.ignore_eos,
            "max_tokens": max_tokens,
            "min_tokens": p.min_tokens,
            "logprobs": common.top_logprobs,
        },
        "model": model,
        "stream": common.stream,
        "stream_options": if common.stream { json!({ "include_usage": common.include_usage }) } else { Value::Null },
        "cache_salt": null,
        "priority": 0,
        "kv_transfer_params": null,
    })
}

/// sglang's `GET /server_info` (and `/get_server_info`): sglang-router registers a worker's
/// model under `served_model_name`.
pub(crate) async fn server_info(Extract(state): Extract<AppState>) -> Result<Response, ApiError> {
    let handle = state.handle()?;
    let info = handle.model_info();
    let config = handle.config();
    Ok(json_body(&json!({
        "served_model_name": info.name,
        "model_path": info.name,
        "context_length": info.context,
        "max_running_requests": config.max_running,
        "max_queued_requests": config.max_queue,
        "page_size": handle.kv_stats().block_size,
        "version": env!("CARGO_PKG_VERSION"),
        "engine": "rill",
    })))
}

/// sglang's `GET /model_info` (and `/get_model_info`).
pub(crate) async fn model_info(Extract(state): Extract<AppState>) -> Result<Response, ApiError> {
    let handle = state.handle()?;
    let info = handle.model_info();
    Ok(json_body(&json!({
        "model_path": info.name,
        "tokenizer_path": info.name,
        "is_generation": true,
        "max_model_len": info.context,
    })))
}
