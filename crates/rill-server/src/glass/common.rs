//! What the glass-box endpoints share: reading a prompt, listing tokens, the one-token request
//! that computes a context, the logits after a prompt, and bringing a context into the prefix
//! cache.

use rill_engine::serve::{ServeEvent, ServeHandle, ServeRequest, Trace};
use rill_engine::{EngineError, GenerateParams, SamplingParams};
use rill_tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::fields::Fields;
use crate::generation::prompt::{chat_tokens, parse_messages, token_repr};
use crate::generation::request::blocking;
use crate::generation::submit::submit_error;
use crate::params::{token_list, Endpoint};

/// The prompt of a glass-box request: `tokens` (ids), `prompt` (text or ids) or `messages` (chat,
/// with the generation prompt).
pub(crate) async fn read_prompt(
    f: &Fields<'_>,
    handle: &ServeHandle,
) -> Result<Vec<u32>, ApiError> {
    let vocab = handle.model_info().vocab_size;
    let given: Vec<&str> = ["tokens", "prompt", "messages"]
        .into_iter()
        .filter(|k| f.get(k).is_some())
        .collect();
    if given.len() > 1 {
        return Err(ApiError::param(
            given[1],
            format!("give one of 'tokens', 'prompt' and 'messages', not {given:?}"),
        ));
    }
    let tokenizer = handle.tokenizer();
    let tokens = match given.first().copied() {
        None => {
            return Err(ApiError::param(
                "prompt",
                "missing the prompt: give 'tokens', 'prompt' or 'messages'",
            ))
        }
        Some("messages") => {
            let messages = parse_messages(f)?;
            blocking(move || chat_tokens(&tokenizer, &messages, true, true)).await?
        }
        Some(key) => match f.get(key) {
            Some(Value::String(s)) if key == "prompt" => {
                let s = s.clone();
                blocking(move || Ok(tokenizer.encode_with_special(&s, true, true))).await?
            }
            Some(v) => token_list(key, v, vocab, usize::MAX)?,
            None => unreachable!("the key was found above"),
        },
    };
    if tokens.is_empty() {
        return Err(ApiError::param(
            given[0],
            "the prompt is empty: the model needs at least one token",
        ));
    }
    Ok(tokens)
}

/// A token's text, spelled as the generation endpoints spell it.
pub(crate) fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    token_repr(tokenizer, id).0
}

/// A token with its text and log-probability, as the glass-box endpoints list candidates.
pub(crate) fn token_json<L: serde::Serialize>(tokenizer: &Tokenizer, id: u32, logprob: L) -> Value {
    json!({ "token": id, "text": token_text(tokenizer, id), "logprob": logprob })
}

/// [`token_json`] of each `(id, log-probability)`.
pub(crate) fn tokens_json<L: serde::Serialize + Copy>(
    tokenizer: &Tokenizer,
    top: &[(u32, L)],
) -> Vec<Value> {
    top.iter()
        .map(|&(id, lp)| token_json(tokenizer, id, lp))
        .collect()
}

/// One greedy token, end-of-generation included: a request that only computes a context's
/// positions (and the logits after it).
pub(crate) fn one_greedy_token() -> GenerateParams {
    GenerateParams {
        max_tokens: 1,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        ignore_eos: true,
        ..GenerateParams::default()
    }
}

pub(crate) fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::BadParameter(m) => ApiError::invalid(m),
        EngineError::PromptTooLong { prompt, context } => ApiError::param(
            "prompt",
            format!("the prompt has {prompt} tokens but the context holds {context}"),
        ),
        EngineError::EmptyPrompt => ApiError::param("prompt", "the prompt is empty"),
        e => ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("generation failed: {e}"),
        ),
    }
}

/// The raw logits after a prompt, with the prompt tokens that came from the prefix cache and
/// the seconds its prefill took.
pub(crate) struct NextLogits {
    pub logits: Vec<f32>,
    pub cached: usize,
    pub seconds: f64,
}

/// The logits after `prompt`, computed as a one-token request of the serving loop: batched with
/// every other request, its prompt chunked between steps, from the prefix cache.
pub(crate) async fn next_logits(
    handle: &ServeHandle,
    prompt: Vec<u32>,
) -> Result<NextLogits, ApiError> {
    let mut stream = handle
        .submit(ServeRequest {
            prompt,
            params: one_greedy_token(),
            n: 1,
            trace: Trace {
                explain: true,
                full_logits: true,
            },
        })
        .map_err(|e| submit_error(Endpoint::Completions, e))?;
    let mut logits = None;
    let mut cached = 0;
    let mut seconds = 0.0;
    while let Some(event) = stream.recv().await {
        match event {
            ServeEvent::Token { detail, .. } => {
                if let Some(d) = detail {
                    seconds = d.prompt.as_ref().map_or(0.0, |p| p.prefill_seconds);
                    logits = d.logits;
                }
            }
            ServeEvent::Usage {
                cached_prompt_tokens,
                ..
            } => cached = cached_prompt_tokens,
            ServeEvent::Error { message } => {
                return Err(ApiError::unavailable(
                    format!("the distribution could not be computed: {message}"),
                    "engine_error",
                ))
            }
            ServeEvent::Done { .. } => {}
        }
    }
    let logits = logits.ok_or_else(|| {
        ApiError::unavailable(
            "the engine ended the request without logits",
            "engine_error",
        )
    })?;
    Ok(NextLogits {
        logits,
        cached,
        seconds,
    })
}

/// Brings `prompt`'s positions before its last into the prefix cache with an ordinary request
/// (its prompt chunked between steps and batched with everyone's; its partly filled last block
/// published as it ends), so that the lens job after it computes one position and never holds
/// the loop for a whole prefill. Needed only when the lens finds too little of its context
/// cached: a context just generated is there already.
pub(crate) async fn warm_prefix(handle: &ServeHandle, prompt: &[u32]) -> Result<(), ApiError> {
    let block = handle.model_summary().kv_block_size;
    if !handle.config().prefix_caching || prompt.len() <= block + 1 {
        return Ok(());
    }
    let mut stream = handle
        .submit(ServeRequest {
            prompt: prompt[..prompt.len() - 1].to_vec(),
            params: one_greedy_token(),
            n: 1,
            trace: Trace::default(),
        })
        .map_err(|e| submit_error(Endpoint::Completions, e))?;
    while let Some(event) = stream.recv().await {
        if let ServeEvent::Error { message } = event {
            return Err(ApiError::unavailable(
                format!("the lens's context could not be computed: {message}"),
                "engine_error",
            ));
        }
    }
    Ok(())
}
