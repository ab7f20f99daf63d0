//! `POST /v1/rill/multiverse`: "a single different choice early on can cascade into a completely
//! different response". Generates an answer, finds the steps where the model's two most likely
//! tokens were close (within `threshold` of probability), and continues the runner-up of each for
//! `branch_tokens` tokens. The branches are ordinary requests of the serving loop, submitted
//! together: they are batched with each other and with every other client, and start from the
//! answer's KV blocks through the prefix cache. Each branch carries its path's log-probability
//! under the model (raw distribution), so a client can draw the tree with widths by probability.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::response::Response;
use rill_engine::serve::{ResponseStream, ServeEvent, ServeHandle, ServeRequest, Trace};
use rill_engine::{FinishReason, GenerateParams, TokenLogprobs};
use rill_tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generation::request::open_request;
use crate::generation::submit::submit_error;
use crate::glass::common::{read_prompt, token_json, tokens_json};
use crate::params::{parse_common, Endpoint};
use crate::state::State;

type AppState = Arc<State>;

pub const MAX_MULTIVERSE_TOKENS: i64 = 256;
pub const MAX_BRANCHES: i64 = 16;
/// Alternatives recorded per token (the runner-up is the one a branch takes).
const TOP: usize = 2;

/// One generated token with the model's own view of it.
struct Step {
    token: u32,
    raw_logprob: f32,
    raw_top: Vec<(u32, f32)>,
}

struct Run {
    steps: Vec<Step>,
    finish: Option<FinishReason>,
    cached_tokens: usize,
}

async fn collect(mut stream: ResponseStream) -> Result<Run, ApiError> {
    let mut run = Run {
        steps: Vec::new(),
        finish: None,
        cached_tokens: 0,
    };
    while let Some(event) = stream.recv().await {
        match event {
            ServeEvent::Token {
                token, logprobs, ..
            } => {
                let lp: TokenLogprobs = logprobs.unwrap_or_default();
                run.steps.push(Step {
                    token,
                    raw_logprob: lp.raw_logprob,
                    raw_top: lp.raw_top,
                });
            }
            ServeEvent::Done { finish_reason, .. } => run.finish = Some(finish_reason),
            ServeEvent::Usage {
                cached_prompt_tokens,
                ..
            } => run.cached_tokens = cached_prompt_tokens,
            ServeEvent::Error { message } => {
                return Err(ApiError::unavailable(
                    format!("generation failed: {message}"),
                    "engine_error",
                ))
            }
        }
    }
    Ok(run)
}

fn submit(
    handle: &ServeHandle,
    prompt: Vec<u32>,
    params: &GenerateParams,
) -> Result<ResponseStream, ApiError> {
    handle
        .submit(ServeRequest {
            prompt,
            params: params.clone(),
            n: 1,
            trace: Trace::default(),
        })
        .map_err(|e| submit_error(Endpoint::Completions, e))
}

fn steps_json(tokenizer: &Tokenizer, steps: &[Step]) -> Vec<Value> {
    steps
        .iter()
        .map(|s| {
            let mut v = token_json(tokenizer, s.token, s.raw_logprob);
            v["top"] = json!(tokens_json(tokenizer, &s.raw_top));
            v
        })
        .collect()
}

fn finish_name(f: Option<FinishReason>) -> Value {
    f.map_or(Value::Null, |f| json!(f.as_str()))
}

/// A place to branch: the step, the token the answer took there, the runner-up, and how close
/// they were (the gap between their probabilities).
struct BranchPoint {
    at: usize,
    alt: u32,
    alt_logprob: f32,
    gap: f32,
}

/// The steps of `steps` whose two most likely tokens are within `threshold` of probability,
/// closest first, at most `max` of them, returned in the order of the answer.
fn branch_points(steps: &[Step], threshold: f32, max: usize) -> Vec<BranchPoint> {
    let mut points: Vec<BranchPoint> = steps
        .iter()
        .enumerate()
        .filter_map(|(at, s)| {
            let (first, second) = (s.raw_top.first()?, s.raw_top.get(1)?);
            let gap = first.1.exp() - second.1.exp();
            // The branch takes the most likely token the answer did not take.
            let &(alt, alt_logprob) = s.raw_top.iter().find(|&&(t, _)| t != s.token)?;
            (gap <= threshold).then_some(BranchPoint {
                at,
                alt,
                alt_logprob,
                gap,
            })
        })
        .collect();
    points.sort_by(|a, b| a.gap.total_cmp(&b.gap).then(a.at.cmp(&b.at)));
    points.truncate(max);
    points.sort_by_key(|p| p.at);
    points
}

pub(crate) async fn multiverse(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let prompt = read_prompt(&f, &handle).await?;
    if f.bool("stream")?.unwrap_or(false) {
        return Err(ApiError::param(
            "stream",
            "the multiverse answers whole: it waits for every branch",
        ));
    }
    let max_tokens = f.int("max_tokens", 1, MAX_MULTIVERSE_TOKENS)?.unwrap_or(32) as usize;
    let branch_tokens = f
        .int("branch_tokens", 1, MAX_MULTIVERSE_TOKENS)?
        .unwrap_or(16) as usize;
    let max_branches = f.int("max_branches", 0, MAX_BRANCHES)?.unwrap_or(4) as usize;
    let threshold = match f.get("threshold") {
        None => 0.2,
        Some(v) => v
            .as_f64()
            .filter(|t| (0.0..=1.0).contains(t))
            .ok_or_else(|| {
                ApiError::param(
                    "threshold",
                    "'threshold' is a probability gap between the two most likely tokens, 0 to 1",
                )
            })? as f32,
    };
    // Every sampling field, read and checked as the completions endpoint does.
    let common = parse_common(&f, Endpoint::Completions, info.vocab_size)?;
    if common.n != 1 {
        return Err(ApiError::param(
            "n",
            "the multiverse makes its own branches: n must be 1",
        ));
    }
    if common.params.constraint.is_some() {
        return Err(ApiError::param(
            "structured_outputs",
            "the multiverse does not take a constraint",
        ));
    }
    let mut params = common.params;
    params.top_logprobs = Some(TOP);
    params.max_tokens = max_tokens;
    if prompt.len() + max_tokens + branch_tokens > info.context {
        return Err(ApiError::param(
            "max_tokens",
            format!(
                "the prompt ({} tokens), max_tokens ({max_tokens}) and branch_tokens \
                 ({branch_tokens}) are more than the context of {} tokens",
                prompt.len(),
                info.context
            ),
        ));
    }

    let main = collect(submit(&handle, prompt.clone(), &params)?).await?;
    let points = branch_points(&main.steps, threshold, max_branches);
    // Every branch at once: the loop batches them, each from the cached prefix.
    let mut branch_params = params.clone();
    branch_params.max_tokens = branch_tokens;
    let mut streams = Vec::with_capacity(points.len());
    for p in &points {
        let mut context = prompt.clone();
        context.extend(main.steps[..p.at].iter().map(|s| s.token));
        context.push(p.alt);
        streams.push(submit(&handle, context, &branch_params)?);
    }
    let runs = futures::future::try_join_all(streams.into_iter().map(collect)).await?;

    let tokenizer = handle.tokenizer();
    let main_logprob: f64 = main.steps.iter().map(|s| f64::from(s.raw_logprob)).sum();
    let main_text = tokenizer.decode(&main.steps.iter().map(|s| s.token).collect::<Vec<_>>());
    let mut branches = vec![json!({
        "id": 0,
        "parent": null,
        "at": null,
        "steps": steps_json(&tokenizer, &main.steps),
        "text": main_text,
        "logprob": main_logprob,
        "finish_reason": finish_name(main.finish),
        "cached_tokens": main.cached_tokens,
    })];
    for (i, (p, run)) in points.iter().zip(&runs).enumerate() {
        let before: f64 = main.steps[..p.at]
            .iter()
            .map(|s| f64::from(s.raw_logprob))
            .sum();
        let after: f64 = run.steps.iter().map(|s| f64::from(s.raw_logprob)).sum();
        let mut tokens = vec![p.alt];
        tokens.extend(run.steps.iter().map(|s| s.token));
        let taken = &main.steps[p.at];
        branches.push(json!({
            "id": i + 1,
            "parent": 0,
            "at": p.at,
            "instead_of": token_json(&tokenizer, taken.token, taken.raw_logprob),
            "token": token_json(&tokenizer, p.alt, p.alt_logprob),
            "gap": p.gap,
            "steps": steps_json(&tokenizer, &run.steps),
            "text": tokenizer.decode(&tokens),
            "logprob": before + f64::from(p.alt_logprob) + after,
            "finish_reason": finish_name(run.finish),
            "cached_tokens": run.cached_tokens,
        }));
    }
    Ok(json_body(&json!({
        "prompt_tokens": prompt.len(),
        "prompt_token_ids": prompt,
        "threshold": threshold,
        "branches": branches,
    })))
}
