//! A short way to end a constrained text from where it stands ([`TokenConstraint::closing`]):
//! what a decoder forces when the tokens left would otherwise cut the text mid-document.
//!
//! llguidance does not say how far a state is from acceptance, so this searches for it: a
//! depth-first walk over single-byte tokens, bounded in depth and in work. Where the grammar
//! forces its next bytes (a required key, the rest of an enum value), only those are tried;
//! elsewhere the bytes go in an order that ends things before it starts them: a string's quote,
//! a container's closing bracket, then separators and other punctuation, digits, letters, and
//! opening brackets last. The bytes found are then tokenized (the tokenizer's split, else the
//! vocabulary trie's greedy one) and the shortest split the grammar takes to an accepting state
//! is the closing. It is a short closing, not always the shortest: `-0` may come where `0`
//! would do.

use llguidance::toktrie::TokEnv;
use llguidance::Matcher;

use crate::TokenConstraint;

/// Bytes of closing text the search explores at most (a deeply nested document with many
/// required keys left); beyond it, no closing is offered.
const MAX_CLOSING_BYTES: usize = 1_024;

/// Tokens the search may try in all (each one advance of the parser), so a grammar whose
/// every short path is a dead end costs a bounded time (a few milliseconds) and then gives up.
const SEARCH_FUEL: usize = 8_192;

/// The order in which bytes are tried where the grammar leaves a choice (see the module
/// documentation).
fn byte_order() -> Vec<u8> {
    let mut order: Vec<u8> = b"\"}])>'`".to_vec();
    order.extend_from_slice(b",:.-+/!#$%&*;=?@\\^_|~");
    order.extend(b'0'..=b'9');
    order.extend(b'a'..=b'z');
    order.extend(b'A'..=b'Z');
    order.extend_from_slice(b" \n\t\r{[(<");
    // A text that stops inside a UTF-8 character (a byte-level token of a CJK character or an
    // emoji) continues with its continuation bytes.
    order.extend(0x80u8..=0xBF);
    order
}

/// What a search for a closing found ([`TokenConstraint::closing_search`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closing {
    /// Tokens that complete the text, at most the tokens asked for (none: it may end here).
    Found(Vec<u32>),
    /// A closing was found, but none of its tokenizations fits the tokens asked for.
    TooLong,
    /// The bounded search found no way to complete the text (it may still have one), or the
    /// constraint waits for its trigger, or its state failed.
    NotFound,
}

impl TokenConstraint {
    /// Tokens that take the text from here to one the constraint accepts (a complete JSON
    /// document, a full match), at most `max_tokens` of them; `Some(vec![])` when the text
    /// may already end. `None` when the search finds no closing that fits (or the constraint
    /// waits for its trigger, or its state failed). Nothing is committed.
    pub fn closing(&self, max_tokens: usize) -> Option<Vec<u32>> {
        match self.closing_search(max_tokens) {
            Closing::Found(tokens) => Some(tokens),
            Closing::TooLong | Closing::NotFound => None,
        }
    }

    /// [`TokenConstraint::closing`], saying why there is none: a closing longer than
    /// `max_tokens`, or none found.
    pub fn closing_search(&self, max_tokens: usize) -> Closing {
        if self.is_waiting() || self.matcher.is_error() {
            return Closing::NotFound;
        }
        let mut start = self.matcher.clone();
        if start.is_stopped() || start.is_accepting().unwrap_or(false) {
            return Closing::Found(Vec::new());
        }
        if max_tokens == 0 {
            return Closing::TooLong;
        }
        let Ok(env) = start.tok_env() else {
            return Closing::NotFound;
        };
        let byte_tokens = self.byte_tokens.get_or_init(|| {
            byte_order()
                .into_iter()
                .filter_map(|b| byte_token(&env, b).map(|t| (b, t)))
                .collect()
        });
        let mut search = Search {
            byte_tokens,
            fuel: SEARCH_FUEL,
            bytes: Vec::new(),
        };
        let mut walker = start;
        if !search.walk(&mut walker, MAX_CLOSING_BYTES) {
            return Closing::NotFound;
        }
        shortest_split(&env, self, &search.bytes, byte_tokens, max_tokens)
    }
}

/// The token of the single byte `b`: the tokenizer's own (a vocabulary with byte-fallback
/// tokens also holds `<0x20>` beside `▁`, and masks allow only the tokenizer's), else the trie's.
fn byte_token(env: &TokEnv, b: u8) -> Option<u32> {
    match env.tokenize_bytes(&[b])[..] {
        [t] => Some(t),
        _ => env.tok_trie().token_id(&[b]),
    }
}

struct Search<'a> {
    byte_tokens: &'a [(u8, u32)],
    fuel: usize,
    /// The closing's bytes so far.
    bytes: Vec<u8>,
}

impl Search<'_> {
    /// Extends `self.bytes` from `m`'s state until it accepts, within `depth` more bytes; on
    /// failure `m` and the bytes are as they were.
    fn walk(&mut self, m: &mut Matcher, depth: usize) -> bool {
        if m.is_accepting().unwrap_or(false) {
            return true;
        }
        if depth == 0 || self.fuel == 0 || m.is_stopped() {
            return false;
        }
        let forced = m.compute_ff_bytes();
        let only: Option<u8> = forced.first().copied();
        for &(byte, token) in self.byte_tokens {
            if only.is_some_and(|f| f != byte) {
                continue;
            }
            // A byte a third time in a row is a loop the grammar allows (`a---`, `}}}` inside a
            // string): the search looks elsewhere unless the grammar forces it.
            if only.is_none() && self.bytes.ends_with(&[byte, byte]) {
                continue;
            }
            if self.fuel == 0 {
                return false;
            }
            self.fuel -= 1;
            if m.try_consume_tokens(&[token]).ok() != Some(1) {
                continue;
            }
            self.bytes.push(byte);
            if self.walk(m, depth - 1) {
                return true;
            }
            self.bytes.pop();
            if m.rollback(1).is_err() {
                return false;
            }
        }
        false
    }
}

/// The fewest tokens spelling `bytes`, at most `max_tokens`, that take `from` to an accepting
/// state, each allowed by its mask (a token can pass the parser's check yet be left out of the
/// mask, which admits only the splits the tokenizer could produce): the tokenizer's split, the
/// trie's greedy one, or one token per byte.
fn shortest_split(
    env: &TokEnv,
    from: &TokenConstraint,
    bytes: &[u8],
    byte_tokens: &[(u8, u32)],
    max_tokens: usize,
) -> Closing {
    let per_byte: Option<Vec<u32>> = bytes
        .iter()
        .map(|b| byte_tokens.iter().find(|(x, _)| x == b).map(|&(_, t)| t))
        .collect();
    let mut splits = vec![
        env.tokenize_bytes(bytes),
        env.tok_trie().greedy_tokenize(bytes),
    ];
    splits.extend(per_byte);
    splits.sort_by_key(Vec::len);
    splits.dedup();
    // Each token checked costs a mask over the vocabulary: splits that could not fit are not
    // checked at all.
    if splits.first().is_none_or(|s| s.len() > max_tokens) {
        return Closing::TooLong;
    }
    splits
        .into_iter()
        .filter(|split| split.len() <= max_tokens)
        .find(|split| {
            let mut probe = from.clone();
            split.iter().all(|&t| probe.commit(t).is_ok()) && probe.is_accepting()
        })
        .map_or(Closing::NotFound, Closing::Found)
}
