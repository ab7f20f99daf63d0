//! Byte-level BPE merges (llama.cpp `llm_tokenizer_bpe_session`).

use std::collections::HashMap;

use crate::merge::merge_pieces;

/// Merge ranks keyed by the *joined* pair text, so a lookup needs no allocation: every candidate
/// pair is a contiguous slice of the word. Several merges can join to the same text at different
/// split points ("ab c" and "a bc"), hence the `(left_len, rank)` list.
#[derive(Debug, Default)]
pub(crate) struct Merges {
    by_joined: HashMap<Box<str>, Vec<(u32, u32)>>,
}

impl Merges {
    /// Parses `tokenizer.ggml.merges` like llama.cpp: the pair is split at the first space after
    /// the first byte; lines without one are ignored (they can never match); a repeated pair keeps
    /// its first (lowest) rank.
    pub(crate) fn new(merges: &[String]) -> Merges {
        let mut by_joined: HashMap<Box<str>, Vec<(u32, u32)>> =
            HashMap::with_capacity(merges.len());
        for (rank, line) in merges.iter().enumerate() {
            let bytes = line.as_bytes();
            if bytes.len() < 2 {
                continue;
            }
            let Some(sp) = bytes[1..].iter().position(|&b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&line[..sp], &line[sp + 1..]);
            let joined: Box<str> = [left, right].concat().into_boxed_str();
            let entry = by_joined.entry(joined).or_default();
            let left_len = left.len() as u32;
            if !entry.iter().any(|&(l, _)| l == left_len) {
                entry.push((left_len, rank as u32));
            }
        }
        Merges { by_joined }
    }

    fn rank(&self, joined: &str, left_len: usize) -> Option<u32> {
        self.by_joined
            .get(joined)?
            .iter()
            .find(|&&(l, _)| l as usize == left_len)
            .map(|&(_, r)| r)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_joined.values().map(Vec::len).sum()
    }
}

pub(crate) fn merge_word<'w>(merges: &Merges, word: &'w str) -> Vec<&'w str> {
    // Lower rank merges first.
    merge_pieces(word, |joined, left_len| {
        merges.rank(joined, left_len).map(std::cmp::Reverse)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_by_rank() {
        let merges = Merges::new(&[
            "a b".to_string(),
            "ab c".to_string(),
            "b c".to_string(),
            "nospace".to_string(),
            "a b".to_string(),
        ]);
        assert_eq!(merges.len(), 3);
        assert_eq!(merge_word(&merges, "abc"), vec!["abc"]);
        assert_eq!(merge_word(&merges, "bcab"), vec!["bc", "ab"]);
        assert_eq!(merge_word(&merges, "x"), vec!["x"]);
        assert_eq!(merge_word(&merges, ""), Vec::<&str>::new());
    }

    #[test]
    fn ties_go_left_first() {
        let merges = Merges::new(&["a a".to_string()]);
        assert_eq!(merge_word(&merges, "aaa"), vec!["aa", "a"]);
    }
}
