//! The model's vocabulary as llguidance sees it: a trie of every token's bytes, built from rill's
//! own tokenizer, and that tokenizer for the text the grammar forces.

use std::sync::Arc;

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use rill_tokenizer::{TokenType, Tokenizer};

/// rill's tokenizer behind llguidance's tokenizer interface.
pub(crate) struct Vocab {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
    /// The tokenizer splits any text as the model was trained to see it, so a forced string
    /// tokenized by it is the canonical sequence. Not so when SentencePiece adds a space in
    /// front of every text it is given: then forced bytes go through the trie's greedy split.
    canonical: bool,
}

impl Vocab {
    pub(crate) fn new(tokenizer: Arc<Tokenizer>) -> Vocab {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| token_bytes(&tokenizer, id))
            .collect();
        let eog = tokenizer.end_of_generation_ids();
        let eos = tokenizer
            .eos_id()
            .or_else(|| eog.first().copied())
            .unwrap_or(0);
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: eos,
            tok_bos: tokenizer.bos_id(),
            tok_pad: tokenizer.pad_id(),
            tok_unk: tokenizer.unk_id(),
            tok_end_of_turn: tokenizer.eot_id(),
        };
        let mut ends: Vec<TokenId> = eog.to_vec();
        if !ends.contains(&eos) {
            ends.push(eos);
        }
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
        let canonical = !tokenizer.add_space_prefix();
        Vocab {
            tokenizer,
            trie,
            canonical,
        }
    }
}

/// What the trie holds for token `id`: the bytes it decodes to; control and unknown tokens as
/// llguidance's special-token form (`0xFF` then their text), so no text can spell them and a
/// grammar names them as `<|im_end|>`; nothing for tokens that decode to nothing (never allowed).
fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    match tokenizer.token_type(id) {
        Some(TokenType::Control | TokenType::Unknown) => {
            let text = tokenizer.token_text(id).unwrap_or("");
            if text.is_empty() {
                return Vec::new();
            }
            let mut bytes = Vec::with_capacity(text.len() + 1);
            bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
            bytes.extend_from_slice(text.as_bytes());
            bytes
        }
        _ => tokenizer
            .token_to_bytes(id, false)
            .map(|b| b.into_owned())
            .unwrap_or_default(),
    }
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if !self.canonical {
            return self.trie.greedy_tokenize(s);
        }
        // Text that is not UTF-8 (a forced prefix can end inside a character) is split by the
        // tokenizer up to the last whole character, the rest greedily by the trie.
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false),
            Err(e) => {
                let (valid, rest) = s.split_at(e.valid_up_to());
                let text = std::str::from_utf8(valid).unwrap_or("");
                let mut ids = self.tokenizer.encode(text, false);
                ids.extend(self.trie.greedy_tokenize(rest));
                ids
            }
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}
