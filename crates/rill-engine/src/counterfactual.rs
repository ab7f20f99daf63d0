//! Counterfactuals (the glass box's "what if this token were not there"): the next-token
//! distribution after a context with one earlier token dropped or replaced, next to the original.
//! Each one starts from the longest cached prefix the two contexts share, so only the positions
//! from the change on are computed.

use rill_model::{Batch, KvCache, SeqId};

use crate::logprobs::{kl_divergence, log_softmax_stats, top_logprobs};
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
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let vocab = self.model.config().vocab_size;
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
        let stats = log_softmax_stats(&original);
        let original_top = top_logprobs(&original, top.max(1));
        let tracked = tracked.unwrap_or(original_top[0].0);
        let rank_of = |logits: &[f32], t: u32| {
            let l = logits[t as usize];
            logits
                .iter()
                .enumerate()
                .filter(|&(i, &x)| x > l || (x == l && (i as u32) < t))
                .count()
        };
        let mut out = Vec::with_capacity(edits.len());
        for &(position, edit) in edits {
            let mut edited = tokens.to_vec();
            match edit {
                Edit::Drop => {
                    edited.remove(position);
                }
                Edit::Replace(t) => edited[position] = t,
            }
            let (logits, computed) = self.last_logits_in(kv, seq, &edited, prefix_caching)?;
            let edited_stats = log_softmax_stats(&logits);
            out.push(Counterfactual {
                position,
                original: tokens[position],
                edit,
                top: top_logprobs(&logits, top),
                tracked_logprob: logits[tracked as usize] - edited_stats.log_normalizer,
                tracked_rank: rank_of(&logits, tracked),
                kl: kl_divergence(&original, &logits) as f32,
                computed,
            });
        }
        Ok(Counterfactuals {
            tracked,
            top: original_top.into_iter().take(top).collect(),
            tracked_logprob: original[tracked as usize] - stats.log_normalizer,
            edits: out,
        })
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
        kv.add_sequence_for(seq, tokens.len())?;
        let hit = if prefix_caching {
            kv.attach_prefix(seq, &tokens[..tokens.len() - 1])
                .unwrap_or(0)
        } else {
            0
        };
        let room = kv
            .blocks_needed(seq, tokens.len())
            .is_ok_and(|n| n <= kv.free_blocks());
        let run = if room {
            self.model.forward(
                &Batch::prompt(seq, &tokens[hit..], hit, false),
                kv,
                self.precision,
                &mut logits,
            )
        } else {
            Ok(())
        };
        let _ = kv.remove_sequence(seq);
        run?;
        if room {
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
