//! Tokens to bytes and text, whole or streamed.

use super::*;

impl Tokenizer {
    /// The bytes token `id` stands for. Control and unknown tokens render as nothing unless
    /// `render_special`; user-defined tokens always render as their text; byte tokens (`<0xNN>`)
    /// are that byte; SPM `▁` is a space; byte-level BPE text is mapped back to raw bytes.
    pub fn token_to_bytes(&self, id: u32, render_special: bool) -> Result<Cow<'_, [u8]>> {
        let i = id as usize;
        let (Some(text), Some(&a)) = (self.tokens.get(i), self.attrs.get(i)) else {
            return Err(TokenizerError::InvalidTokenId {
                id,
                vocab_size: self.tokens.len(),
            });
        };
        if !render_special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Ok(Cow::Borrowed(&[]));
        }
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return Ok(Cow::Borrowed(text.as_bytes()));
        }
        if a & attr::NORMAL != 0 {
            return Ok(match self.model {
                ModelKind::Spm | ModelKind::Gemma4 | ModelKind::WordPiece => {
                    if text.contains(SPM_SPACE) {
                        Cow::Owned(text.replace(SPM_SPACE, " ").into_bytes())
                    } else {
                        Cow::Borrowed(text.as_bytes())
                    }
                }
                ModelKind::Bpe => {
                    let mut bytes = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match unicode::char_to_byte(c) {
                            Some(b) => bytes.push(b),
                            // Not a byte-level character (a malformed vocabulary): keep it as text.
                            None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    Cow::Owned(bytes)
                }
            });
        }
        if a & attr::BYTE != 0 {
            return Ok(match parse_byte_token(text) {
                Some(b) => Cow::Owned(vec![b]),
                None => Cow::Borrowed(&[]),
            });
        }
        Ok(Cow::Borrowed(&[]))
    }

    /// Decodes ids to text; control tokens are omitted. Invalid UTF-8 (e.g. a sequence cut off at
    /// the end) becomes U+FFFD. Ids outside the vocabulary are skipped.
    ///
    /// Like llama.cpp's `llama_detokenize`, when the model adds a space prefix (SPM), one leading
    /// space of the first token is removed.
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_with(ids, false)
    }

    /// [`Tokenizer::decode`], optionally rendering control tokens as their text.
    pub fn decode_with(&self, ids: &[u32], render_special: bool) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            if let Ok(piece) = self.token_to_bytes(id, render_special) {
                bytes.extend_from_slice(self.strip_first(&piece, i == 0));
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Removes the artificial leading space of the first token when the model adds one.
    pub(crate) fn strip_first<'p>(&self, piece: &'p [u8], first: bool) -> &'p [u8] {
        if first && self.add_space_prefix {
            piece.strip_prefix(b" ").unwrap_or(piece)
        } else {
            piece
        }
    }

    /// An incremental decoder for streaming generation (control tokens omitted).
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, false)
    }

    /// An incremental decoder that renders control tokens when `render_special`.
    pub fn stream_decoder_with(&self, render_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, render_special)
    }

    // ----- end of generation -----
}
