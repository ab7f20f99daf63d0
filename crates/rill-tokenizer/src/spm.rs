//! SentencePiece-style BPE by scores (llama.cpp `llm_tokenizer_spm_session`).

use crate::merge::merge_pieces;

/// Splits `text` (spaces already escaped to `▁`) into pieces by repeatedly merging the adjacent
/// pair whose concatenation is the highest-scoring vocabulary token. `lookup` maps a piece to its
/// `(id, score)`. Returns the final pieces as slices of `text`; pieces that are not tokens are left
/// to the caller's byte fallback.
///
/// llama.cpp's `resegment` also consults a reverse-merge map, but every merged symbol is by
/// construction a vocabulary token, so only single characters can miss the vocabulary and that
/// map never applies; it is omitted here.
pub(crate) fn merge_text(text: &str, lookup: impl Fn(&str) -> Option<(u32, f32)>) -> Vec<&str> {
    // Higher score merges first (a total order, as llama.cpp's comparator on finite scores).
    merge_pieces(text, |joined, _| {
        lookup(joined).map(|(_, score)| TotalF32(score))
    })
}

/// An f32 ordered by `total_cmp`.
#[derive(Clone, Copy, PartialEq)]
struct TotalF32(f32);

impl Eq for TotalF32 {}

impl PartialOrd for TotalF32 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for TotalF32 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_score_wins() {
        let vocab = [("ab", -1.0f32), ("bc", -0.5), ("abc", -3.0), ("a", -9.0)];
        let lookup = |s: &str| {
            vocab
                .iter()
                .position(|(t, _)| *t == s)
                .map(|i| (i as u32, vocab[i].1))
        };
        // "bc" scores higher than "ab"; "a"+"bc" -> "abc" exists.
        assert_eq!(merge_text("abc", lookup), vec!["abc"]);
        assert_eq!(merge_text("abx", lookup), vec!["ab", "x"]);
        assert_eq!(merge_text("", lookup), Vec::<&str>::new());
    }
}
