//! Byte-level BPE merges (llama.cpp `llm_tokenizer_bpe_session`).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

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

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(PartialEq, Eq)]
struct Bigram {
    rank: u32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    /// Max-heap order: lowest rank first, then leftmost (llama.cpp `llm_bigram_bpe::comparator`).
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Applies the merges to one pre-tokenized, byte-encoded word and returns the final pieces as
/// slices of `word`.
pub(crate) fn merge_word<'w>(merges: &Merges, word: &'w str) -> Vec<&'w str> {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
    for (i, (start, c)) in word.char_indices().enumerate() {
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        });
    }
    let n = symbols.len();
    for (i, sym) in symbols.iter_mut().enumerate() {
        sym.next = (i + 1 < n).then_some(i + 1);
    }

    let mut queue = BinaryHeap::new();
    let try_add = |symbols: &[Symbol],
                   queue: &mut BinaryHeap<Bigram>,
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (symbols[left], symbols[right]);
        let joined = &word[l.start..r.start + r.len];
        if let Some(rank) = merges.rank(joined, l.len) {
            queue.push(Bigram {
                rank,
                left,
                right,
                size: l.len + r.len,
            });
        }
    };
    for i in 1..n {
        try_add(&symbols, &mut queue, Some(i - 1), Some(i));
    }

    while let Some(bigram) = queue.pop() {
        let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
        // Outdated entry: one side was merged away or grew since the pair was queued (symbols only
        // ever grow by absorbing their right neighbour, so the length check is the text check).
        if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
            continue;
        }
        symbols[bigram.left].len += r.len;
        symbols[bigram.right].len = 0;
        symbols[bigram.left].next = r.next;
        if let Some(nx) = r.next {
            symbols[nx].prev = Some(bigram.left);
        }
        let left_prev = symbols[bigram.left].prev;
        let left_next = symbols[bigram.left].next;
        try_add(&symbols, &mut queue, left_prev, Some(bigram.left));
        try_add(&symbols, &mut queue, Some(bigram.left), left_next);
    }

    let mut pieces = Vec::new();
    let mut cur = if n > 0 { Some(0) } else { None };
    while let Some(i) = cur {
        let s = symbols[i];
        if s.len > 0 {
            pieces.push(&word[s.start..s.start + s.len]);
        }
        cur = s.next;
    }
    pieces
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
