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
use rill_engine::serve::{ServeEvent, ServeHandle, ServeRequest, Trace};
use rill_engine::{
    BeamError, BeamParams, DraftSource, EarlyStopping, EngineError, GenerateParams, NgramParams,
    SamplingParams, SpeculativeParams, MAX_DRAFT_TOKENS,
};
use rill_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generate::{chat_tokens, parse_messages, submit_error, token_repr};
use crate::params::token_list;
use crate::params::{parse_common, Endpoint};
use crate::routes::{blocking, open_request};
use crate::State;

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

fn candidate(tokenizer: &Tokenizer, id: u32) -> Value {
    json!({ "token": id, "text": token_text(tokenizer, id) })
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

pub(crate) fn job_dropped() -> ApiError {
    ApiError::unavailable("the server shut down before the job ran", "shutting_down")
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
    crate::layers::warm_prefix(&handle, &prompt).await?;
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
        adaptive: f.bool("adaptive")?.unwrap_or(false),
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

// ----- the model -----

pub(crate) async fn model(Extract(state): Extract<AppState>) -> Result<Response, ApiError> {
    let handle = state.handle()?;
    let info = handle.model_info();
    let s = handle.model_summary();
    let c = &s.config;
    let capacity = rill_engine::kv_capacity(c, s.kv_types, handle.config());
    Ok(json_body(&json!({
        "name": info.name,
        "architecture": format!("{:?}", c.architecture).to_lowercase(),
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "head_dims": c.layer_attention.iter().map(|a| a.head_dim).collect::<Vec<_>>(),
        "kv_source": c.kv_source,
        "d_model": c.d_model,
        "d_ff": c.ffn_dim,
        "vocab_size": c.vocab_size,
        "context": info.context,
        "trained_context": c.context_length,
        "sliding_window": c.sliding_window,
        "sliding_layers": c.layer_is_sliding.iter().filter(|&&s| s).count(),
        "parameters": s.cost.parameters,
        "weight_bytes": s.cost.weight_bytes_per_token,
        "flops_per_token": s.cost.flops_per_token,
        "attention_flops_per_position": s.cost.attention_flops_per_position,
        "kv_bytes_per_token": s.kv_bytes_per_token,
        "kv_context_bytes_per_token": s.kv_context_bytes_per_token,
        "kv_block_size": s.kv_block_size,
        "kv_blocks_total": s.kv_blocks_total,
        "kv_window_blocks_total": s.kv_window_blocks_total,
        "layer_kinds": c.layer_kinds.iter().map(|k| match k {
            rill_model::LayerKind::Attention => "attention",
            rill_model::LayerKind::DeltaNet => "gated_deltanet",
            rill_model::LayerKind::ShortConv => "short_conv",
            rill_model::LayerKind::Mamba2 => "mamba2",
        }).collect::<Vec<_>>(),
        "state_bytes_per_sequence": s.state_bytes_per_sequence,
        "state_sequences": s.state_sequences,
        "state_arena_bytes": s.state_arena_bytes,
        "kv_capacity": {
            "positions": capacity.positions,
            "conversations": capacity.conversations,
            "conversation_tokens": rill_engine::KV_SPLIT_CONVERSATION_TOKENS,
        },
        "kv_dtype": s.kv_types.name(),
        "kv_types": {"keys": s.kv_types.keys.name(), "values": s.kv_types.values.name()},
        "kv_bytes_per_token_by_type": kv_bytes_by_type(c),
        "precision": format!("{:?}", s.precision).to_lowercase(),
        "threads": s.threads,
        "chat_template": handle.tokenizer().chat_template().is_some(),
    })))
}

/// KV bytes per token of context for every type the model's heads fit, keys and values alike:
/// what `--kv-type` would make of the same memory.
fn kv_bytes_by_type(c: &rill_model::ModelConfig) -> serde_json::Map<String, Value> {
    let layout = rill_model::KvLayout::of(c);
    rill_model::KvDtype::ALL
        .iter()
        .filter(|t| t.fits_head_dim(layout.max_head_dim()))
        .map(|&t| {
            let bytes = layout.bytes_per_token(rill_model::KvTypes::from(t), |_| true);
            (t.name().to_string(), Value::from(bytes))
        })
        .collect()
}
