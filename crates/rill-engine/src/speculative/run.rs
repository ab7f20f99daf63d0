//! A speculative generation as a state machine. [`SpeculativeRun::step`] does one bounded piece
//! of work and returns: a pass of the prompt (at most [`SESSION_PASS_ROWS`] positions), a pass
//! of the draft taking in the prompt, or one round (the drafts and their one verifying pass; the
//! first token goes with the step after the prefill). So the serving loop can interleave a
//! speculative generation with its other requests' steps instead of pausing them for all of
//! it, and [`Session::generate_speculative`] steps one to its end: the same passes, the same
//! draws, the same tokens either way.

use std::borrow::BorrowMut;
use std::time::Instant;

use rill_model::{Model, Precision};
use rill_tokenizer::Tokenizer;

use super::{draft, AdaptiveDraft, SpeculativeRound, SpeculativeStats, Speculator};
use crate::constrained::Constrained;
use crate::decoder::{Forcing, SeqDecoder};
use crate::session::{Emitter, Prefill, SEQ, SESSION_PASS_ROWS};
use crate::{
    EngineError, FinishCause, GenerateParams, Generation, SamplerChain, Session, TokenEvent,
    Verdict,
};

/// Where a run is.
enum Stage {
    /// The prompt goes into the session's cache, a pass per step.
    Prompt,
    /// The draft takes in the prompt, a pass per step.
    Draft,
    /// The first token, from the prompt's logits.
    First,
    /// Draft-and-verify rounds.
    Rounds,
    Done(FinishCause),
}

/// A speculative generation in progress, on a session (`S`: owned, or borrowed) with a
/// speculator (`P`, likewise); see the module documentation.
pub struct SpeculativeRun<'t, S: BorrowMut<Session>, P: BorrowMut<Speculator>> {
    session: S,
    speculator: P,
    prompt: Vec<u32>,
    precision: Precision,
    draft_chain: SamplerChain,
    /// The target's decoder (its sampler draws the verdicts; its constraint follows the kept
    /// tokens).
    out: Emitter<'t>,
    stats: SpeculativeStats,
    /// The constraint after each position of a round: `states[i]` follows pending and the
    /// first `i` drafts.
    states: Vec<Constrained>,
    stage: Stage,
    prefill: Prefill,
    /// The prompt's first pass is behind (what it found cached is the prefill's reuse).
    prompt_started: bool,
    /// The last chosen token, not yet in the cache.
    pending: u32,
    /// Positions the last step put through the model (prompt rows, or a round's verified rows).
    last_rows: usize,
    /// Logits of a recomputation (none asked: stays empty).
    recompute: Vec<f32>,
}

impl<'t, S: BorrowMut<Session>, P: BorrowMut<Speculator>> SpeculativeRun<'t, S, P> {
    /// Checks the parameters and the prompt and sets up a generation after `prompt` on
    /// `session` (computing only what it does not already hold) with `speculator`, made for
    /// `model`; no forward pass runs yet.
    pub fn start(
        mut session: S,
        mut speculator: P,
        tokenizer: &'t Tokenizer,
        model: &Model,
        precision: Precision,
        prompt: &[u32],
        params: &GenerateParams,
    ) -> Result<Self, EngineError> {
        let cfg = model.config();
        let sp = speculator.borrow_mut();
        if (cfg.vocab_size, cfg.n_layers) != sp.target {
            return Err(EngineError::BadParameter(format!(
                "this speculator was made for a model of {} tokens and {} layers, not {} and {}",
                sp.target.0, sp.target.1, cfg.vocab_size, cfg.n_layers
            )));
        }
        params.validate(cfg.vocab_size)?;
        let session_ref: &mut Session = session.borrow_mut();
        session_ref.check_prompt(prompt)?;
        // Every token is verified, forced ones too: they are sampled from their one-token mask.
        let decoder = SeqDecoder::new(tokenizer, params, 0, false, Forcing::Never)?;
        let draft_chain = decoder.sampler().clone();
        let out = Emitter::new(decoder, params, session_ref.context);
        let stats = SpeculativeStats::new(sp.kind(), sp.params.draft_tokens);
        sp.length = AdaptiveDraft::new(sp.params.draft_tokens);
        Ok(SpeculativeRun {
            session,
            speculator,
            prompt: prompt.to_vec(),
            precision,
            draft_chain,
            out,
            stats,
            states: Vec::new(),
            stage: Stage::Prompt,
            prefill: Prefill {
                prompt_logprobs: Vec::new(),
                computed: 0,
                reused: 0,
                seconds: 0.0,
                decode_started: Instant::now(),
            },
            prompt_started: false,
            pending: 0,
            last_rows: 0,
            recompute: Vec::new(),
        })
    }

    /// Runs stages until one of them runs a forward pass of `model` (the one the run was
    /// started for), or generation ends; `on_token` hears every chosen token (returning `false`
    /// cancels). Returns whether generation has ended ([`SpeculativeRun::finish`] then gives
    /// the result). After an error the run is spent.
    pub fn step(
        &mut self,
        model: &mut Model,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<bool, EngineError> {
        self.last_rows = 0;
        loop {
            let passes = match self.stage {
                Stage::Prompt => self.prompt_pass(model)?,
                Stage::Draft => self.draft_pass(model)?,
                Stage::First => {
                    self.first(on_token)?;
                    0
                }
                Stage::Rounds => {
                    if let Some(finish) = self.round(model, on_token)? {
                        self.stage = Stage::Done(finish);
                    }
                    1
                }
                Stage::Done(_) => return Ok(true),
            };
            if passes > 0 {
                return Ok(matches!(self.stage, Stage::Done(_)));
            }
        }
    }

    /// Positions the last [`SpeculativeRun::step`] put through the model: a pass of the prompt,
    /// or a round's pending token and drafts (the draft's own passes not counted).
    pub fn last_step_rows(&self) -> usize {
        self.last_rows
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.out.generated()
    }

    /// Positions of the prompt.
    pub fn prompt_len(&self) -> usize {
        self.prompt.len()
    }

    /// Prompt positions in the session's cache so far.
    pub fn prompt_cached(&self) -> usize {
        match self.stage {
            Stage::Prompt => self.session.borrow().tokens.len().min(self.prompt.len()),
            _ => self.prompt.len(),
        }
    }

    /// Prompt positions found cached when the run began.
    pub fn prompt_reused(&self) -> usize {
        self.prefill.reused
    }

    /// The session it generates on (its cache holds the prompt and the tokens generated but
    /// the last).
    pub fn session(&self) -> &Session {
        self.session.borrow()
    }

    /// The result, once [`SpeculativeRun::step`] said generation ended (`None` before).
    pub fn finish(self) -> Option<Generation> {
        let Stage::Done(finish) = self.stage else {
            return None;
        };
        let mut generation = self.out.finish(finish, self.prefill);
        generation.speculative = Some(self.stats);
        Some(generation)
    }

    /// One pass of the prompt (all of it at once when its log-probabilities are asked for).
    fn prompt_pass(&mut self, model: &mut Model) -> Result<usize, EngineError> {
        // The MTP draft pairs the prompt's tokens with the model's hidden states of them.
        let hidden = self.speculator.borrow().wants_hidden();
        model.set_hidden_log(hidden);
        let pass = self.prompt_pass_logged(model);
        if hidden {
            let tokens = &self.session.borrow().tokens;
            self.speculator.borrow_mut().absorb_hidden(model, tokens);
            model.set_hidden_log(false);
        }
        pass
    }

    fn prompt_pass_logged(&mut self, model: &mut Model) -> Result<usize, EngineError> {
        let started = Instant::now();
        let session: &mut Session = self.session.borrow_mut();
        let params = self.out.params();
        let computed = if params.prompt_logprobs {
            let top_n = params.top_logprobs.unwrap_or(0);
            self.prefill.prompt_logprobs =
                session.set_prompt_with_logprobs(model, self.precision, &self.prompt, top_n)?;
            self.stage = Stage::Draft;
            self.prompt.len()
        } else {
            let common = session
                .tokens
                .iter()
                .zip(&self.prompt)
                .take_while(|(a, b)| a == b)
                .count();
            let end = (common + SESSION_PASS_ROWS).min(self.prompt.len());
            let (computed, reused) =
                session.set_prompt(model, self.precision, &self.prompt[..end])?;
            if !self.prompt_started {
                self.prefill.reused = reused;
            }
            if end == self.prompt.len() {
                self.stage = Stage::Draft;
            }
            computed
        };
        self.prompt_started = true;
        self.prefill.computed += computed;
        self.prefill.seconds += started.elapsed().as_secs_f64();
        self.last_rows = computed;
        Ok(usize::from(computed > 0))
    }

    /// One pass of the draft taking in the prompt (none for prompt lookup).
    fn draft_pass(&mut self, model: &mut Model) -> Result<usize, EngineError> {
        let started = Instant::now();
        let context = self.session.borrow().context;
        let (passes, done) = self.speculator.borrow_mut().prepare(
            model,
            self.precision,
            context,
            &self.prompt,
            1,
        )?;
        let seconds = started.elapsed().as_secs_f64();
        self.stats.draft_passes += passes;
        self.stats.draft_prefill_seconds += seconds;
        self.prefill.seconds += seconds;
        if done {
            self.stage = Stage::First;
            self.prefill.decode_started = Instant::now();
        }
        Ok(passes)
    }

    /// The first token, from the prompt's logits (within the constraint, if any).
    fn first(
        &mut self,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<(), EngineError> {
        if self.out.max_tokens() == 0 {
            self.stage = Stage::Done(FinishCause::MaxTokens(0));
            return Ok(());
        }
        let session: &Session = self.session.borrow();
        let finish = self
            .out
            .decode(&session.logits, &session.tokens, &mut &mut *on_token)?;
        self.stage = match finish {
            Some(finish) => Stage::Done(finish),
            None => Stage::Rounds,
        };
        self.pending = self.out.step_tokens()[0];
        Ok(())
    }

    /// One round: drafts after the pending token, one verifying pass of the pending token and
    /// the drafts, the rows after the last kept token rolled back. Returns what ended
    /// generation, if anything did.
    fn round(
        &mut self,
        model: &mut Model,
        on_token: &mut dyn FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Option<FinishCause>, EngineError> {
        let precision = self.precision;
        let session: &mut Session = self.session.borrow_mut();
        let sp: &mut Speculator = self.speculator.borrow_mut();
        let (out, stats, states) = (&mut self.out, &mut self.stats, &mut self.states);
        let mut on_token = &mut *on_token;
        let pending = self.pending;
        let greedy = out.decoder().sampler().is_greedy();
        let t = session.tokens.len();
        // Kept drafts and the token after them stay within max_tokens, and pending and the
        // drafts within the context.
        let left = out.max_tokens() - out.generated();
        let room = session.context - t - 1;
        let k = sp.length.next().min(left - 1).min(room);

        // Draft.
        let round_started = Instant::now();
        session.tokens.push(pending);
        let generated = out.generated();
        let decoder = out.decoder_mut();
        let constraint = decoder.constraint().cloned();
        let drafted = draft(
            sp,
            model,
            precision,
            &session.tokens,
            k,
            &mut self.draft_chain,
            decoder.sampler_mut().rng_mut(),
            generated,
            stats,
            constraint.as_ref(),
        );
        session.tokens.truncate(t);
        drafted?;
        // Drafts the constraint forbids are rejected before verification (with every draft
        // after them).
        states.clear();
        if let Some(c) = constraint {
            states.push(c);
            let mut allowed = 0;
            for &d in &sp.drafted {
                let mut next_state = states[allowed].clone();
                if !next_state.allows(d)? {
                    break;
                }
                next_state.take(d)?;
                states.push(next_state);
                allowed += 1;
            }
            stats.constraint_rejected += sp.drafted.len() - allowed;
            sp.drafted.truncate(allowed);
        }
        let k = sp.drafted.len();

        // Verify: pending and the drafts in one pass, logits for every row. A greedy verdict
        // reads each row's largest logit only, so the head may take two passes; a sampled one
        // weighs whole distributions.
        let cut = if greedy {
            out.decoder().head_cut()
        } else {
            rill_model::HeadCut::Full
        };
        sp.batch.rows.clear();
        sp.batch.push_cut(SEQ, pending, t, cut);
        for (i, &d) in sp.drafted.iter().enumerate() {
            sp.batch.push_cut(SEQ, d, t + 1 + i, cut);
        }
        let verify_started = Instant::now();
        let hidden = sp.wants_hidden();
        model.set_hidden_log(hidden);
        let verified = model.forward(&sp.batch, &mut session.kv, precision, &mut sp.rows);
        stats.verify_seconds += verify_started.elapsed().as_secs_f64();
        session.tokens.push(pending);
        session.tokens.extend_from_slice(&sp.drafted);
        if hidden {
            sp.absorb_hidden(model, &session.tokens);
            model.set_hidden_log(false);
        }
        if let Err(e) = verified {
            session.tokens.truncate(t);
            return Err(e.into());
        }
        stats.rounds += 1;
        self.last_rows = k + 1;
        let vocab = sp.rows.len() / (k + 1);

        let mut finish = None;
        let mut next = pending;
        let mut last = 0;
        let mut rejected = false;
        let mut kept_now = 0;
        let mut chosen = None;
        for i in 0..=k {
            last = i;
            let row = &sp.rows[i * vocab..(i + 1) * vocab];
            let generated = out.generated();
            let chain = out.decoder_mut().sampler_mut();
            if let Some(state) = states.get_mut(i) {
                state.mask(chain, false)?;
            }
            chain.probabilities(row, &session.tokens[..t + 1 + i], generated);
            let (token, probability, kept) = if i < k {
                let x = sp.drafted[i];
                stats.drafted += 1;
                stats.drafted_at[i] += 1;
                // The verifier reads the chain's distribution and draws from its generator:
                // the generator's state goes out and back.
                let mut rng = chain.rng().clone();
                let verdict =
                    sp.verifier
                        .verify(chain.distribution(), &sp.qs[i], x, greedy, &mut rng);
                *chain.rng_mut() = rng;
                match verdict {
                    Verdict::Accepted { probability } => {
                        stats.accepted += 1;
                        stats.accepted_at[i] += 1;
                        kept_now += 1;
                        (x, probability, true)
                    }
                    Verdict::Rejected { token, probability } => {
                        stats.unjudged += k - i - 1;
                        rejected = true;
                        (token, probability, false)
                    }
                }
            } else {
                let (token, probability) = chain.draw();
                (token, probability, false)
            };
            if !kept {
                chosen = Some(token);
            }
            // The constraint after this token: a kept draft's state is known; the token drawn
            // at the end of the round is taken now.
            if !states.is_empty() {
                let after = if kept {
                    states[i + 1].clone()
                } else {
                    let mut s = states[i].clone();
                    s.take(token)?;
                    s
                };
                let decoder = out.decoder_mut();
                if after.is_finished() {
                    decoder.complete_next();
                }
                decoder.set_constraint(after);
            }
            if let Some(f) = out.emit(token, probability, row, t + 1 + i, &mut on_token) {
                if kept {
                    stats.unjudged += k - i - 1;
                }
                finish = Some(f);
                break;
            }
            if !kept {
                next = token;
                break;
            }
        }
        // Roll back the rows after the last kept token: the cache holds pending and the kept
        // drafts, the logits are those the last token was chosen from. Past the length before
        // the verifying pass: every position is kept.
        let wanted = t + 1 + last;
        let keep = session.kv.truncate(SEQ, wanted)?;
        if keep < wanted {
            // A recurrent state goes back only to a checkpoint or snapshot (the state before
            // this pass, at worst): the kept rows again, for their state alone (the same bits
            // in any split of passes; their logits are the verifying pass's).
            sp.batch.rows.clear();
            for (pos, &token) in session.tokens[..wanted].iter().enumerate().skip(keep) {
                sp.batch.push(SEQ, token, pos, false);
            }
            model.set_hidden_log(hidden);
            let recomputed =
                model.forward(&sp.batch, &mut session.kv, precision, &mut self.recompute);
            if hidden {
                sp.absorb_hidden(model, &session.tokens[..wanted]);
                model.set_hidden_log(false);
            }
            recomputed?;
        }
        session.tokens.truncate(wanted);
        session.logits.clear();
        session
            .logits
            .extend_from_slice(&sp.rows[last * vocab..(last + 1) * vocab]);
        if sp.params.adaptive {
            sp.length.adapt(k, rejected, last == k);
        }
        if sp.params.trace {
            stats.trace.push(SpeculativeRound {
                position: t + 1,
                drafted: sp.drafted.clone(),
                accepted: kept_now,
                next: chosen,
                corrected: rejected,
                seconds: round_started.elapsed().as_secs_f64(),
            });
        }
        self.pending = next;
        Ok(finish)
    }
}
