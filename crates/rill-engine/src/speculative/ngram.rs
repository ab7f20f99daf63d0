//! Prompt lookup: drafting by finding the sequence's last few tokens earlier in the sequence
//! (prompt and output) and proposing what followed them there. Nothing is computed, so the
//! draft is free; it pays off where the output copies its input (quoting, editing, summaries
//! that reuse phrases, code).

use crate::EngineError;

/// The longest n-gram [`NgramParams::max_n`] may ask for.
pub const MAX_NGRAM: usize = 64;

/// How prompt lookup matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramParams {
    /// The longest suffix tried (n-grams of `max_n` tokens first, then shorter ones).
    pub max_n: usize,
    /// The shortest suffix tried: 1 also drafts after a single matching token.
    pub min_n: usize,
}

impl Default for NgramParams {
    /// n = 3, 2, 1.
    fn default() -> Self {
        NgramParams { max_n: 3, min_n: 1 }
    }
}

impl NgramParams {
    pub fn validate(&self) -> Result<(), EngineError> {
        if self.min_n == 0 || self.min_n > self.max_n || self.max_n > MAX_NGRAM {
            return Err(EngineError::BadParameter(format!(
                "n-gram sizes must satisfy 1 <= min ({}) <= max ({}) <= {MAX_NGRAM}",
                self.min_n, self.max_n
            )));
        }
        Ok(())
    }
}

/// Drafts up to `max_tokens` tokens after `history` into `out` (cleared): for n from
/// `params.max_n` down to `params.min_n`, the last n tokens are looked for earlier in `history`;
/// at the first n that occurs, the tokens that followed the occurrence are proposed. Of the
/// occurrences, the latest one followed by at least `max_tokens` tokens is taken, else the
/// earliest (the one followed by the most). Returns the n that matched (0: none, nothing
/// drafted).
pub fn ngram_lookup(
    history: &[u32],
    params: &NgramParams,
    max_tokens: usize,
    out: &mut Vec<u32>,
) -> usize {
    out.clear();
    let len = history.len();
    if max_tokens == 0 || params.min_n == 0 {
        return 0;
    }
    for n in (params.min_n..=params.max_n.min(len.saturating_sub(1))).rev() {
        let suffix = &history[len - n..];
        let mut found = None;
        // Every start s < len - n leaves at least one token after the occurrence.
        for s in (0..len - n).rev() {
            if history[s..s + n] == *suffix {
                found = Some(s);
                if len - (s + n) >= max_tokens {
                    break;
                }
            }
        }
        if let Some(s) = found {
            let from = s + n;
            out.extend_from_slice(&history[from..(from + max_tokens).min(len)]);
            return n;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_suffix_first_then_shorter() {
        let p = NgramParams::default();
        let mut out = Vec::new();
        // "1 2 3 9 ... 1 2 3" -> 9 follows the trigram.
        assert_eq!(
            ngram_lookup(&[1, 2, 3, 9, 8, 5, 1, 2, 3], &p, 2, &mut out),
            3
        );
        assert_eq!(out, [9, 8]);
        // Only the last token occurs before.
        assert_eq!(ngram_lookup(&[7, 4, 5, 6, 7], &p, 3, &mut out), 1);
        assert_eq!(out, [4, 5, 6]);
        // Nothing occurs before.
        assert_eq!(ngram_lookup(&[1, 2, 3], &p, 3, &mut out), 0);
        assert!(out.is_empty());
        assert_eq!(ngram_lookup(&[], &p, 3, &mut out), 0);
        assert_eq!(ngram_lookup(&[5], &p, 3, &mut out), 0);
    }
}
