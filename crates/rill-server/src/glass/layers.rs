//! The glass box's layers tier over HTTP: the logit lens with per-head attribution and
//! (value-weighted) attention, and counterfactuals. The lens runs as a job of the engine loop,
//! lent its KV arena, after its context's prefix was brought into the prefix cache by an
//! ordinary request (chunked and batched like any prompt): the job itself computes at most a
//! block of positions, about a decode step. Counterfactuals are ordinary one-token requests, all
//! at once, each from the longest cached prefix, so an edit recomputes only the positions from
//! the change on.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::response::Response;
use rill_engine::serve::ServeHandle;
use rill_engine::{
    apply_edit, Counterfactual, Counterfactuals, Edit, EngineError, Lens, LensOptions,
    MAX_COUNTERFACTUALS, MAX_VALUE_WEIGHT_WORK,
};
use serde_json::{json, Value};

use crate::error::job_dropped;
use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generation::request::{blocking, open_request};
use crate::glass::common::{next_logits, read_prompt, token_text, tokens_json, warm_prefix};
use crate::state::State;

type AppState = Arc<State>;

/// Most top tokens per layer (or per edit) these endpoints give.
const MAX_TOP: i64 = 20;

fn check_context(prompt: &[u32], context: usize) -> Result<(), ApiError> {
    if prompt.len() > context {
        return Err(ApiError::param(
            "tokens",
            format!(
                "the prompt has {} tokens but the context holds {context}",
                prompt.len()
            ),
        ));
    }
    Ok(())
}
/// The lens of `prompt` as a job of the engine loop, in its KV arena.
async fn lens_job(
    handle: &ServeHandle,
    prompt: &[u32],
    options: LensOptions,
) -> Result<Result<Lens, EngineError>, ApiError> {
    let prompt = prompt.to_vec();
    handle
        .run_cache_job(move |engine, lease| engine.logit_lens_in(lease, &prompt, options))
        .map_err(|_| job_dropped())?
        .await
        .map_err(|_| job_dropped())
}

/// `POST /v1/rill/lens`: the logit lens at the last position of a prompt (`tokens`, `prompt` or
/// `messages`), with the engine's precision, from the prefix cache.
pub(crate) async fn lens(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let prompt = read_prompt(&f, &handle).await?;
    let top = f.int("top", 1, MAX_TOP)?.unwrap_or(5) as usize;
    let with_attention = f.bool("attention")?.unwrap_or(false);
    let value_weighted = f.bool("value_weighted")?.unwrap_or(false);
    // The token to follow (a sampled one the model did not rank first); default: the most
    // likely token of the last layer.
    let follow = f
        .int("token", 0, info.vocab_size as i64 - 1)?
        .map(|t| t as u32);
    check_context(&prompt, info.context)?;
    let options = LensOptions {
        value_weighted: with_attention && value_weighted,
        follow,
        ..LensOptions::top(top)
    };
    let started = std::time::Instant::now();
    let prompt_len = prompt.len();
    // First straight from the cache (a context just generated is there but for its last
    // block); only when more is missing, the context is brought in by a request and the lens
    // runs again, computing everything that is still missing.
    let first = LensOptions {
        max_computed: 2 * handle.model_summary().kv_block_size,
        ..options
    };
    let mut result = lens_job(&handle, &prompt, first).await?;
    if let Err(EngineError::NotCached { .. }) = result {
        warm_prefix(&handle, &prompt).await?;
        result = lens_job(&handle, &prompt, options).await?;
    }
    let lens = result.map_err(|e| match e {
        EngineError::EmptyPrompt => ApiError::param("tokens", e.to_string()),
        e => ApiError::unavailable(format!("the lens failed: {e}"), "engine_error"),
    })?;
    let tokenizer = handle.tokenizer();
    let kinds = &handle.model_summary().config.layer_kinds;
    let layers: Vec<Value> = lens
        .layers
        .iter()
        .map(|l| {
            // What mixes positions in the block that wrote this layer (none for the embeddings).
            let mixer = l
                .layer
                .checked_sub(1)
                .and_then(|b| kinds.get(b))
                .map(|k| match k {
                    rill_model::LayerKind::Attention => "attention",
                    rill_model::LayerKind::DeltaNet => "gated_deltanet",
                    rill_model::LayerKind::ShortConv => "short_conv",
                    rill_model::LayerKind::Mamba2 => "mamba2",
                });
            json!({
                "layer": l.layer,
                "mixer": mixer,
                "top": tokens_json(&tokenizer, &l.top),
                "chosen_rank": l.chosen_rank,
                "chosen_logprob": l.chosen_logprob,
                "entropy": l.entropy,
                "kl_to_final": l.kl_to_final,
                "residual_norm": l.residual_norm,
                "writes": l.writes.map(|w| json!({
                    "attention_norm": w.attention_norm,
                    "ffn_norm": w.ffn_norm,
                    "attention_logit": w.attention_logit,
                    "ffn_logit": w.ffn_logit,
                    "attention_bias_logit": w.attention_bias_logit,
                    "head_logits": l.head_logits,
                })),
            })
        })
        .collect();
    let mut body = json!({
        "chosen": lens.chosen,
        "chosen_text": token_text(&tokenizer, lens.chosen),
        "most_likely": lens.most_likely,
        "most_likely_text": token_text(&tokenizer, lens.most_likely),
        "chosen_logit": lens.chosen_logit,
        "embedding_logit": lens.embedding_logit,
        "settled_at": lens.settled_at,
        "windows": lens.windows,
        "cached_tokens": lens.cached_tokens,
        "seconds": started.elapsed().as_secs_f64(),
        "layers": layers,
    });
    if with_attention {
        body["attention"] = json!(lens.attention);
        if let Some(weighted) = &lens.value_weighted {
            body["value_weighted"] = json!(weighted);
        }
        if lens.value_weighting_skipped {
            body["value_weighted_skipped"] = json!(format!(
                "value weighting over {} positions would take more than {} multiply-adds of the \
                 engine loop: left out, the raw weights are given",
                prompt_len, MAX_VALUE_WEIGHT_WORK
            ));
        }
    }
    Ok(json_body(&body))
}

/// `POST /v1/rill/counterfactual`: the next-token distribution after a prompt and after each of
/// `edits` (`[{"position": p}]` drops the token there, `{"position": p, "replace_with": id}`
/// puts another in its place), following `token` (default: the original's most likely).
pub(crate) async fn counterfactual(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let prompt = read_prompt(&f, &handle).await?;
    check_context(&prompt, info.context)?;
    let top = f.int("top", 1, MAX_TOP)?.unwrap_or(5) as usize;
    let tracked = f
        .int("token", 0, info.vocab_size as i64 - 1)?
        .map(|t| t as u32);
    let edits = read_edits(f.get("edits"), prompt.len(), info.vocab_size)?;
    let started = std::time::Instant::now();
    // The original and every edited context at once, as one-token requests of the serving loop:
    // batched with each other and everyone else, each from the longest cached prefix.
    let contexts = std::iter::once(prompt.clone())
        .chain(edits.iter().map(|&(p, e)| apply_edit(&prompt, p, e)))
        .map(|context| next_logits(&handle, context));
    let mut runs = futures::future::try_join_all(contexts).await?;
    let original = runs.remove(0);
    let job_prompt = prompt.clone();
    let cf = blocking(move || {
        let mut cf = Counterfactuals::new(&original.logits, tracked, top);
        for ((position, edit), run) in edits.into_iter().zip(&runs) {
            let len = job_prompt.len() - usize::from(edit == Edit::Drop);
            cf.edits.push(Counterfactual::from_logits(
                &job_prompt,
                position,
                edit,
                &original.logits,
                &run.logits,
                cf.tracked,
                top,
                len - run.cached,
            ));
        }
        Ok(cf)
    })
    .await?;
    let tokenizer = handle.tokenizer();
    let edits: Vec<Value> = cf
        .edits
        .iter()
        .map(|e| {
            let mut v = json!({
                "position": e.position,
                "original": e.original,
                "original_text": token_text(&tokenizer, e.original),
                "edit": match e.edit { Edit::Drop => "drop", Edit::Replace(_) => "replace" },
                "top": tokens_json(&tokenizer, &e.top),
                "tracked_logprob": e.tracked_logprob,
                "tracked_rank": e.tracked_rank,
                "kl": e.kl,
                "computed_tokens": e.computed,
            });
            if let Edit::Replace(t) = e.edit {
                v["replace_with"] = json!(t);
                v["replace_with_text"] = json!(token_text(&tokenizer, t));
            }
            v
        })
        .collect();
    Ok(json_body(&json!({
        "token": cf.tracked,
        "token_text": token_text(&tokenizer, cf.tracked),
        "tracked_logprob": cf.tracked_logprob,
        "top": tokens_json(&tokenizer, &cf.top),
        "context_tokens": prompt.len(),
        "seconds": started.elapsed().as_secs_f64(),
        "edits": edits,
    })))
}

/// `edits`: 1 to [`MAX_COUNTERFACTUALS`] objects with a `position` in the prompt and an optional
/// `replace_with` token id.
fn read_edits(
    value: Option<&Value>,
    len: usize,
    vocab: usize,
) -> Result<Vec<(usize, Edit)>, ApiError> {
    let list = match value {
        Some(Value::Array(list)) if !list.is_empty() && list.len() <= MAX_COUNTERFACTUALS => list,
        _ => {
            return Err(ApiError::param(
                "edits",
                format!(
                    "give 'edits' as 1 to {MAX_COUNTERFACTUALS} objects \
                     {{\"position\": p}} (drop) or {{\"position\": p, \"replace_with\": id}}"
                ),
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            let field = format!("edits[{i}]");
            let obj = item
                .as_object()
                .ok_or_else(|| ApiError::param(&field, "an edit is an object"))?;
            if let Some(k) = obj
                .keys()
                .find(|k| !matches!(k.as_str(), "position" | "replace_with"))
            {
                return Err(ApiError::param(
                    &field,
                    format!("unknown key '{k}' (an edit has 'position' and 'replace_with')"),
                ));
            }
            let position = obj
                .get("position")
                .and_then(Value::as_u64)
                .filter(|&p| (p as usize) < len)
                .ok_or_else(|| {
                    ApiError::param(
                        &field,
                        format!(
                            "'position' must be a position of the prompt, 0 to {}",
                            len - 1
                        ),
                    )
                })? as usize;
            let edit = match obj.get("replace_with") {
                None | Some(Value::Null) => {
                    if len < 2 {
                        return Err(ApiError::param(
                            &field,
                            "dropping the only token would leave nothing to predict from",
                        ));
                    }
                    Edit::Drop
                }
                Some(v) => Edit::Replace(v.as_u64().filter(|&t| (t as usize) < vocab).ok_or_else(
                    || {
                        ApiError::param(
                            &field,
                            format!("'replace_with' must be a token id below {vocab}"),
                        )
                    },
                )? as u32),
            };
            Ok((position, edit))
        })
        .collect()
}
