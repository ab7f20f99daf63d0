//! The merge loop both BPE flavours share: start from one symbol per character and repeatedly
//! join the adjacent pair with the best priority (ties: the leftmost pair), as llama.cpp's
//! `llm_tokenizer_bpe_session` (priority: merge rank) and `llm_tokenizer_spm_session` (priority:
//! vocabulary score) do.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram<P> {
    priority: P,
    left: usize,
    right: usize,
    /// Bytes of the pair when it was queued: a pair whose sides changed since is stale.
    size: usize,
}

impl<P: Ord> PartialEq for Bigram<P> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<P: Ord> Eq for Bigram<P> {}

impl<P: Ord> Ord for Bigram<P> {
    /// Max-heap order: the greatest priority first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl<P: Ord> PartialOrd for Bigram<P> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Splits `text` into pieces by merging adjacent symbols. `priority(joined, left_len)` says
/// whether the two symbols whose concatenation is `joined` (the left one `left_len` bytes long)
/// may merge, and how urgently (greater merges first). Returns the pieces as slices of `text`.
pub(crate) fn merge_pieces<P: Ord>(
    text: &str,
    priority: impl Fn(&str, usize) -> Option<P>,
) -> Vec<&str> {
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
                   queue: &mut BinaryHeap<Bigram<P>>,
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (symbols[left], symbols[right]);
        if let Some(priority) = priority(&text[l.start..r.start + r.len], l.len) {
            queue.push(Bigram {
                priority,
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
    let mut cur = (n > 0).then_some(0);
    while let Some(i) = cur {
        let s = symbols[i];
        pieces.push(&text[s.start..s.start + s.len]);
        cur = s.next;
    }
    pieces
}
