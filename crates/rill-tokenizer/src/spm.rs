//! SentencePiece-style BPE by scores (llama.cpp `llm_tokenizer_spm_session`).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// Max-heap order: highest score first, then leftmost (llama.cpp `llm_bigram_spm::comparator`).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Splits `text` (spaces already escaped to `▁`) into pieces by repeatedly merging the adjacent
/// pair whose concatenation is the highest-scoring vocabulary token. `lookup` maps a piece to its
/// `(id, score)`. Returns the final pieces as slices of `text`; pieces that are not tokens are left
/// to the caller's byte fallback.
///
/// llama.cpp's `resegment` also consults a reverse-merge map, but every merged symbol is by
/// construction a vocabulary token, so only single characters can miss the vocabulary and that
/// map never applies; it is omitted here.
pub(crate) fn merge_text(text: &str, lookup: impl Fn(&str) -> Option<(u32, f32)>) -> Vec<&str> {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
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
        if let Some((_, score)) = lookup(&text[l.start..r.start + r.len]) {
            queue.push(Bigram {
                score,
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
        pieces.push(&text[s.start..s.start + s.len]);
        cur = s.next;
    }
    pieces
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
