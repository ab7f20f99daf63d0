//! Counterfactuals (the glass box's "what if this token were not there"): the next-token
//! distribution after a context with one earlier token dropped or replaced, next to the original.
//! Each one starts from the longest cached prefix the two contexts share, so only the positions
//! from the change on are computed.

use rill_model::{Batch, KvCache, SeqId};

use crate::engine::start_from_prefix;
use crate::logprobs::{kl_divergence, log_softmax_stats, rank_of, top_logprobs};
use crate::{CacheLease, Engine, EngineError};

/// Most edits one call computes.
pub const MAX_COUNTERFACTUALS: usize = 32;

/// What to do to one position of the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    /// Remove the token (every later token moves one position earlier).
    Drop,
    /// Put this token in its place.
    Replace(u32),
}

/// The distribution after one edited context.
#[derive(Debug, Clone, PartialEq)]
pub struct Counterfactual {
    pub position: usize,
    /// The token the edit removed or replaced.
    pub original: u32,
    pub edit: Edit,
    /// The most likely tokens after the edited context, with natural-log probabilities.
    pub top: Vec<(u32, f32)>,
    /// The tracked token's log-probability and rank (0: most likely) after the edit.
    pub tracked_logprob: f32,
    pub tracked_rank: usize,
    /// KL(original ‖ edited), nats: how much the edit moved the whole distribution.
    pub kl: f32,
    /// Positions computed for this edit (the rest came from the prefix cache).
    pub computed: usize,
}

/// The original distribution and every edit's.
#[derive(Debug, Clone, PartialEq)]
pub struct Counterfactuals {
    /// The token whose probability is followed (given, or the original's most likely).
    pub tracked: u32,
    pub top: Vec<(u32, f32)>,
    pub tracked_logprob: f32,
    pub edits: Vec<Counterfactual>,
}

/// `tokens` with `edit` applied at `position` (which must be one of its positions).
pub fn apply_edit(tokens: &[u32], position: usize, edit: Edit) -> Vec<u32> {
    let mut edited = tokens.to_vec();
    match edit {
        Edit::Drop => {
            edited.remove(position);
        }
        Edit::Replace(t) => edited[position] = t,
    }
    edited
}

/// The most likely token of `logits` (ties: the lower id).
fn argmax_of(logits: &[f32]) -> u32 {
    top_logprobs(logits, 1).first().map_or(0, |&(t, _)| t)
}

impl Counterfactual {
    /// The reading of one edit from the logits after the original context and after the edited
    /// one, following `tracked`.
    #[allow(clippy::too_many_arguments)]
    pub fn from_logits(
        tokens: &[u32],
        position: usize,
        edit: Edit,
        original: &[f32],
        edited: &[f32],
        tracked: u32,
        top: usize,
        computed: usize,
    ) -> Counterfactual {
        let stats = log_softmax_stats(edited);
        let l = edited[tracked as usize];
        let tracked_rank = rank_of(edited, tracked);
        Counterfactual {
            position,
            original: tokens[position],
            edit,
            top: top_logprobs(edited, top),
            tracked_logprob: l - stats.log_normalizer,
            tracked_rank,
            kl: kl_divergence(original, edited) as f32,
            computed,
        }
    }
}

impl Counterfactuals {
    /// The original distribution's part: `tracked` (its most likely token when None) and the
    /// `top` most likely tokens.
    pub fn new(original: &[f32], tracked: Option<u32>, top: usize) -> Counterfactuals {
        let tracked = tracked.unwrap_or_else(|| argmax_of(original));
        Counterfactuals {
            tracked,
            top: top_logprobs(original, top),
            tracked_logprob: original[tracked as usize]
                - log_softmax_stats(original).log_normalizer,
            edits: Vec::new(),
        }
    }
}

/// Checks edits against a context of `tokens` and a vocabulary of `vocab` tokens.
pub fn check_edits(
    tokens: &[u32],
    edits: &[(usize, Edit)],
    vocab: usize,
) -> Result<(), EngineError> {
    if tokens.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if edits.len() > MAX_COUNTERFACTUALS {
        return Err(EngineError::BadParameter(format!(
            "at most {MAX_COUNTERFACTUALS} edits at once, got {}",
            edits.len()
        )));
    }
    for &(position, edit) in edits {
        if position >= tokens.len() {
            return Err(EngineError::BadParameter(format!(
                "position {position} is past the context's {} tokens",
                tokens.len()
            )));
        }
        match edit {
            Edit::Drop if tokens.len() < 2 => {
                return Err(EngineError::BadParameter(
                    "dropping the only token would leave nothing to predict from".into(),
                ))
            }
            Edit::Replace(t) if t as usize >= vocab => {
                return Err(EngineError::TokenOutOfVocab {
                    what: "replacement",
                    token: t,
                    vocab_size: vocab,
                })
            }
            _ => {}
        }
    }
    Ok(())
}

impl Engine {
    /// The next-token distribution after `tokens` and after each edit of it (`(position, edit)`),
    /// with the `top` most likely tokens of each and the probability of `tracked` (the
    /// original's most likely token when None). Computed with the engine's precision in the
    /// lent cache, from its prefix cache; nothing is published (the edited contexts are not
    /// anyone's), and the lent sequence is removed again.
    pub fn counterfactuals(
        &mut self,
        lease: CacheLease<'_>,
        tokens: &[u32],
        edits: &[(usize, Edit)],
        tracked: Option<u32>,
        top: usize,
    ) -> Result<Counterfactuals, EngineError> {
        let vocab = self.model.config().vocab_size;
        check_edits(tokens, edits, vocab)?;
        if let Some(t) = tracked.filter(|&t| t as usize >= vocab) {
            return Err(EngineError::TokenOutOfVocab {
                what: "tracked token",
                token: t,
                vocab_size: vocab,
            });
        }
        let CacheLease {
            kv,
            seq,
            prefix_caching,
        } = lease;
        let (original, _) = self.last_logits_in(kv, seq, tokens, prefix_caching)?;
        let mut result = Counterfactuals::new(&original, tracked, top.max(1));
        result.top.truncate(top);
        for &(position, edit) in edits {
            let edited = apply_edit(tokens, position, edit);
            let (logits, computed) = self.last_logits_in(kv, seq, &edited, prefix_caching)?;
            result.edits.push(Counterfactual::from_logits(
                tokens,
                position,
                edit,
                &original,
                &logits,
                result.tracked,
                top,
                computed,
            ));
        }
        Ok(result)
    }

    /// The logits after `tokens`, computed as sequence `seq` of `kv` from its longest cached
    /// prefix (or in a cache of its own where `kv` has no room), and the positions computed.
    /// The sequence is removed again; nothing is published.
    fn last_logits_in(
        &mut self,
        kv: &mut KvCache,
        seq: SeqId,
        tokens: &[u32],
        prefix_caching: bool,
    ) -> Result<(Vec<f32>, usize), EngineError> {
        let mut logits = Vec::new();
        if let Some(hit) = start_from_prefix(kv, seq, tokens, prefix_caching)? {
            let run = self.model.forward(
                &Batch::prompt(seq, &tokens[hit..], hit, false),
                kv,
                self.precision,
                &mut logits,
            );
            let _ = kv.remove_sequence(seq);
            run?;
            return Ok((logits, tokens.len() - hit));
        }
        let mut own = self.model.new_kv_cache(tokens.len(), self.precision)?;
        own.add_sequence(0)?;
        self.model.forward(
            &Batch::prompt(0, tokens, 0, false),
            &mut own,
            self.precision,
            &mut logits,
        )?;
        Ok((logits, tokens.len()))
    }
}
