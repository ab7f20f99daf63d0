//! How one step's prompt rows are shared among the sequences still reading their prompts.
//!
//! Shortest remaining prompt first: the next turn of a conversation (its history found in the
//! prefix cache, a few new tokens to read) gets its first token in a step or two instead of
//! waiting behind another client's long first message, which a step that also decodes takes
//! only a few rows of at a time. So that a long prompt is never starved by a stream of short
//! ones, the oldest prefilling sequence takes at least a quarter of the rows whenever others
//! share the step.

/// Share of a step's prompt rows the oldest prefilling sequence is sure of (1 / this).
const OLDEST_SHARE: usize = 4;

/// Rows each prefilling sequence takes this step, out of `budget`: `left[i]` is the prompt
/// rows sequence `i` still has to read (in admission order, so `left[0]` is the oldest's),
/// and `out` gets `(i, rows)` for each that takes any, shortest first (ties in admission
/// order). Takes `min(budget, Σ left)` rows in all, none past a sequence's `left`.
pub(super) fn share_prompt_rows(left: &[usize], budget: usize, out: &mut Vec<(usize, usize)>) {
    out.clear();
    let Some(&oldest_left) = left.first() else {
        return;
    };
    // The oldest's sure rows, set aside while the others are served shortest first.
    let sure = if left.len() > 1 {
        oldest_left.min(budget / OLDEST_SHARE)
    } else {
        0
    };
    // Shortest first, in `out` itself (no allocation per step); a stable sort keeps ties in
    // admission order.
    out.extend(left.iter().copied().enumerate());
    out.sort_by_key(|&(_, l)| l);
    let mut free = budget - sure;
    for (i, rows) in out.iter_mut() {
        let extra = if *i == 0 { sure } else { 0 };
        let take = (*rows - extra).min(free) + extra;
        free -= take - extra;
        *rows = take;
    }
    out.retain(|&(_, rows)| rows > 0);
}

#[cfg(test)]
mod tests {
    use super::share_prompt_rows;
    use proptest::prelude::*;

    fn shared(left: &[usize], budget: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        share_prompt_rows(left, budget, &mut out);
        out
    }

    #[test]
    fn a_short_prompt_goes_before_a_long_one_that_came_first() {
        // 32 rows: the oldest is sure of 8, the 5-row prompt reads whole, the rest is the
        // oldest's again.
        assert_eq!(shared(&[4000, 5], 32), vec![(1, 5), (0, 27)]);
        assert_eq!(shared(&[4000, 40, 5], 32), vec![(2, 5), (1, 19), (0, 8)]);
        // Alone, a prompt takes every row it can.
        assert_eq!(shared(&[4000], 32), vec![(0, 32)]);
        assert_eq!(shared(&[3], 32), vec![(0, 3)]);
        assert_eq!(shared(&[], 32), vec![]);
        // Equal prompts keep admission order.
        assert_eq!(shared(&[10, 10, 10], 25), vec![(0, 10), (1, 10), (2, 5)]);
    }

    proptest! {
        #[test]
        fn every_row_is_used_none_is_overgiven_and_the_oldest_progresses(
            left in proptest::collection::vec(1usize..200, 0..8),
            budget in 0usize..300,
        ) {
            let out = shared(&left, budget);
            let total: usize = out.iter().map(|&(_, r)| r).sum();
            prop_assert_eq!(total, budget.min(left.iter().sum()));
            let mut seen = vec![false; left.len()];
            for &(i, rows) in &out {
                prop_assert!(!seen[i] && rows > 0 && rows <= left[i]);
                seen[i] = true;
            }
            if let Some(&oldest) = left.first() {
                let sure = if left.len() > 1 { oldest.min(budget / 4) } else { oldest.min(budget) };
                let got = out.iter().find(|&&(i, _)| i == 0).map_or(0, |&(_, r)| r);
                prop_assert!(got >= sure, "oldest got {} < {}", got, sure);
            }
            // Shortest first: a sequence other than the oldest that got less than it had
            // left was outranked only by shorter (or equal and older) ones.
            for &(i, rows) in &out {
                if i != 0 && rows < left[i] {
                    for (j, &l) in left.iter().enumerate().skip(1) {
                        if l < left[i] || (l == left[i] && j < i) {
                            let got = out.iter().find(|&&(k, _)| k == j).map_or(0, |&(_, r)| r);
                            prop_assert_eq!(got, l);
                        }
                    }
                }
            }
        }
    }
}
