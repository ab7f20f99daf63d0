//! A sequence's structured-output constraint, the one API every generation path uses (through
//! [`crate::decoder::SeqDecoder`], and speculation's drafts and verdicts): the constraint's mask
//! restricts the sampler before any other stage, the chosen token advances it, a complete text
//! ends generation, and the tokens it forces may be appended without sampling.

use rill_constrain::TokenConstraint;

use crate::{EngineError, GenerateParams, SamplerChain};

/// A constrained step, as the glass box shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstraintStep {
    /// The kind of constraint (`json_schema`, `regex`, ...).
    pub kind: &'static str,
    /// Tokens it allowed (1: it forced the token).
    pub allowed: usize,
    /// The allowed tokens as bits (token `t` is bit `t % 32` of word `t / 32`).
    pub mask: Vec<u32>,
}

#[derive(Clone)]
pub(crate) struct Constrained {
    state: TokenConstraint,
    /// Forced tokens are appended without sampling. Off when each token's log-probabilities
    /// or explanation is asked for: those need the token's own logits, so forced tokens are
    /// then sampled like any other (from a mask that allows only them).
    fast_forward: bool,
}

impl Constrained {
    /// The constraint of a generation with `params`, at its start; `fast_forward` when forced
    /// tokens may skip sampling (never when log-probabilities are asked for).
    pub(crate) fn for_params(params: &GenerateParams, fast_forward: bool) -> Option<Constrained> {
        params.constraint.as_ref().map(|grammar| Constrained {
            state: grammar.start(),
            fast_forward: fast_forward && params.top_logprobs.is_none(),
        })
    }

    /// Whether `token` may come next.
    pub(crate) fn allows(&mut self, token: u32) -> Result<bool, EngineError> {
        Ok(self.state.allows(token)?)
    }

    /// Whether the text is complete with nothing allowed after it.
    pub(crate) fn is_finished(&self) -> bool {
        self.state.is_finished()
    }

    /// Restricts `sampler`'s next step to the allowed tokens (nothing while a lazy constraint
    /// waits for its trigger). With `explain`, returns the step as the glass box shows it.
    pub(crate) fn mask(
        &mut self,
        sampler: &mut SamplerChain,
        explain: bool,
    ) -> Result<Option<ConstraintStep>, EngineError> {
        let kind = self.state.kind();
        let Some(allowed) = self.state.allowed_if_started()? else {
            return Ok(None);
        };
        sampler.mask_next(allowed);
        Ok(explain.then(|| ConstraintStep {
            kind,
            allowed: allowed.iter().map(|w| w.count_ones() as usize).sum(),
            mask: allowed.to_vec(),
        }))
    }

    /// Advances over `token`; returns whether the text is now complete with nothing allowed
    /// after it (generation ends there).
    pub(crate) fn take(&mut self, token: u32) -> Result<bool, EngineError> {
        self.state.commit(token)?;
        Ok(self.state.is_finished())
    }

    /// The tokens forced from here (none unless fast-forwarding), not yet taken.
    pub(crate) fn forced(&mut self) -> Vec<u32> {
        if self.fast_forward {
            self.state.forced()
        } else {
            Vec::new()
        }
    }

    /// Tokens that complete the text from here, at most `max_tokens` of them, or why there are
    /// none (see [`rill_constrain::TokenConstraint::closing_search`]).
    pub(crate) fn closing_search(&self, max_tokens: usize) -> rill_constrain::Closing {
        self.state.closing_search(max_tokens)
    }
}
