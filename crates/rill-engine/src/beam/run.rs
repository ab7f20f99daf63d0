//! A beam search in progress, one forward pass at a time: [`BeamRun::start`] computes the prompt
//! (from the prefix cache where asked), each [`BeamRun::step`] expands the running beams and
//! computes the kept ones, and the last step returns the [`BeamOutput`]. Between steps the run
//! owns nothing but its sequences in the cache, so a serving loop can step it between its own
//! steps, in its own arena, where its beams show like any request's sequences.

use std::time::Instant;

use rill_constrain::{Grammar, TokenConstraint};
use rill_kernels::ops::log_normalizer;
use rill_model::{Batch, KvCache, ModelError, SeqId};

use super::{
    beam_score, check_prompt, top_tokens, BeamError, BeamFinish, BeamHypothesis, BeamNode,
    BeamOutput, BeamParams, BeamStep, BeamStop, BeamTrace, Candidate, EarlyStopping, Finished,
    FinishedSet, NodeStatus, RunningBeam, FIRST_SEQ,
};
use crate::Engine;

/// A beam search between two steps.
pub struct BeamRun {
    params: BeamParams,
    prompt_len: usize,
    context: usize,
    /// Most tokens a hypothesis may generate.
    limit: usize,
    /// Sequences the search added and has not removed.
    live: Vec<SeqId>,
    /// Ids the search removed, reused before new ones.
    spare_ids: Vec<SeqId>,
    next_id: SeqId,
    running: Vec<RunningBeam>,
    /// Each running beam's place in the constraint.
    states: Vec<Option<TokenConstraint>>,
    finished: FinishedSet,
    trace: Vec<BeamNode>,
    next_node: usize,
    step: usize,
    /// The running beams' logits, one row each.
    logits: Vec<f32>,
    forward_passes: usize,
    peak: usize,
    cached_prompt: usize,
    prefill_seconds: f64,
    search_started: Instant,
}

impl BeamRun {
    /// Checks the parameters and the prompt, and computes the prompt in `kv` (starting from its
    /// longest cached prefix with `prefix_caching`; the positions computed are not published).
    ///
    /// Errors before anything is computed: bad parameters, an empty prompt or one that does not
    /// fit the model's context, a token outside the vocabulary, a cache of another shape, or
    /// fewer free blocks than the search may need ([`BeamParams::kv_blocks_needed`]).
    pub fn start(
        engine: &mut Engine,
        kv: &mut KvCache,
        prompt: &[u32],
        params: &BeamParams,
        constraint: Option<&Grammar>,
        prefix_caching: bool,
    ) -> Result<BeamRun, BeamError> {
        params.validate()?;
        let context = check_prompt(&engine.model, prompt)?;
        if kv.layout() != engine.model.kv_layout() {
            return Err(ModelError::KvShape {
                cache: Box::new(kv.layout().clone()),
                model: Box::new(engine.model.kv_layout().clone()),
            }
            .into());
        }
        let needed = params.kv_blocks_needed(prompt.len(), context, kv.block_size());
        if needed > kv.free_blocks() {
            return Err(BeamError::CacheTooSmall {
                width: params.width,
                needed,
                free: kv.free_blocks(),
                total: kv.total_blocks(),
            });
        }
        let started = Instant::now();
        let mut run = BeamRun {
            params: params.clone(),
            prompt_len: prompt.len(),
            context,
            limit: params.token_limit(prompt.len(), context),
            live: Vec::new(),
            spare_ids: Vec::new(),
            next_id: FIRST_SEQ,
            running: Vec::new(),
            states: vec![constraint.map(Grammar::start)],
            finished: FinishedSet {
                width: params.width,
                items: Vec::with_capacity(params.width + 1),
            },
            trace: Vec::new(),
            next_node: 0,
            step: 0,
            logits: Vec::new(),
            forward_passes: 1,
            peak: 0,
            cached_prompt: 0,
            prefill_seconds: 0.0,
            search_started: started,
        };
        let root = run.new_seq(kv);
        let prefill = (|| -> Result<(), BeamError> {
            kv.add_sequence(root)?;
            if prefix_caching {
                // The last position is always computed: its logits are the first proposals.
                run.cached_prompt = kv.attach_prefix(root, &prompt[..prompt.len() - 1])?;
            }
            let hit = run.cached_prompt;
            engine.model.forward(
                &Batch::prompt(root, &prompt[hit..], hit, false),
                kv,
                engine.precision,
                &mut run.logits,
            )?;
            Ok(())
        })();
        if let Err(e) = prefill {
            run.abort(kv);
            return Err(e);
        }
        run.prefill_seconds = started.elapsed().as_secs_f64();
        run.search_started = Instant::now();
        run.peak = run.blocks_held(kv);
        run.running.push(RunningBeam {
            node: usize::MAX,
            tokens: Vec::new(),
            cumulative_logprob: 0.0,
            score: 0.0,
            seq: root,
        });
        Ok(run)
    }

    /// The running beams' sequences, best first (what the cache holds for them).
    pub fn sequences(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.running.iter().map(|b| b.seq)
    }

    /// Steps taken: tokens each running beam has generated.
    pub fn steps(&self) -> usize {
        self.step
    }

    /// Prompt positions that came from the prefix cache.
    pub fn cached_prompt(&self) -> usize {
        self.cached_prompt
    }

    /// Distinct KV blocks the search's sequences hold now (shared ones once).
    pub fn blocks_held(&self, kv: &KvCache) -> usize {
        kv.distinct_blocks(&self.live)
    }

    /// The most blocks the search may hold at once ([`BeamParams::kv_blocks_needed`]).
    pub fn blocks_bound(&self, kv: &KvCache) -> usize {
        self.params
            .kv_blocks_needed(self.prompt_len, self.context, kv.block_size())
    }

    /// Removes every sequence the search added (after an error, or to cancel it outright).
    pub fn abort(&mut self, kv: &mut KvCache) {
        for seq in std::mem::take(&mut self.live) {
            // Cannot fail: the search added every one of them and removed none of these.
            let _ = kv.remove_sequence(seq);
        }
    }

    fn new_seq(&mut self, kv: &KvCache) -> SeqId {
        let id = self.spare_ids.pop().unwrap_or_else(|| {
            while kv.has_sequence(self.next_id) {
                self.next_id = self.next_id.wrapping_add(1);
            }
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            id
        });
        self.live.push(id);
        id
    }

    fn drop_seq(&mut self, kv: &mut KvCache, seq: SeqId) -> Result<(), BeamError> {
        kv.remove_sequence(seq)?;
        self.live.retain(|&s| s != seq);
        self.spare_ids.push(seq);
        Ok(())
    }

    /// One step: ranks every running beam's proposals, keeps the best `width` that go on, lets
    /// `on_step` see it (returning `false` cancels the search), and computes the kept beams in
    /// one batched forward pass. Returns the output, its sequences removed, when the search
    /// ends. After an error the run is of no further use: [`BeamRun::abort`] it.
    pub fn step(
        &mut self,
        engine: &mut Engine,
        kv: &mut KvCache,
        on_step: &mut dyn FnMut(&BeamStep<'_>) -> bool,
    ) -> Result<Option<BeamOutput>, BeamError> {
        let Engine {
            model,
            tokenizer,
            precision,
            ..
        } = engine;
        let width = self.params.width;
        let alpha = self.params.length_penalty;
        let vocab = model.config().vocab_size;
        let per_beam = (2 * width).min(vocab);
        let step = self.step;
        let len = step + 1;
        let running = std::mem::take(&mut self.running);
        let mut states = std::mem::take(&mut self.states);

        // Every beam's proposals.
        let mut candidates: Vec<Candidate> = Vec::with_capacity(running.len() * per_beam);
        let mut order: Vec<u32> = Vec::with_capacity(per_beam);
        let mut masked: Vec<f32> = Vec::new();
        for (b, beam) in running.iter().enumerate() {
            let row = &self.logits[b * vocab..(b + 1) * vocab];
            let norm = log_normalizer(row);
            match states[b]
                .as_mut()
                .map(|c| c.allowed_if_started())
                .transpose()?
            {
                // Proposals only among the tokens the constraint allows; log-probabilities
                // stay the model's.
                Some(Some(words)) => {
                    masked.clear();
                    masked.extend(row.iter().enumerate().map(|(t, &l)| {
                        let on = words.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1);
                        if on {
                            l
                        } else {
                            f32::NEG_INFINITY
                        }
                    }));
                    top_tokens(&masked, norm, per_beam, &mut order);
                }
                _ => top_tokens(row, norm, per_beam, &mut order),
            }
            candidates.extend(order.iter().map(|&token| {
                let logprob = row[token as usize] - norm;
                Candidate {
                    beam: b,
                    token,
                    logprob,
                    cumulative: beam.cumulative_logprob + f64::from(logprob),
                }
            }));
        }
        candidates.sort_unstable_by(|a, b| {
            b.cumulative
                .total_cmp(&a.cumulative)
                .then(a.token.cmp(&b.token))
                .then(a.beam.cmp(&b.beam))
        });

        // Selection.
        let mut nodes: Vec<BeamNode> = Vec::with_capacity(candidates.len());
        // (candidate index, node id) of the proposals kept this step, and their constraint
        // states in that order.
        let mut kept: Vec<(usize, usize)> = Vec::with_capacity(width);
        let mut kept_states: Vec<Option<TokenConstraint>> = Vec::with_capacity(width);
        for (rank, c) in candidates.iter().enumerate() {
            let id = self.next_node;
            self.next_node += 1;
            let parent = &running[c.beam];
            let score = beam_score(c.cumulative, len, alpha);
            // The proposal's place in the constraint; a text the constraint completes finishes
            // the beam.
            let mut state = None;
            let mut complete = false;
            if kept.len() < width {
                if let Some(parent_state) = &states[c.beam] {
                    let mut s = parent_state.clone();
                    s.commit(c.token)?;
                    complete = s.is_finished();
                    state = Some(s);
                }
            }
            let status = if kept.len() == width {
                NodeStatus::Pruned
            } else if complete
                || (!self.params.ignore_eos && tokenizer.is_end_of_generation(c.token))
            {
                if rank < width && self.finished.would_take(score, id) {
                    let mut tokens = Vec::with_capacity(len);
                    tokens.extend_from_slice(&parent.tokens);
                    tokens.push(c.token);
                    self.finished.offer(Finished {
                        tokens,
                        cumulative: c.cumulative,
                        score,
                        node: id,
                        reason: BeamFinish::Stop,
                    });
                    NodeStatus::Finished
                } else {
                    NodeStatus::Pruned
                }
            } else {
                kept.push((rank, id));
                kept_states.push(state);
                NodeStatus::Kept
            };
            nodes.push(BeamNode {
                id,
                parent: (step > 0).then_some(parent.node),
                token: c.token,
                text: tokenizer.decode_with(&[c.token], true),
                token_logprob: c.logprob,
                cumulative_logprob: c.cumulative,
                score,
                step,
                rank,
                status,
            });
        }

        // The beams going on, best first (the ranking is by cumulative log-probability, so by
        // score too: they all have the same length). Sequences are assigned below.
        let mut next: Vec<RunningBeam> = kept
            .iter()
            .map(|&(ci, id)| {
                let c = &candidates[ci];
                let mut tokens = Vec::with_capacity(len + 1);
                tokens.extend_from_slice(&running[c.beam].tokens);
                tokens.push(c.token);
                RunningBeam {
                    node: id,
                    tokens,
                    cumulative_logprob: c.cumulative,
                    score: beam_score(c.cumulative, len, alpha),
                    seq: running[c.beam].seq,
                }
            })
            .collect();

        let done = self.finished.is_full()
            && match (
                self.params.early_stopping,
                next.first(),
                self.finished.worst_score(),
            ) {
                (EarlyStopping::Finished, _, _) | (_, None, _) | (_, _, None) => true,
                (EarlyStopping::Heuristic, Some(best), Some(worst)) => worst >= best.score,
                (EarlyStopping::Never, Some(best), Some(worst)) => {
                    let longest = if alpha > 0.0 { self.limit } else { len };
                    worst >= beam_score(best.cumulative_logprob, longest, alpha)
                }
            };
        let keep_going = on_step(&BeamStep {
            step,
            nodes: &nodes,
            running: &next,
            finished: self.finished.items.len(),
            kv_blocks: self.blocks_held(kv),
        });
        if self.params.trace {
            self.trace.extend(nodes);
        }
        self.step += 1;

        let stop = if done {
            Some(BeamStop::Done)
        } else if !keep_going {
            Some(BeamStop::Cancelled)
        } else if next.is_empty() {
            Some(BeamStop::Exhausted)
        } else if len >= self.limit {
            Some(BeamStop::Length)
        } else {
            None
        };
        if let Some(stop) = stop {
            if matches!(stop, BeamStop::Length | BeamStop::Cancelled) {
                let reason = if stop == BeamStop::Length {
                    BeamFinish::Length
                } else {
                    BeamFinish::Cancelled
                };
                for beam in next {
                    self.finished.offer(Finished {
                        tokens: beam.tokens,
                        cumulative: beam.cumulative_logprob,
                        score: beam.score,
                        node: beam.node,
                        reason,
                    });
                }
            }
            self.abort(kv);
            return Ok(Some(self.output(tokenizer, stop)));
        }

        // The cache follows the beams: a parent's first continuation keeps its sequence,
        // further ones fork it, and parents without one are removed.
        for (b, beam) in running.iter().enumerate() {
            if !kept.iter().any(|&(ci, _)| candidates[ci].beam == b) {
                self.drop_seq(kv, beam.seq)?;
            }
        }
        for (i, &(ci, _)) in kept.iter().enumerate() {
            let parent = candidates[ci].beam;
            let first = kept[..i]
                .iter()
                .all(|&(cj, _)| candidates[cj].beam != parent);
            if !first {
                let seq = self.new_seq(kv);
                kv.fork(running[parent].seq, seq)?;
                next[i].seq = seq;
            }
        }
        std::mem::swap(&mut states, &mut kept_states);
        self.running = next;
        self.states = states;
        let mut batch = Batch::new();
        for beam in &self.running {
            batch.push(
                beam.seq,
                *beam.tokens.last().unwrap_or(&0),
                self.prompt_len + len - 1,
                true,
            );
        }
        model.forward(&batch, kv, *precision, &mut self.logits)?;
        self.forward_passes += 1;
        self.peak = self.peak.max(self.blocks_held(kv));
        Ok(None)
    }

    /// The finished set, best first, as the search's output.
    fn output(&mut self, tokenizer: &rill_tokenizer::Tokenizer, stop: BeamStop) -> BeamOutput {
        let mut items = std::mem::take(&mut self.finished.items);
        items.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.node.cmp(&b.node)));
        let hypotheses = items
            .into_iter()
            .map(|h| BeamHypothesis {
                text: tokenizer.decode(&h.tokens),
                tokens: h.tokens,
                cumulative_logprob: h.cumulative,
                score: h.score,
                finish_reason: h.reason,
                node: h.node,
            })
            .collect();
        BeamOutput {
            hypotheses,
            stop,
            steps: self.step,
            prompt_tokens: self.prompt_len,
            forward_passes: self.forward_passes,
            peak_kv_blocks: self.peak,
            prefill_seconds: self.prefill_seconds,
            search_seconds: self.search_started.elapsed().as_secs_f64(),
            trace: BeamTrace {
                prompt_tokens: self.prompt_len,
                width: self.params.width,
                length_penalty: self.params.length_penalty,
                nodes: std::mem::take(&mut self.trace),
            },
        }
    }
}

/// Beam search after `prompt` in `kv` from start to end (see [`super::beam_search`]).
pub(super) fn search(
    engine: &mut Engine,
    kv: &mut KvCache,
    prompt: &[u32],
    params: &BeamParams,
    constraint: Option<&Grammar>,
    mut on_step: impl FnMut(&BeamStep<'_>) -> bool,
) -> Result<BeamOutput, BeamError> {
    let mut run = BeamRun::start(engine, kv, prompt, params, constraint, false)?;
    loop {
        match run.step(engine, kv, &mut on_step) {
            Ok(Some(output)) => return Ok(output),
            Ok(None) => {}
            Err(e) => {
                run.abort(kv);
                return Err(e);
            }
        }
    }
}
