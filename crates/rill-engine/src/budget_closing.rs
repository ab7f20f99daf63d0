//! Constrained answers that end: when the tokens left (`max_tokens`, the context) come close to
//! the shortest way of completing the constrained text, the decoder keeps that way open, and
//! takes it when the model would close it off.
//!
//! Within the last [`WINDOW`] tokens of a constrained generation, each step knows a closing of
//! the current state that fits the tokens left ([`rill_constrain::TokenConstraint::closing`]).
//! The model's token is sampled as usual, then checked: if a closing still fits after it, the
//! token stands (and that closing is kept for the next step); if the closing found after it is
//! longer than the tokens left, the token is dropped and the known closing is emitted instead,
//! each token forced, the last ending generation with
//! [`crate::FinishCause::ClosedForMaxTokens`] (`finish_reason: "length"`, a complete document).
//! A search that finds nothing lets the token stand: being bounded, it proves nothing.
//! A text that may already end, and would be broken by the model's token, ends with an
//! end-of-generation token. Outside the window nothing is searched (a search costs about 1 ms on
//! average over MaskBench states, most far less, one that finds nothing the most), a closing
//! longer than the window is not looked for, and after a search that found nothing the next
//! waits [`RETRY_AFTER`] steps: such a text is cut by `max_tokens` as before.

use rill_constrain::Closing;

use crate::constrained::Constrained;

/// Tokens before the budget's end where the decoder starts keeping a closing.
pub(crate) const WINDOW: usize = 64;

/// One sequence's closing for the budget (see the module documentation).
#[derive(Debug, Default, Clone)]
pub(crate) struct BudgetClosing {
    /// A closing of the state after this many generated tokens, fitting the tokens left then.
    known: Option<(usize, Vec<u32>)>,
    /// After a search that found nothing (it spent its whole bound), the next is not before
    /// this many generated tokens.
    retry_at: usize,
}

/// Steps between searches after one found no closing.
const RETRY_AFTER: usize = 8;

impl BudgetClosing {
    /// Before sampling, with `left` tokens left (this step's included) after `generated`: a
    /// closing of the current state that fits, when inside the window (searched for if the
    /// last one was of another state).
    pub(crate) fn current(
        &mut self,
        constraint: &Constrained,
        generated: usize,
        left: usize,
    ) -> Option<Vec<u32>> {
        if left > WINDOW {
            self.known = None;
            return None;
        }
        match &self.known {
            Some((at, closing)) if *at == generated => Some(closing.clone()),
            _ if generated < self.retry_at => None,
            _ => match constraint.closing_search(left) {
                Closing::Found(closing) => {
                    self.known = Some((generated, closing.clone()));
                    Some(closing)
                }
                Closing::TooLong | Closing::NotFound => {
                    self.retry_at = generated + RETRY_AFTER;
                    None
                }
            },
        }
    }

    /// After sampling `token` at `generated` with `left` tokens left: whether it may stand.
    /// It may not when the closing found after it is longer than the tokens left then; a
    /// search that finds none says nothing (it is bounded), so the token stands.
    pub(crate) fn admits(
        &mut self,
        constraint: &Constrained,
        token: u32,
        generated: usize,
        left: usize,
    ) -> bool {
        let mut after = constraint.clone();
        if after.take(token).is_err() {
            return false;
        }
        if after.is_finished() {
            self.known = None;
            return true;
        }
        let Some(rest) = left.checked_sub(1) else {
            return false;
        };
        match after.closing_search(rest) {
            Closing::Found(closing) => {
                self.known = Some((generated + 1, closing));
                true
            }
            Closing::TooLong => false,
            Closing::NotFound => {
                self.known = None;
                self.retry_at = generated + 1 + RETRY_AFTER;
                true
            }
        }
    }
}
