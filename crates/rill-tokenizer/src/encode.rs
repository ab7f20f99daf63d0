//! Text to tokens: special tokens split out, then BPE (after the pre-tokenizer's split) or
//! SentencePiece.

use super::*;

impl Tokenizer {
    /// Tokenizes `text` without adding BOS/EOS. With `parse_special`, control-token text such as
    /// `<|im_start|>` becomes that token; user-defined tokens are always matched.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        for fragment in self
            .specials
            .partition(text, parse_special, &self.attrs, &self.tokens)
        {
            match fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text {
                    text: piece,
                    after_special,
                } => match self.model {
                    ModelKind::Bpe | ModelKind::Gemma4 => self.encode_bpe(piece, &mut out),
                    ModelKind::Spm => {
                        // llama.cpp prefixes a space to the first fragment and to every fragment
                        // that follows a special token.
                        let prefix = self.add_space_prefix && after_special;
                        self.encode_spm(piece, prefix, &mut out)
                    }
                    ModelKind::WordPiece => {
                        let lookup = |t: &str| self.token_to_id.get(t).copied();
                        for word in wordpiece::words(piece, self.normalizer) {
                            let max = self.max_token_len;
                            wordpiece::encode_word(&word, max, lookup, self.unk, &mut out);
                        }
                    }
                },
            }
        }
        out
    }

    /// Tokenizes `text`, adding BOS/EOS as the model asks (`add_bos()` / `add_eos()`) when
    /// `add_special` is set. A BOS is never doubled: if the text itself already starts with the
    /// BOS token (e.g. a chat template that renders `<bos>`, with `parse_special`), none is added;
    /// likewise for a trailing EOS.
    pub fn encode_with_special(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Vec<u32> {
        let body = self.encode(text, parse_special);
        if !add_special {
            return body;
        }
        let mut out = Vec::with_capacity(body.len() + 2);
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if body.first() != Some(&bos) {
                out.push(bos);
            }
        }
        out.extend_from_slice(&body);
        if let (true, Some(eos)) = (self.add_eos, self.eos) {
            if body.last() != Some(&eos) {
                out.push(eos);
            }
        }
        if let (true, Some(sep)) = (self.add_sep, self.sep) {
            if body.last() != Some(&sep) {
                out.push(sep);
            }
        }
        out
    }

    fn encode_bpe(&self, text: &str, out: &mut Vec<u32>) {
        let Some(pre) = self.pre else {
            return;
        };
        if !pre.byte_level() {
            // SentencePiece-style BPE (gemma4): spaces become `▁` before the split.
            return self.encode_bpe_raw(pre, &text.replace(' ', SPM_SPACE), out);
        }
        let byte_map = unicode::byte_to_char_table();
        let mut encoded = String::new();
        for word in pre.split(text) {
            encoded.clear();
            for &b in word.as_bytes() {
                encoded.push(byte_map[b as usize]);
            }
            if self.ignore_merges {
                if let Some(&id) = self.token_to_id.get(encoded.as_str()) {
                    out.push(id);
                    continue;
                }
            }
            for piece in bpe::merge_word(&self.merges, &encoded) {
                if let Some(&id) = self.token_to_id.get(piece) {
                    out.push(id);
                } else {
                    // llama.cpp looks up each *byte* of the encoded piece as a one-byte token;
                    // only ASCII bytes can be one, the rest are dropped.
                    for &b in piece.as_bytes() {
                        if b.is_ascii() {
                            let mut buf = [0u8; 4];
                            let one = (b as char).encode_utf8(&mut buf);
                            if let Some(&id) = self.token_to_id.get(&*one) {
                                out.push(id);
                            }
                        }
                    }
                }
            }
        }
    }

    /// BPE over raw UTF-8 characters (no GPT-2 byte mapping), `<0xNN>` byte fallback.
    fn encode_bpe_raw(&self, pre: PreTokenizer, escaped: &str, out: &mut Vec<u32>) {
        for word in pre.split(escaped) {
            // A run of newlines that is a token is taken whole (llama.cpp's Gemma 4 fix).
            if word.bytes().all(|b| b == b'\n') {
                if let Some(&id) = self.token_to_id.get(word) {
                    out.push(id);
                    continue;
                }
            }
            for piece in bpe::merge_word(&self.merges, word) {
                if let Some(&id) = self.token_to_id.get(piece) {
                    out.push(id);
                } else {
                    // Bytes without a `<0xNN>` token are dropped, as llama.cpp does.
                    out.extend(piece.bytes().filter_map(|b| self.byte_tokens[b as usize]));
                }
            }
        }
    }

    fn encode_spm(&self, text: &str, space_prefix: bool, out: &mut Vec<u32>) {
        let mut escaped = String::with_capacity(text.len() + 4);
        if space_prefix {
            escaped.push_str(SPM_SPACE);
        }
        for c in text.chars() {
            if c == ' ' {
                escaped.push_str(SPM_SPACE);
            } else {
                escaped.push(c);
            }
        }
        let lookup = |s: &str| {
            self.token_to_id
                .get(s)
                .map(|&id| (id, self.scores[id as usize]))
        };
        for piece in spm::merge_text(&escaped, lookup) {
            if let Some(&id) = self.token_to_id.get(piece) {
                out.push(id);
                continue;
            }
            for &b in piece.as_bytes() {
                // No byte token: llama.cpp would abort; we emit <unk> if there is one.
                if let Some(id) = self.byte_tokens[b as usize].or(self.unk) {
                    out.push(id);
                }
            }
        }
    }

    // ----- decoding -----
}
