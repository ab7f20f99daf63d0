//! `/v1/chat/completions` and `/v1/completions`: requests validated into engine requests,
//! answered whole or streamed as server-sent events in OpenAI's chunk format.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::response::Response;
use rill_engine::serve::ServeHandle;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fields::Fields;
use crate::generation::answer::ReadOptions;
use crate::generation::chat::{prepare, ChatRequest};
use crate::generation::prompt::{parse_messages, parse_prompts, tokenize_prompts};
use crate::generation::receipts::ReceiptDraft;
use crate::generation::request::{blocking, open_request};
use crate::generation::submit::{merge, submit, Job};
use crate::params::{parse_common, token_list, Common, Endpoint, MAX_N};
use crate::request_log::GenerationNote;
use crate::state::State;

pub(crate) mod embeddings;
mod output;
pub(crate) mod render;
mod respond;

use output::Output;
use respond::{collect, sse};

type AppState = Arc<State>;

// ----- chat -----

pub(crate) async fn chat(
    Extract(state): Extract<AppState>,
    axum::Extension(note): axum::Extension<GenerationNote>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let messages = parse_messages(&f)?;
    let agp = f.bool("add_generation_prompt")?.unwrap_or(true);
    let mut common = parse_common(&f, Endpoint::Chat, info.vocab_size)?;
    let tools = crate::generation::tools::parse(&f)?;
    let structured = crate::generation::structured::parse(&f)?;
    let prefix = constraint_prefix(&handle, &f)?;
    if tools.is_none() && structured.is_none() && prefix.is_some() {
        return Err(ApiError::param(
            "constraint_prefix",
            "'constraint_prefix' needs a constraint (response_format, structured_outputs, ...)",
        ));
    }
    let template_kwargs = match f.get("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(v) => {
            return Err(ApiError::wrong_type(
                "chat_template_kwargs",
                "an object of template variables",
                v,
            ))
        }
    };
    // llama.cpp's switch: "none" leaves a reasoning model's thinking in the content.
    let separate_reasoning = match f.str("reasoning_format")? {
        None | Some("auto" | "deepseek" | "parsed") => true,
        Some("none") => false,
        Some(other) => {
            return Err(ApiError::param(
                "reasoning_format",
                format!("'reasoning_format' must be \"auto\" or \"none\", got {other:?}"),
            ))
        }
    };
    let mut template_kwargs = template_kwargs;
    let mut thinking_budget = f
        .int("thinking_budget_tokens", 0, i64::from(u32::MAX))?
        .map(|n| n as usize);
    match f.str("reasoning_effort")? {
        None => {}
        Some("none") => {
            template_kwargs
                .entry("enable_thinking")
                .or_insert(Value::Bool(false));
        }
        Some(effort) => match crate::generation::reasoning::effort_budget(effort) {
            Some(budget) => thinking_budget = thinking_budget.or(budget),
            None => {
                return Err(ApiError::param(
                    "reasoning_effort",
                    format!(
                        "'reasoning_effort' must be none, minimal, low, medium, high, xhigh or \
                         max, got {effort:?}"
                    ),
                ))
            }
        },
    }
    let has_tools = tools.is_some();
    let prepared = prepare(
        &state,
        &handle,
        ChatRequest {
            messages,
            tools,
            structured,
            template_kwargs,
            add_generation_prompt: agp,
            separate_reasoning,
            thinking_budget,
        },
    )
    .await?;
    let mut constraint = prepared.constraint;
    // rill's extension: a branch continues a constrained text after these tokens.
    if let (Some(prefix), Some(grammar), false) = (&prefix, &constraint, has_tools) {
        constraint = Some(grammar.clone().advanced(prefix).map_err(|e| {
            ApiError::param(
                "constraint_prefix",
                format!("'constraint_prefix' does not follow the constraint: {e}"),
            )
        })?);
    }
    common.params.constraint = constraint;
    common.params.thinking_budget = prepared.thinking_budget;
    let job = Job {
        endpoint: Endpoint::Chat,
        prompts: vec![prepared.prompt],
        echo: None,
        common,
        model: info.name,
        context: info.context,
        tools: prepared.tool_format,
        cap_max_tokens: false,
    };
    run(state, handle, job, &prepared.read, note).await
}

/// rill's `constraint_prefix`: token ids a constrained text continues after.
fn constraint_prefix(handle: &ServeHandle, f: &Fields<'_>) -> Result<Option<Vec<u32>>, ApiError> {
    match f.get("constraint_prefix") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => Ok(Some(token_list(
            "constraint_prefix",
            v,
            handle.model_info().vocab_size,
            handle.model_info().context,
        )?)),
    }
}

/// Compiles the request's structured-output constraint, if it asks for one, into its
/// parameters.
async fn constrain(
    state: &AppState,
    handle: &ServeHandle,
    f: &Fields<'_>,
    common: &mut Common,
) -> Result<(), ApiError> {
    let prefix = constraint_prefix(handle, f)?;
    match crate::generation::structured::parse(f)? {
        Some((spec, field)) => {
            let mut grammar =
                crate::generation::structured::compile(state, handle.tokenizer(), spec, field)
                    .await?;
            // rill's extension: a branch continues a constrained text after these tokens.
            if let Some(prefix) = prefix {
                grammar = grammar.advanced(&prefix).map_err(|e| {
                    ApiError::param(
                        "constraint_prefix",
                        format!("'constraint_prefix' does not follow the constraint: {e}"),
                    )
                })?;
            }
            common.params.constraint = Some(grammar);
        }
        None if prefix.is_some() => {
            return Err(ApiError::param(
                "constraint_prefix",
                "'constraint_prefix' needs a constraint (response_format, structured_outputs, ...)",
            ))
        }
        None => {}
    }
    Ok(())
}

// ----- completions -----

pub(crate) async fn completions(
    Extract(state): Extract<AppState>,
    axum::Extension(note): axum::Extension<GenerationNote>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let prompts = parse_prompts(&f, info.vocab_size)?;
    let mut common = parse_common(&f, Endpoint::Completions, info.vocab_size)?;
    constrain(&state, &handle, &f, &mut common).await?;
    if prompts.len() * common.n > MAX_N as usize {
        return Err(ApiError::param(
            "n",
            format!(
                "{} prompts with n = {} ask for {} choices; at most {MAX_N} per request",
                prompts.len(),
                common.n,
                prompts.len() * common.n
            ),
        ));
    }
    let echo = f.bool("echo")?.unwrap_or(false);
    if echo && common.top_logprobs.is_some() {
        return Err(ApiError::param(
            "echo",
            "'echo' together with 'logprobs' is not supported (prompt log-probabilities are not \
             computed)",
        ));
    }
    if let Some(s) = f.str("suffix")? {
        if !s.is_empty() {
            return Err(ApiError::param("suffix", "'suffix' is not supported"));
        }
    }
    if let Some(b) = f.int("best_of", 1, MAX_N)? {
        if b as usize != common.n {
            return Err(ApiError::param(
                "best_of",
                format!(
                    "'best_of' must equal 'n' ({}): choosing the best of several is not supported",
                    common.n
                ),
            ));
        }
    }
    let tokenizer = handle.tokenizer();
    let (prompts, texts) = blocking(move || Ok(tokenize_prompts(&tokenizer, prompts))).await?;
    let echo = echo.then_some(texts);
    let job = Job {
        endpoint: Endpoint::Completions,
        prompts,
        echo,
        common,
        model: info.name,
        context: info.context,
        tools: None,
        cap_max_tokens: false,
    };
    run(state, handle, job, &ReadOptions::text(), note).await
}

async fn run(
    state: AppState,
    handle: ServeHandle,
    job: Job,
    read: &ReadOptions,
    note: GenerationNote,
) -> Result<Response, ApiError> {
    let (streams, params) = submit(&handle, &job)?;
    let mut out = Output::new(&handle, &job, read);
    out.note = Some(note);
    if job.tools.is_none() {
        out.receipt = ReceiptDraft::new(&state, &handle, &out.id, &job.prompts, &params);
    }
    let events = merge(streams);
    if job.common.stream {
        Ok(sse(state, out, events))
    } else {
        collect(state, out, events).await
    }
}
