//! The internal generation request every dialect builds ([`Job`]), submitted to the engine loop
//! as one engine request per prompt, and the engine's refusals as API errors.

use axum::http::StatusCode;
use futures::stream::{BoxStream, SelectAll};
use futures::StreamExt;
use rill_engine::serve::{
    ResponseStream, ServeEvent, ServeHandle, ServeRequest, SubmitError, Trace,
};
use rill_engine::GenerateParams;

use crate::error::ApiError;
use crate::params::{Common, Endpoint};

/// Default `max_tokens` of `/v1/completions` (OpenAI's).
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// What a validated request asks for.
pub(crate) struct Job {
    pub(crate) endpoint: Endpoint,
    /// Token ids of each prompt (one for chat; completions may batch several).
    pub(crate) prompts: Vec<Vec<u32>>,
    /// With `echo`: each prompt's text, put before its completions.
    pub(crate) echo: Option<Vec<String>>,
    pub(crate) common: Common,
    pub(crate) model: String,
    pub(crate) context: usize,
    /// The format tool calls are read in, when the model may call tools.
    pub(crate) tools: Option<rill_constrain::tools::ToolFormat>,
    /// A `max_tokens` past what the context leaves is a cap, not an error (the Messages and
    /// Responses dialects: their clients send 32k-64k whatever the model).
    pub(crate) cap_max_tokens: bool,
}

impl Job {
    pub(crate) fn choices(&self) -> usize {
        self.prompts.len() * self.common.n
    }
}

// ----- submitting -----

/// The request's `max_tokens`, else the endpoint's default for a prompt of `prompt_len`.
pub(crate) fn max_tokens_for(
    endpoint: Endpoint,
    given: Option<usize>,
    context: usize,
    prompt_len: usize,
) -> usize {
    match (given, endpoint) {
        (Some(m), _) => m,
        // OpenAI's chat default: whatever the context leaves.
        (None, Endpoint::Chat) => context.saturating_sub(prompt_len).max(1),
        (None, Endpoint::Completions) => COMPLETIONS_DEFAULT_MAX_TOKENS,
    }
}

pub(crate) fn prompt_param(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "prompt",
    }
}

pub(crate) fn too_long(
    endpoint: Endpoint,
    prompt: usize,
    max_tokens: usize,
    context: usize,
) -> ApiError {
    ApiError::invalid(format!(
        "This model's maximum context length is {context} tokens, but {} tokens were requested: \
         {prompt} in the {} and {max_tokens} for the completion (max_tokens). Shorten the {} or \
         lower max_tokens.",
        prompt.saturating_add(max_tokens),
        prompt_param(endpoint),
        prompt_param(endpoint),
    ))
    .with_param(prompt_param(endpoint))
    .with_code("context_length_exceeded")
}

pub(crate) fn submit_error(endpoint: Endpoint, e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull { retry_after_s } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "The server's request queue is full: retry later",
        )
        .with_code("rate_limit_exceeded")
        .with_retry_after(retry_after_s.max(1)),
        SubmitError::Invalid { param, message } => ApiError::param(param, message),
        SubmitError::PromptTooLong {
            prompt_tokens,
            max_tokens,
            context,
        } => too_long(endpoint, prompt_tokens, max_tokens, context),
        SubmitError::ShuttingDown => {
            ApiError::unavailable("the server is shutting down", "shutting_down")
        }
        e @ SubmitError::NotGenerative { .. } => not_generative(&e),
    }
}

/// A generation request to an encoder (an embedding model): a 400 saying where to go instead.
pub(crate) fn not_generative(e: &SubmitError) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        e.to_string(),
    )
    .with_code("model_not_generative")
}

/// Refuses generation on a model without an output head before anything else is read.
pub(crate) fn check_generative(handle: &ServeHandle) -> Result<(), ApiError> {
    let config = &handle.model_summary().config;
    match config.output_head {
        true => Ok(()),
        false => Err(not_generative(&SubmitError::NotGenerative {
            architecture: config.architecture.name().to_string(),
        })),
    }
}

/// One engine request per prompt; an error drops (cancels) those already submitted.
/// Also returns the parameters the last prompt was submitted with (`max_tokens` resolved).
pub(crate) fn submit(
    handle: &ServeHandle,
    job: &Job,
) -> Result<(Vec<ResponseStream>, GenerateParams), ApiError> {
    let mut streams = Vec::with_capacity(job.prompts.len());
    let mut submitted = job.common.params.clone();
    for prompt in &job.prompts {
        if prompt.is_empty() {
            return Err(ApiError::param(
                prompt_param(job.endpoint),
                format!(
                    "'{}' must not be empty: the model needs at least one token",
                    prompt_param(job.endpoint)
                ),
            ));
        }
        let mut max_tokens = max_tokens_for(
            job.endpoint,
            job.common.max_tokens,
            job.context,
            prompt.len(),
        );
        if job.cap_max_tokens && prompt.len() < job.context {
            max_tokens = max_tokens.min(job.context - prompt.len());
        }
        if prompt.len().saturating_add(max_tokens) > job.context {
            return Err(too_long(
                job.endpoint,
                prompt.len(),
                max_tokens,
                job.context,
            ));
        }
        if job.common.params.min_tokens > max_tokens {
            return Err(ApiError::param(
                "min_tokens",
                format!(
                    "'min_tokens' ({}) must not exceed max_tokens ({max_tokens})",
                    job.common.params.min_tokens
                ),
            ));
        }
        let mut params = job.common.params.clone();
        params.max_tokens = max_tokens;
        submitted.max_tokens = max_tokens;
        let request = ServeRequest {
            prompt: prompt.clone(),
            params,
            n: job.common.n,
            trace: Trace {
                explain: job.common.explain,
                full_logits: false,
            },
        };
        streams.push(
            handle
                .submit(request)
                .map_err(|e| submit_error(job.endpoint, e))?,
        );
    }
    Ok((streams, submitted))
}

/// The events of all of a job's streams, tagged with the prompt's index. Dropping it drops the
/// streams, which cancels their requests.
pub(crate) type Events = SelectAll<BoxStream<'static, (usize, ServeEvent)>>;

pub(crate) fn merge(streams: Vec<ResponseStream>) -> Events {
    futures::stream::select_all(streams.into_iter().enumerate().map(|(i, rs)| {
        futures::stream::unfold(rs, |mut rs| async move {
            let event = rs.recv().await?;
            Some((event, rs))
        })
        .map(move |e| (i, e))
        .boxed()
    }))
}
