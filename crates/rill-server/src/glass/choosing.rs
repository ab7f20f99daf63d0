//! rill's glass-box endpoints (docs/glass-box-api.md): the full next-token distribution after
//! a prefix, beam search and speculative decoding with their traces, and the model's shapes and
//! costs. The distribution goes through the serving loop like any request (so it reuses the
//! prefix cache); a beam search runs in the loop's arena a pass per iteration, and a speculative
//! generation on a session of its own, a pass (or a round) per iteration.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::response::Response;
use base64::Engine as _;
use rill_engine::{
    BeamError, BeamParams, DraftSource, EarlyStopping, NgramParams, SpeculativeParams,
    MAX_DRAFT_TOKENS,
};
use rill_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use crate::error::{job_dropped, json_body, ApiError};
use crate::fields::Fields;
use crate::generation::request::{blocking, open_request};
use crate::generation::submit::submit_error;
use crate::glass::common::{
    engine_error, next_logits, read_prompt, token_text, tokens_json, warm_prefix, NextLogits,
};
use crate::params::{parse_common, Endpoint};
use crate::state::State;

type AppState = Arc<State>;

/// Raw candidates listed with their texts by the distribution endpoint: every stage of the
/// viewer keeps the logits' order, so the top of any reshaped distribution is among them.
pub const DISTRIBUTION_TOP: usize = 100;
/// Most tokens a beam search or a speculative generation of the glass-box API may generate.
pub const MAX_BEAM_TOKENS: i64 = 256;
/// Widest beam search of the glass-box API (its tree is drawn whole).
pub const MAX_BEAM_WIDTH: i64 = 16;
pub const MAX_SPECULATIVE_TOKENS: i64 = 512;

/// Sets its flag when dropped: a handler future dropped because its client went away cancels
/// the job it started.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn candidate(tokenizer: &Tokenizer, id: u32) -> Value {
    json!({ "token": id, "text": token_text(tokenizer, id) })
}

// ----- the distribution -----

pub(crate) async fn distribution(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let prompt = read_prompt(&f, &handle).await?;
    if prompt.len() >= info.context {
        return Err(ApiError::param(
            "tokens",
            format!(
                "{} tokens leave no room for a next token in the context of {}",
                prompt.len(),
                info.context
            ),
        ));
    }
    let n = prompt.len();
    let NextLogits {
        logits,
        cached,
        seconds,
    } = next_logits(&handle, prompt).await?;
    let tokenizer = handle.tokenizer();
    let body = blocking(move || {
        let top = top_raw(&logits, DISTRIBUTION_TOP);
        let mut bytes = Vec::with_capacity(logits.len() * 4);
        for l in &logits {
            bytes.extend_from_slice(&l.to_le_bytes());
        }
        Ok(json!({
            "tokens": n,
            "vocab_size": logits.len(),
            "cached_tokens": cached,
            "seconds": seconds,
            "logits": base64::engine::general_purpose::STANDARD.encode(&bytes),
            "top": tokens_json(&tokenizer, &top),
        }))
    })
    .await?;
    Ok(json_body(&body))
}

/// The `n` most likely tokens of softmax(`logits`) with their log-probabilities (ties: lower id
/// first), computed in f64.
fn top_raw(logits: &[f32], n: usize) -> Vec<(u32, f64)> {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return Vec::new();
    }
    let max = f64::from(max);
    let total: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| (f64::from(l) - max).exp())
        .sum();
    let log_z = max + total.ln();
    let mut ids: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| logits[i as usize].is_finite())
        .collect();
    let by = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let n = n.min(ids.len());
    if n < ids.len() {
        ids.select_nth_unstable_by(n, by);
        ids.truncate(n);
    }
    ids.sort_by(by);
    ids.into_iter()
        .map(|i| (i, f64::from(logits[i as usize]) - log_z))
        .collect()
}

// ----- beam search -----

pub(crate) async fn beam(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, _) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let prompt = read_prompt(&f, &handle).await?;
    let early_stopping = match f.str("early_stopping")? {
        None | Some("heuristic") => EarlyStopping::Heuristic,
        Some("finished") => EarlyStopping::Finished,
        Some("never") => EarlyStopping::Never,
        Some(other) => {
            return Err(ApiError::param(
                "early_stopping",
                format!(
                "'early_stopping' must be \"heuristic\", \"finished\" or \"never\", got {other:?}"
            ),
            ))
        }
    };
    let params = BeamParams {
        width: f.int("width", 1, MAX_BEAM_WIDTH)?.unwrap_or(4) as usize,
        max_tokens: f.int("max_tokens", 1, MAX_BEAM_TOKENS)?.unwrap_or(32) as usize,
        length_penalty: f
            .number("length_penalty", |x| x.is_finite(), "(a finite number)")?
            .unwrap_or(1.0),
        early_stopping,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        trace: true,
    };
    let cancelled = Arc::new(AtomicBool::new(false));
    let _guard = CancelOnDrop(cancelled.clone());
    let prompt_len = prompt.len();
    // The prompt comes in as an ordinary request first (chunked between steps); the search
    // then starts from the cache and runs a step of its beams per loop iteration.
    warm_prefix(&handle, &prompt).await?;
    let (_, reply) = handle
        .beam_search(prompt, params, cancelled)
        .map_err(|e| submit_error(Endpoint::Completions, e))?;
    let result = reply.await.map_err(|_| job_dropped())?;
    let out = result.map_err(|e| match e {
        BeamError::Model(_) | BeamError::Kv(_) | BeamError::CacheTooSmall { .. } => {
            ApiError::unavailable(format!("the beam search failed: {e}"), "engine_error")
        }
        BeamError::BadWidth { .. } => ApiError::param("width", e.to_string()),
        BeamError::BadLengthPenalty(_) => ApiError::param("length_penalty", e.to_string()),
        BeamError::NoTokens => ApiError::param("max_tokens", e.to_string()),
        e => ApiError::param("prompt", e.to_string()),
    })?;
    Ok(json_body(&json!({
        "prompt_tokens": prompt_len,
        "width": out.trace.width,
        "length_penalty": out.trace.length_penalty,
        "stop": out.stop,
        "steps": out.steps,
        "forward_passes": out.forward_passes,
        "peak_kv_blocks": out.peak_kv_blocks,
        "prefill_seconds": out.prefill_seconds,
        "search_seconds": out.search_seconds,
        "hypotheses": out.hypotheses,
        "nodes": out.trace.nodes,
    })))
}

// ----- speculative decoding -----

pub(crate) async fn speculative(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let prompt = read_prompt(&f, &handle).await?;
    let n_layers = handle.model_summary().config.n_layers;
    let max_tokens = f
        .int("max_tokens", 1, MAX_SPECULATIVE_TOKENS)?
        .unwrap_or(64) as usize;
    let draft_tokens = f
        .int("draft_tokens", 1, MAX_DRAFT_TOKENS as i64)?
        .unwrap_or(4) as usize;
    let source = match f.str("draft")? {
        None | Some("ngram") => DraftSource::Ngram(NgramParams::default()),
        Some("layers") => {
            if n_layers < 2 {
                return Err(ApiError::param(
                    "draft",
                    "a one-layer model has no shallower layers to draft with",
                ));
            }
            let layers = f
                .int("draft_layers", 1, n_layers as i64 - 1)?
                .map_or(n_layers / 2, |n| n as usize);
            DraftSource::Layers(layers)
        }
        Some("mtp") => DraftSource::Mtp,
        Some(other) => {
            return Err(ApiError::param(
                "draft",
                format!("'draft' must be \"ngram\", \"layers\" or \"mtp\", got {other:?}"),
            ))
        }
    };
    // Every generation field, read and checked as the completions endpoint does; greedy unless
    // a temperature is given (speculation shows best on a greedy, reproducible run).
    let mut params = parse_common(&f, Endpoint::Completions, info.vocab_size)?.params;
    if f.get("temperature").is_none() {
        params.sampling.temperature = 0.0;
    }
    params.max_tokens = max_tokens;
    params.top_logprobs = None;
    let context = info.context;
    if prompt.len() + max_tokens > context {
        return Err(ApiError::param(
            "max_tokens",
            format!(
                "the prompt ({} tokens) plus max_tokens ({max_tokens}) is more than the context of {context} tokens",
                prompt.len()
            ),
        ));
    }
    let spec_params = SpeculativeParams {
        draft_tokens,
        adaptive: f.bool("adaptive")?.unwrap_or(true),
        trace: true,
    };
    let cancelled = Arc::new(AtomicBool::new(false));
    let _guard = CancelOnDrop(cancelled.clone());
    let session_len = (prompt.len() + max_tokens + draft_tokens + 1).min(context);
    let (_, reply) = handle
        .speculative(prompt, source, spec_params, params, session_len, cancelled)
        .map_err(|_| job_dropped())?;
    let result = reply.await.map_err(|_| job_dropped())?;
    let generation = result.map_err(engine_error)?;
    let Some(stats) = generation.speculative.clone() else {
        return Err(ApiError::unavailable(
            "the speculative generation returned no statistics",
            "engine_error",
        ));
    };
    handle.record_speculation(stats.drafted, stats.accepted);
    let tokenizer = handle.tokenizer();
    let rounds: Vec<Value> = stats
        .trace
        .iter()
        .map(|r| {
            json!({
                "position": r.position,
                "drafted": r.drafted.iter().map(|&t| candidate(&tokenizer, t)).collect::<Vec<_>>(),
                "accepted": r.accepted,
                "next": r.next.map(|t| {
                    let mut c = candidate(&tokenizer, t);
                    c["rule"] = json!(if r.corrected { "corrected" } else { "bonus" });
                    c
                }),
                "seconds": r.seconds,
            })
        })
        .collect();
    let mut out = Map::new();
    out.insert("text".into(), json!(generation.text));
    out.insert(
        "tokens".into(),
        json!(generation
            .tokens
            .iter()
            .map(|&t| candidate(&tokenizer, t))
            .collect::<Vec<_>>()),
    );
    out.insert(
        "prompt_tokens".into(),
        json!(generation.prompt_tokens_computed + generation.prompt_tokens_reused),
    );
    out.insert(
        "finish_reason".into(),
        json!(generation.finish_reason.as_str()),
    );
    out.insert(
        "draft".into(),
        json!(format!("{:?}", stats.draft).to_lowercase()),
    );
    out.insert("draft_tokens".into(), json!(stats.draft_tokens));
    out.insert("rounds".into(), json!(rounds));
    // None judged: no rate at all, rather than 0.
    out.insert(
        "acceptance_rate".into(),
        json!((stats.drafted > 0).then(|| stats.acceptance_rate())),
    );
    out.insert("drafted".into(), json!(stats.drafted));
    out.insert("accepted".into(), json!(stats.accepted));
    out.insert("tokens_per_round".into(), json!(stats.tokens_per_round()));
    out.insert(
        "acceptance_by_position".into(),
        json!(stats.acceptance_by_position()),
    );
    out.insert("prefill_seconds".into(), json!(generation.prefill_seconds));
    out.insert("draft_seconds".into(), json!(stats.draft_seconds));
    out.insert("verify_seconds".into(), json!(stats.verify_seconds));
    out.insert("decode_seconds".into(), json!(generation.decode_seconds));
    Ok(json_body(&Value::Object(out)))
}
