//! Incremental detokenization for streaming output.

use crate::Tokenizer;

/// Turns generated token ids into text as they arrive.
///
/// Byte-level tokens routinely split a multi-byte character (an emoji is often 2-4 tokens), so a
/// token's bytes are held back until they complete a UTF-8 sequence; [`StreamDecoder::push`]
/// returns only whole characters. Bytes that can never become valid UTF-8 are replaced by U+FFFD
/// exactly where [`String::from_utf8_lossy`] would put one, so the concatenation of everything
/// returned by `push` and [`StreamDecoder::finish`] equals [`Tokenizer::decode_with`] of all ids.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    render_special: bool,
    pending: Vec<u8>,
    first: bool,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer, render_special: bool) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            render_special,
            pending: Vec::new(),
            first: true,
        }
    }

    /// For tokens that continue a prompt (generation): the first pushed token is not the start
    /// of the text, so its leading space is kept even when the model adds a space prefix.
    pub fn continuing(mut self) -> StreamDecoder<'a> {
        self.first = false;
        self
    }

    /// Adds one token; returns the text that became complete (possibly empty). Ids outside the
    /// vocabulary are ignored, as in [`Tokenizer::decode`].
    pub fn push(&mut self, id: u32) -> String {
        let first = std::mem::replace(&mut self.first, false);
        if let Ok(piece) = self.tokenizer.token_to_bytes(id, self.render_special) {
            let piece = self.tokenizer.strip_first(&piece, first);
            self.pending.extend_from_slice(piece);
        }
        self.drain_complete()
    }

    /// Bytes held back waiting for the rest of a UTF-8 sequence.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    /// Flushes whatever is held back (an incomplete sequence becomes U+FFFD) and resets the
    /// decoder for a new stream.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.first = true;
        out
    }

    fn drain_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is valid UTF-8 by the error's contract.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // A definitely invalid sequence: replace it, like from_utf8_lossy.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }
}
