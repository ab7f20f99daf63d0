//! Prompt lookup inside the loop ([`ServeConfig::prompt_lookup_tokens`]): before a step is
//! planned, every decoding sequence that may draft looks its last tokens up earlier in its
//! prompt and output and drafts what followed them there; the scheduler puts the drafted
//! tokens' rows after its row (room and budget allowing). After the pass, [`Loop::commit`]
//! decodes the sequence's rows in order with its own decoder, as plain decoding would, and
//! keeps a drafted token while the decoder's token on the row before it is that token: the
//! tokens, draws and log-probabilities are plain decoding's, only more of them per step.
//!
//! [`ServeConfig::prompt_lookup_tokens`]: super::super::ServeConfig::prompt_lookup_tokens

use rill_model::KvCache;

use super::requests::Seq;
use super::Loop;
use crate::speculative::{ngram_lookup, NgramParams, Probe};

/// Weight of the previous steps in [`RowCost`] after each new one.
const COST_DECAY: f64 = 0.97;

/// Weight of a sequence's earlier rounds in its [`Acceptance`] after each new one.
const ACCEPTANCE_DECAY: f64 = 0.8;

/// What a row of a decoding step costs, measured: the seconds of recent steps that only
/// decoded against their row counts, fitted by a line (exponentially weighted least squares).
/// On a small model a row is far from free (SmolLM2-135M: a sixth of a one-row step), on a
/// larger one it is nearly (the weights' bytes dominate): the fit tells which.
#[derive(Debug, Default)]
pub(super) struct RowCost {
    weight: f64,
    rows: f64,
    rows_sq: f64,
    seconds: f64,
    rows_seconds: f64,
}

impl RowCost {
    /// A step of `rows` rows, none a prompt's, took `seconds`.
    pub(super) fn observe(&mut self, rows: usize, seconds: f64) {
        let r = rows as f64;
        self.weight = self.weight * COST_DECAY + 1.0;
        self.rows = self.rows * COST_DECAY + r;
        self.rows_sq = self.rows_sq * COST_DECAY + r * r;
        self.seconds = self.seconds * COST_DECAY + seconds;
        self.rows_seconds = self.rows_seconds * COST_DECAY + r * seconds;
    }

    /// The step's seconds as `fixed + per_row · rows`: `(fixed, per_row)`, once recent steps'
    /// row counts differ enough to tell the two apart.
    pub(super) fn line(&self) -> Option<(f64, f64)> {
        let spread = self.weight * self.rows_sq - self.rows * self.rows;
        // A few steps of another row count among the recent ones are enough to tell.
        if self.weight < 4.0 || spread < 0.02 * self.weight * self.weight {
            return None;
        }
        let per_row = (self.weight * self.rows_seconds - self.rows * self.seconds) / spread;
        let per_row = per_row.max(0.0);
        let fixed = ((self.seconds - per_row * self.rows) / self.weight).max(0.0);
        Some((fixed, per_row))
    }
}

/// A sequence's record of its drafts, recent rounds weighing most: how often a draft's first
/// token was kept, and how often a drafted token was kept after the one before it was (a
/// copy goes on for a while once it starts: the second chance is the higher one). The `j`-th
/// drafted token is then kept with `first · next^(j-1)`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Acceptance {
    /// (kept, judged) of drafts' first tokens.
    first: (f64, f64),
    /// (kept, judged) of drafted tokens after a kept one.
    next: (f64, f64),
    /// When a sequence no draft is worth for drafts one token anyway.
    pub(super) probe: Probe,
}

impl Default for Acceptance {
    /// One kept and one rejected of each.
    fn default() -> Self {
        Acceptance {
            first: (1.0, 2.0),
            next: (1.0, 2.0),
            probe: Probe::default(),
        }
    }
}

impl Acceptance {
    /// A new sequence's record: this one's rates (the loop's record of every sequence's
    /// rounds) at the weight of two rounds, so that its own rounds soon outweigh them.
    pub(super) fn seed(&self) -> Acceptance {
        let (first, next) = self.rates();
        Acceptance {
            first: (2.0 * first, 2.0),
            next: (2.0 * next, 2.0),
            ..Acceptance::default()
        }
    }

    /// The chance that a draft's first token is kept, and that a drafted token is kept after
    /// a kept one.
    fn rates(&self) -> (f64, f64) {
        (self.first.0 / self.first.1, self.next.0 / self.next.1)
    }

    /// A round that drafted `drafted` tokens and kept the first `kept`.
    fn record(&mut self, drafted: usize, kept: usize) {
        let decay = |(k, n): (f64, f64), kept: usize, judged: usize| {
            (
                k * ACCEPTANCE_DECAY + kept as f64,
                n * ACCEPTANCE_DECAY + judged as f64,
            )
        };
        self.first = decay(self.first, usize::from(kept > 0), 1);
        // Tokens 2..=drafted were judged while the one before was kept.
        let judged = kept.min(drafted.saturating_sub(1));
        self.next = decay(self.next, kept.saturating_sub(1), judged);
        self.probe.judged(kept < drafted, kept == drafted);
        self.probe.busy();
    }
}

/// The longest draft worth its rows: its `j`-th token is kept with chance
/// `first · next^(j-1)`, and a kept token is worth a step's time per token (`per_token`
/// seconds, what the batch spends on each of its tokens); each drafted row costs `per_row`.
fn worth_drafting((first, next): (f64, f64), per_token: f64, per_row: f64, most: usize) -> usize {
    let (mut k, mut chance) = (0, first);
    while k < most && chance * per_token > per_row {
        k += 1;
        chance *= next;
    }
    k
}

impl Loop<'_> {
    /// Drafts for this step's decoding sequences: for each, as many tokens as are worth their
    /// rows ([`worth_drafting`], from its [`Acceptance`] and the measured [`RowCost`] at this
    /// step's count of decoding sequences; the adaptive length until a row's cost is known; where
    /// none is worth it, one now and then anyway, to notice a sequence that starts to copy),
    /// at most the configured number, within its
    /// `max_tokens` (the token after the drafts too) and the context. A sequence with a
    /// constraint (its forced tokens), an explained trace, or choices still to fork drafts
    /// nothing, nor does any with a model whose recurrent layers roll back only to snapshots.
    pub(super) fn prepare_drafts(&mut self) {
        let most = self.config.prompt_lookup_tokens;
        if most == 0 || self.kv.recurrent().is_some() {
            return;
        }
        let decoding = |s: &Seq<'_>| !s.finished && s.tokens.len() == s.computed + 1;
        let n_decoding = self
            .scheduler
            .running
            .iter()
            .filter(|s| decoding(s))
            .count();
        // A step's seconds per token at this batch, and a row's.
        let measured = self.config.prompt_lookup_measured;
        let costs = self
            .row_cost
            .line()
            .filter(|_| measured)
            .map(|(fixed, per_row)| {
                let d = n_decoding.max(1) as f64;
                ((fixed + per_row * d) / d, per_row)
            });
        let params = NgramParams::default();
        for s in &mut self.scheduler.running {
            s.draft.clear();
            if !decoding(s) || s.fork > 0 || s.decoder.constraint().is_some() {
                continue;
            }
            let Some(r) = self.requests.get(&s.req) else {
                continue;
            };
            if r.trace.explain || r.trace.full_logits {
                continue;
            }
            let left = r.params.max_tokens.saturating_sub(s.decoder.generated());
            let room = self.context.saturating_sub(s.tokens.len());
            let mut k = most.min(left.saturating_sub(1)).min(room);
            match costs {
                // Until the loop has measured what a row costs (and whenever its recent steps
                // all had as many rows): the adaptive length, which varies the row counts.
                None => k = k.min(s.draft_length.next()),
                Some((per_token, per_row)) => {
                    let worth = worth_drafting(s.acceptance.rates(), per_token, per_row, k);
                    if worth == 0 && k > 0 {
                        if !s.acceptance.probe.idle_round() {
                            continue;
                        }
                        k = 1;
                    } else {
                        k = worth;
                    }
                }
            }
            if k > 0 {
                ngram_lookup(&s.tokens, &params, k, &mut s.draft);
            }
            if s.draft.is_empty() {
                s.draft_length.adapt(0, false, true);
                s.acceptance.probe.judged(false, false);
            }
        }
    }
}

/// After a sequence's drafted tokens were decoded up to the first one not kept: the cache
/// keeps its computed positions (the rows after them are rolled back) and its record (and
/// the loop's, which new sequences start from) takes the round. `written`: positions its rows
/// filled. Where a window layer let go of what the kept positions need, the cache keeps fewer,
/// and so does `computed` (the scheduler then computes the rest again).
pub(super) fn settle_draft(
    kv: &mut KvCache,
    s: &mut Seq<'_>,
    loop_record: &mut Acceptance,
    (drafted, kept, written): (usize, usize, usize),
) {
    if s.computed < written {
        // The sequence is the loop's own: it cannot be unknown.
        if let Ok(k) = kv.truncate(s.id, s.computed) {
            s.computed = s.computed.min(k);
        }
    }
    s.acceptance.record(drafted, kept);
    loop_record.record(drafted, kept);
    s.draft_length
        .adapt(drafted, kept < drafted, kept == drafted);
    s.draft.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps of 1 and 6 rows on the line 2 ms + 1 ms a row: the fit finds it, and not before
    /// the row counts differ.
    #[test]
    fn a_rows_cost_is_the_line_through_recent_steps() {
        let mut cost = RowCost::default();
        for _ in 0..10 {
            cost.observe(1, 0.003);
        }
        assert_eq!(cost.line(), None, "one row count tells nothing");
        for _ in 0..4 {
            cost.observe(6, 0.008);
            cost.observe(1, 0.003);
        }
        let (fixed, per_row) = cost.line().unwrap();
        assert!((fixed - 0.002).abs() < 1e-9 && (per_row - 0.001).abs() < 1e-9);
    }

    /// A draft is as long as its tokens' chances pay for their rows; a record that keeps
    /// copying lengthens it, rejections shorten it.
    #[test]
    fn drafts_are_as_long_as_their_tokens_are_worth() {
        assert_eq!(worth_drafting((0.9, 0.9), 3.0, 1.0, 5), 5);
        assert_eq!(worth_drafting((0.5, 0.5), 3.0, 1.0, 5), 1);
        assert_eq!(worth_drafting((0.2, 0.9), 3.0, 1.0, 5), 0);
        // Rows nearly free (a large model): long drafts even at modest chances.
        assert_eq!(worth_drafting((0.5, 0.5), 3.0, 0.05, 8), 5);
        let mut a = Acceptance::default();
        for _ in 0..10 {
            a.record(5, 5);
        }
        let (first, next) = a.rates();
        assert!(first > 0.9 && next > 0.9, "{first} {next}");
        for _ in 0..10 {
            a.record(3, 0);
        }
        let (first, _) = a.rates();
        assert!(first < 0.2, "{first}");
        // A new sequence starts from a record's rates, at little weight.
        let seeded = Acceptance::default().seed();
        assert_eq!(seeded.rates(), (0.5, 0.5));
    }
}
