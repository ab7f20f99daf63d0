//! After a step's forward pass: every sequence that got logits decodes its next token (and
//! the tokens its constraint forces) and streams it; prompts just computed fork their other
//! choices; finished choices leave, and requests whose every choice is done get their usage.

use std::sync::atomic::Ordering;
use std::time::Instant;

use rill_model::ModelCost;

use super::super::metrics::Metrics;
use super::super::scheduler::{retire, Planned};
use super::super::timeline::LoopEventKind;
use super::super::{PickRule, PromptInfo, ServeEvent, StepInfo, TokenCost, TokenDetail};
use super::lookup::settle_draft;
use super::requests::{finish_request, End, Request, Seq};
use super::Loop;
use crate::decoder::{Emitted, Forcing, SampledFrom, SeqDecoder};
use crate::{FinishCause, FinishReason};

impl Loop<'_> {
    /// Decodes every sequence the step computed logits for (`seconds`: its forward pass;
    /// `step`: described when a request in it explains its tokens), forks the choices of
    /// prompts just computed, and retires finished choices.
    pub(super) fn commit(&mut self, seconds: f64, step: Option<StepInfo>) {
        let now = Instant::now();
        let vocab = self.vocab;
        let context = self.context;
        let tokenizer = self.tokenizer;
        let m = &self.shared.metrics;
        let costs = Costs {
            sliding: &self.engine.model.config().layer_is_sliding,
            window: self.engine.model.config().sliding_window,
            cost: &self.cost,
            kv_bytes_per_token: self.kv.bytes_per_token(),
            kv_context_bytes_per_token: self.kv.global_bytes_per_token(),
            block_size: self.kv.block_size(),
            step,
        };
        let mut failed = Vec::new();
        for p in 0..self.plan.parts.len() {
            let Planned {
                idx,
                rows,
                logits,
                decode,
                drafted,
            } = self.plan.parts[p];
            let s = &mut self.scheduler.running[idx];
            if let (Some(first), true) = (logits, drafted > 0) {
                // Its row, then a row per drafted token: each decoded in order, as plain
                // decoding would, while the token decoded is the one drafted next.
                let written = s.computed + rows;
                s.computed += 1;
                let mut kept = 0;
                if let Some(r) = self.requests.get_mut(&s.req) {
                    for i in 0..=drafted {
                        let row = &self.logits[(first + i) * vocab..(first + i + 1) * vocab];
                        if let Err(e) = sample(s, row, r, context, m, now, &costs) {
                            failed.push((s.req, e));
                            break;
                        }
                        if i == drafted || s.decoder.step_tokens() != [s.draft[i]] {
                            break;
                        }
                        // The drafted token was the one to come: its row's keys, values and
                        // logits are the next position's (kept even when that token ends the
                        // sequence, so the acceptance record counts it).
                        s.computed += 1;
                        kept += 1;
                        if s.finished {
                            break;
                        }
                    }
                }
                Metrics::add(&m.spec_draft_tokens, drafted as u64);
                Metrics::add(&m.spec_accepted_tokens, kept as u64);
                let round = (drafted, kept, written);
                settle_draft(&mut self.kv, s, &mut self.draft_record, round);
                if self.config.prefix_caching {
                    let _ = self.kv.publish_prefix(s.id, &s.tokens[..s.computed]);
                }
                continue;
            }
            s.computed += rows;
            if !decode {
                s.prefill_seconds += seconds;
                s.prefill_steps += 1;
            }
            if self.config.prefix_caching {
                let _ = self.kv.publish_prefix(s.id, &s.tokens[..s.computed]);
            }
            let Some(row) = logits else {
                continue;
            };
            let row = &self.logits[row * vocab..(row + 1) * vocab];
            let Some(r) = self.requests.get_mut(&s.req) else {
                continue;
            };
            let mut children = Vec::new();
            if s.fork > 0 {
                for choice in 1..=s.fork {
                    let child = self.next_seq;
                    self.next_seq += 1;
                    let made = self
                        .kv
                        .fork(s.id, child)
                        .map_err(crate::EngineError::from)
                        .and_then(|()| {
                            SeqDecoder::new(
                                tokenizer,
                                &r.params,
                                choice,
                                r.trace.explain,
                                Forcing::WhenUnobserved,
                            )
                        });
                    match made {
                        Ok(decoder) => children.push(Seq {
                            id: child,
                            req: s.req,
                            choice,
                            tokens: s.tokens.clone(),
                            computed: s.computed,
                            decoder,
                            fork: 0,
                            last_token: None,
                            finished: false,
                            cached_prompt: s.cached_prompt,
                            prefill_seconds: s.prefill_seconds,
                            prefill_steps: s.prefill_steps,
                            draft: Vec::new(),
                            acceptance: s.acceptance,
                            draft_length: s.draft_length,
                        }),
                        Err(_) => {
                            // Cannot happen (a fresh id, validated parameters); the choice
                            // would then never run: end it rather than wait forever.
                            let _ = self.kv.remove_sequence(child);
                            r.done[choice] = true;
                            m.finish(FinishReason::Cancelled);
                            let _ = r.tx.send(ServeEvent::Done {
                                choice,
                                finish_reason: FinishReason::Cancelled,
                                cause: FinishCause::Cancelled,
                            });
                        }
                    }
                }
                s.fork = 0;
            }
            if let Err(e) = sample(s, row, r, context, m, now, &costs) {
                failed.push((s.req, e));
            }
            for mut child in children {
                if let Err(e) = sample(&mut child, row, r, context, m, now, &costs) {
                    failed.push((child.req, e));
                }
                self.scheduler.running.push(child);
            }
        }
        for (req, e) in failed {
            self.end_request(req, End::Error(e.to_string()));
        }

        // Finished choices leave (their blocks go back, full ones stay cached); requests
        // whose every choice is done get their usage.
        if self.scheduler.running.iter().any(|s| s.finished) {
            self.scratch.clear();
            let (kv, caching) = (&mut self.kv, self.config.prefix_caching);
            let ended = &mut self.scratch;
            self.scheduler.running.retain(|s| {
                if s.finished {
                    retire(kv, s, caching);
                    ended.push(s.req);
                    false
                } else {
                    true
                }
            });
            self.scratch.sort_unstable();
            self.scratch.dedup();
            for &req in &self.scratch {
                if self
                    .requests
                    .get(&req)
                    .is_some_and(|r| r.done.iter().all(|&d| d))
                {
                    if let Some(r) = self.requests.remove(&req) {
                        self.timeline.event(req, LoopEventKind::Finished);
                        finish_request(&r, &self.shared.metrics);
                        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
        }
    }
}

/// What a step's tokens are explained with.
struct Costs<'a> {
    sliding: &'a [bool],
    window: Option<usize>,
    cost: &'a ModelCost,
    kv_bytes_per_token: usize,
    /// The layers without a window's share of `kv_bytes_per_token`.
    kv_context_bytes_per_token: usize,
    block_size: usize,
    /// The step, when a request in it explains its tokens.
    step: Option<StepInfo>,
}

impl Costs<'_> {
    /// The cost of the row at `position` (attending to itself and what came before, within
    /// each sliding layer's window).
    fn token(&self, position: usize) -> TokenCost {
        let n_layers = self.sliding.len().max(1) as u64;
        let full = position as u64 + 1;
        let attended: u64 = self
            .sliding
            .iter()
            .map(|&sliding| match (sliding, self.window) {
                (true, Some(w)) => full.min(w as u64),
                _ => full,
            })
            .sum();
        TokenCost {
            flops: self.cost.flops_per_token
                + self.cost.attention_flops_per_position * attended / n_layers,
            weight_bytes: self.cost.weight_bytes_per_token,
            kv_bytes: self.kv_bytes_per_token as u64 * attended / n_layers,
        }
    }

    /// How sampled token `e` (drawn as `from` says) came to be, for the request's
    /// [`Trace::explain`].
    fn detail(
        &self,
        step: StepInfo,
        e: &Emitted<'_>,
        from: SampledFrom<'_>,
        prompt: &PromptFacts<'_>,
        now: Instant,
    ) -> TokenDetail {
        // The token sampled now sits at the sequence's next position; the cache holds every
        // position before it.
        let position = e.position;
        let bs = self.block_size;
        let blocks = (position + 1).div_ceil(bs);
        // The window layers hold the blocks from the one of the first position the next query
        // reads (the loop keeps no rollback slack).
        let window_blocks = match self.window {
            Some(w) => blocks - (position + 1).saturating_sub(w) / bs,
            None => blocks,
        };
        let window_bytes = self.kv_bytes_per_token - self.kv_context_bytes_per_token;
        TokenDetail {
            rule: if from.greedy {
                PickRule::Greedy
            } else {
                PickRule::Sampled
            },
            probability: e.probability,
            index: e.index,
            position,
            elapsed_s: now.duration_since(prompt.arrived).as_secs_f64(),
            step,
            kv_blocks: blocks,
            kv_bytes: (blocks * self.kv_context_bytes_per_token + window_blocks * window_bytes)
                * bs,
            kv_bytes_without_window: blocks * bs * self.kv_bytes_per_token,
            cost: self.token(position - 1),
            constraint: from.constraint,
            draw: from.draw,
            prompt: (e.index == 0).then(|| PromptInfo {
                tokens: prompt.tokens.to_vec(),
                cached_tokens: prompt.cached,
                computed_tokens: prompt.len - prompt.cached,
                prefill_seconds: prompt.seconds,
                prefill_steps: prompt.steps,
                queue_seconds: prompt.queue_seconds,
            }),
            logits: prompt.full_logits.then(|| from.logits.to_vec()),
        }
    }
}

/// What a sequence's token details report of its request and how its prompt was taken in.
struct PromptFacts<'a> {
    /// The prompt, kept when explaining; its length.
    tokens: &'a [u32],
    len: usize,
    arrived: Instant,
    queue_seconds: f64,
    full_logits: bool,
    /// Prompt tokens from the prefix cache; the forward passes that computed the rest.
    cached: usize,
    seconds: f64,
    steps: usize,
}

/// Samples the next token of `s` from `logits` (and appends the tokens the constraint forces
/// after it), streams each, and ends the choice when a stop condition says so.
fn sample(
    s: &mut Seq<'_>,
    logits: &[f32],
    r: &mut Request,
    context: usize,
    m: &Metrics,
    now: Instant,
    costs: &Costs<'_>,
) -> Result<(), crate::EngineError> {
    let explain = costs.step.is_some() && r.trace.explain;
    let Request {
        params,
        tx,
        arrived,
        prompt,
        prompt_len,
        queue_seconds,
        trace,
        completion_tokens,
        first_token,
        ..
    } = r;
    let facts = PromptFacts {
        tokens: prompt,
        len: *prompt_len,
        arrived: *arrived,
        queue_seconds: *queue_seconds,
        full_logits: trace.full_logits,
        cached: s.cached_prompt,
        seconds: s.prefill_seconds,
        steps: s.prefill_steps,
    };
    let (choice, last_token) = (s.choice, &mut s.last_token);
    let finish = s
        .decoder
        .decode(params, context, logits, &s.tokens, explain, &mut |mut e| {
            *completion_tokens += 1;
            Metrics::add(&m.generation_tokens, 1);
            let (logprobs, detail) = match e.sampled.take() {
                Some(from) => {
                    if !std::mem::replace(first_token, true) {
                        m.time_to_first_token
                            .observe(now.duration_since(facts.arrived).as_secs_f64());
                    }
                    if let Some(last) = last_token.replace(now) {
                        m.inter_token_latency
                            .observe(now.duration_since(last).as_secs_f64());
                    }
                    let logprobs = params.top_logprobs.map(|_| e.logprobs.clone());
                    let detail = costs
                        .step
                        .filter(|_| trace.explain)
                        .map(|step| Box::new(costs.detail(step, &e, from, &facts, now)));
                    (logprobs, detail)
                }
                None => {
                    Metrics::add(&m.forced_tokens, 1);
                    (None, None)
                }
            };
            let _ = tx.send(ServeEvent::Token {
                choice,
                token: e.token,
                text: e.text.to_string(),
                logprobs,
                detail,
            });
            true
        })?;
    s.tokens.extend_from_slice(s.decoder.step_tokens());
    if let Some(cause) = finish {
        s.finished = true;
        r.done[s.choice] = true;
        let finish_reason = cause.reason();
        m.finish(finish_reason);
        let _ = r.tx.send(ServeEvent::Done {
            choice: s.choice,
            finish_reason,
            cause,
        });
    }
    Ok(())
}
