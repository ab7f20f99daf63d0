//! One sequence's decoder: what happens between a row of logits and the tokens it adds, the same
//! for every path that generates ([`crate::Session::generate`], the serving loop, speculative
//! decoding). A decode step masks the sampler with the constraint (if any), samples, advances
//! the constraint, emits the token through [`TokenOutput`] (stop checks, streamed text,
//! log-probabilities), then takes the tokens the constraint forces, each emitted without
//! sampling. Each caller hears every emitted token through a sink: the session records it and
//! calls its callback, the serving loop sends an event, speculation verifies drafts and emits
//! the verdicts with [`SeqDecoder::emit`]. A new decoding rule (a reasoning budget, a tool-call
//! format) is so made here, once.

use rill_tokenizer::Tokenizer;

use crate::budget_closing::BudgetClosing;
use crate::constrained::Constrained;
use crate::emit::{sampler_for, TokenOutput};
use crate::thinking_budget::BudgetState;
use crate::{
    ConstraintStep, Draw, EngineError, FinishCause, GenerateParams, SamplerChain, TokenLogprobs,
};

/// How a decoder takes the tokens its constraint forces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forcing {
    /// Appended without sampling, when nothing needs their own logits (no log-probabilities,
    /// nothing explained).
    WhenUnobserved,
    /// Always sampled, from a mask that allows only them (speculation verifies every token).
    Never,
}

/// A sampled token's origin, for whoever reports it.
pub(crate) struct SampledFrom<'a> {
    pub(crate) logits: &'a [f32],
    pub(crate) greedy: bool,
    /// The draw (None when greedy).
    pub(crate) draw: Option<Draw>,
    /// The constraint's step, when explained.
    pub(crate) constraint: Option<ConstraintStep>,
}

/// A token the decoder emitted.
pub(crate) struct Emitted<'a> {
    pub(crate) token: u32,
    /// In the processed distribution it was drawn from (1 for a forced token).
    pub(crate) probability: f32,
    /// Its index among the generated tokens.
    pub(crate) index: usize,
    /// Its position in the sequence (the tokens before it).
    pub(crate) position: usize,
    /// The text it releases.
    pub(crate) text: &'a str,
    /// Its log-probabilities (computed when the parameters ask for them, for sampled tokens).
    pub(crate) logprobs: &'a TokenLogprobs,
    /// What ended generation, if this token did.
    pub(crate) finish: Option<&'a FinishCause>,
    /// None for a forced token.
    pub(crate) sampled: Option<SampledFrom<'a>>,
}

/// One sequence's sampler, constraint and output (see the module documentation).
pub(crate) struct SeqDecoder<'t> {
    sampler: SamplerChain,
    constraint: Option<Constrained>,
    out: TokenOutput<'t>,
    /// The tokens the last [`SeqDecoder::decode`] emitted, the sampled one first.
    step_tokens: Vec<u32>,
    /// Tokens forced so far.
    forced: usize,
    tokenizer: &'t Tokenizer,
    budget: Option<BudgetState>,
    /// Something reads every logit of a step (the glass box, log-probabilities): the output
    /// head computes them all.
    reads_every_logit: bool,
    /// Keeps a constrained text closable within the tokens left (not in speculation, whose
    /// every kept token is verified).
    closing: Option<BudgetClosing>,
}

impl<'t> SeqDecoder<'t> {
    /// The decoder of choice `choice` of a generation with `params` (seeded `seed + choice`).
    pub(crate) fn new(
        tokenizer: &'t Tokenizer,
        params: &GenerateParams,
        choice: usize,
        explained: bool,
        forcing: Forcing,
    ) -> Result<SeqDecoder<'t>, EngineError> {
        let fast_forward = forcing == Forcing::WhenUnobserved && !explained;
        Ok(SeqDecoder {
            sampler: sampler_for(tokenizer, params, choice)?,
            constraint: Constrained::for_params(params, fast_forward),
            out: TokenOutput::new(tokenizer, params)?,
            step_tokens: Vec::new(),
            forced: 0,
            tokenizer,
            reads_every_logit: explained || params.top_logprobs.is_some(),
            // Speculation verifies every token it keeps: a budget's forced closing is not one.
            budget: (params.thinking_budget.as_ref())
                .filter(|_| forcing == Forcing::WhenUnobserved)
                .map(|b| BudgetState::new(tokenizer, b)),
            closing: (params.constraint.is_some() && forcing == Forcing::WhenUnobserved)
                .then(BudgetClosing::default),
        })
    }

    pub(crate) fn sampler(&self) -> &SamplerChain {
        &self.sampler
    }

    pub(crate) fn sampler_mut(&mut self) -> &mut SamplerChain {
        &mut self.sampler
    }

    /// What the next step reads of its logits: the sampler's cut, unless a constraint masks
    /// tokens (its best allowed token may lie anywhere) or something reads every logit.
    pub(crate) fn head_cut(&self) -> rill_model::HeadCut {
        if self.reads_every_logit || self.constraint.is_some() {
            return rill_model::HeadCut::Full;
        }
        self.sampler.head_cut(self.out.generated())
    }

    /// The constraint's state after the tokens taken so far.
    pub(crate) fn constraint(&self) -> Option<&Constrained> {
        self.constraint.as_ref()
    }

    /// Replaces the constraint's state (speculation: the state after the tokens it kept).
    pub(crate) fn set_constraint(&mut self, state: Constrained) {
        self.constraint = Some(state);
    }

    /// Tokens emitted so far (sampled and forced).
    pub(crate) fn generated(&self) -> usize {
        self.out.generated()
    }

    /// Tokens the constraint forced so far.
    pub(crate) fn forced(&self) -> usize {
        self.forced
    }

    /// The tokens the last [`SeqDecoder::decode`] emitted: the sampled one, then the forced.
    pub(crate) fn step_tokens(&self) -> &[u32] {
        &self.step_tokens
    }

    /// The next emitted token ends generation with [`FinishCause::ConstraintComplete`]
    /// (unless it is itself a stop).
    pub(crate) fn complete_next(&mut self) {
        self.out.complete_next();
    }

    /// One decode step from `logits`, computed after `history` (the sequence's tokens so
    /// far): samples the next token within the constraint, then takes the tokens it forces.
    /// `sink` hears each token emitted (returning `false` cancels). Returns what ended
    /// generation, if anything did; [`SeqDecoder::step_tokens`] then has the tokens emitted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decode(
        &mut self,
        params: &GenerateParams,
        context: usize,
        logits: &[f32],
        history: &[u32],
        explain: bool,
        sink: &mut dyn FnMut(Emitted<'_>) -> bool,
    ) -> Result<Option<FinishCause>, EngineError> {
        self.step_tokens.clear();
        // The thinking budget spent: its closing is forced instead of a sampled token.
        if let Some(finish) = self.force_thinking_close(params, context, history, sink)? {
            return Ok(Some(finish));
        }
        if !self.step_tokens.is_empty() {
            return Ok(None);
        }
        let left = params
            .max_tokens
            .saturating_sub(self.out.generated())
            .min((context + 1).saturating_sub(history.len()));
        let closing = self.closing_within(params, left);
        let constraint = match self.constraint.as_mut() {
            Some(c) => c.mask(&mut self.sampler, explain)?,
            None => None,
        };
        let (token, probability) = self.sampler.sample(logits, history, self.out.generated());
        if let (Some(closing), Some(c), Some(guard)) =
            (closing, self.constraint.as_ref(), self.closing.as_mut())
        {
            if !guard.admits(c, token, self.out.generated(), left) {
                // The model's token would leave no way to complete the text in time.
                let cause = FinishCause::ClosedForMaxTokens {
                    max_tokens: params.max_tokens,
                    closing: closing.len(),
                };
                return self.emit_forced(params, context, &closing, history, sink, Some(cause));
            }
        }
        self.take(token)?;
        let sampled = SampledFrom {
            logits,
            greedy: self.sampler.is_greedy(),
            draw: self.sampler.last_draw(),
            constraint,
        };
        let position = history.len();
        if let Some(finish) = self.emit_token(
            params,
            context,
            token,
            probability,
            Some(sampled),
            position,
            sink,
        ) {
            return Ok(Some(finish));
        }
        let forced = self
            .constraint
            .as_mut()
            .map(Constrained::forced)
            .unwrap_or_default();
        self.emit_forced(params, context, &forced, history, sink, None)
    }

    /// The closing to fall back on this step, with `left` tokens left (see
    /// [`crate::budget_closing`]): a text that may already end closes with an
    /// end-of-generation token.
    fn closing_within(&mut self, params: &GenerateParams, left: usize) -> Option<Vec<u32>> {
        let (Some(c), Some(guard)) = (self.constraint.as_ref(), self.closing.as_mut()) else {
            return None;
        };
        let mut closing = guard.current(c, self.out.generated(), left)?;
        // A closing may not end the answer before `min_tokens` (nor force an end-of-generation
        // token the sampler withholds until then).
        if self.out.generated() + closing.len().max(1) < params.min_tokens {
            return None;
        }
        if closing.is_empty() {
            let end = self
                .tokenizer
                .eos_id()
                .or_else(|| (self.tokenizer.end_of_generation_ids().first()).copied());
            closing.push(end.filter(|_| !params.ignore_eos)?);
        }
        Some(closing)
    }

    /// When the thinking budget is spent, emits its closing (if the constraint allows it);
    /// returns what ended generation, if a forced token did.
    fn force_thinking_close(
        &mut self,
        params: &GenerateParams,
        context: usize,
        history: &[u32],
        sink: &mut dyn FnMut(Emitted<'_>) -> bool,
    ) -> Result<Option<FinishCause>, EngineError> {
        let Some(close) = self.budget.as_mut().and_then(BudgetState::due) else {
            return Ok(None);
        };
        let allowed = match &self.constraint {
            Some(c) => {
                let mut probe = c.clone();
                close.iter().all(|&t| probe.take(t).is_ok())
            }
            None => true,
        };
        if !allowed {
            return Ok(None);
        }
        self.emit_forced(params, context, &close, history, sink, None)
    }

    /// Takes and emits `tokens` chosen without sampling (a constraint's, a thinking budget's
    /// closing, a closing for the budget); returns what ended generation, if one of them did.
    /// The last token ends generation with `last` when given.
    fn emit_forced(
        &mut self,
        params: &GenerateParams,
        context: usize,
        tokens: &[u32],
        history: &[u32],
        sink: &mut dyn FnMut(Emitted<'_>) -> bool,
        mut last: Option<FinishCause>,
    ) -> Result<Option<FinishCause>, EngineError> {
        for (i, &token) in tokens.iter().enumerate() {
            self.take(token)?;
            self.forced += 1;
            if i + 1 == tokens.len() {
                if let Some(cause) = last.take() {
                    self.out.end_next(cause);
                }
            }
            let position = history.len() + self.step_tokens.len();
            if let Some(finish) = self.emit_token(params, context, token, 1.0, None, position, sink)
            {
                return Ok(Some(finish));
            }
        }
        Ok(None)
    }

    /// Emits `token`, chosen outside [`SeqDecoder::decode`] (speculation's verdicts) with
    /// `probability` from the sampler's last distribution over `logits`, at `position`. The
    /// constraint is the caller's to advance. Returns what ended generation, if this token did.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn emit(
        &mut self,
        params: &GenerateParams,
        context: usize,
        token: u32,
        probability: f32,
        logits: &'_ [f32],
        position: usize,
        sink: &mut dyn FnMut(Emitted<'_>) -> bool,
    ) -> Option<FinishCause> {
        let sampled = SampledFrom {
            logits,
            greedy: self.sampler.is_greedy(),
            draw: None,
            constraint: None,
        };
        self.emit_token(
            params,
            context,
            token,
            probability,
            Some(sampled),
            position,
            sink,
        )
    }

    /// Advances the constraint over `token`.
    fn take(&mut self, token: u32) -> Result<(), EngineError> {
        if let Some(c) = self.constraint.as_mut() {
            if c.take(token)? {
                self.out.complete_next();
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn emit_token(
        &mut self,
        params: &GenerateParams,
        context: usize,
        token: u32,
        probability: f32,
        sampled: Option<SampledFrom<'_>>,
        position: usize,
        sink: &mut dyn FnMut(Emitted<'_>) -> bool,
    ) -> Option<FinishCause> {
        let (logits, dist) = match &sampled {
            Some(s) => (s.logits, self.sampler.distribution()),
            None => (&[][..], &[][..]),
        };
        let finish = self
            .out
            .emit(params, context, token, probability, logits, dist, position);
        self.step_tokens.push(token);
        if let Some(b) = self.budget.as_mut() {
            b.saw(self.tokenizer, token);
        }
        let keep_going = sink(Emitted {
            token,
            probability,
            index: self.out.generated() - 1,
            position,
            text: self.out.text(),
            logprobs: self.out.logprobs(),
            finish: finish.as_ref(),
            sampled,
        });
        match finish {
            Some(finish) => Some(finish),
            None if !keep_going => Some(FinishCause::Cancelled),
            None => None,
        }
    }
}
