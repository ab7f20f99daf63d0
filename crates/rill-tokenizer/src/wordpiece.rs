//! WordPiece (`tokenizer.ggml.model = bert`), as llama.cpp's `llm_tokenizer_wpm_session` runs it:
//! BERT's normalizer (NFD and accents dropped, lower case, as the file says), words split at
//! white space and around punctuation, ASCII symbols and CJK ideographs, then each word matched
//! greedily by its longest vocabulary prefix. The converter writes a word's first piece with a
//! leading `▁` and its continuations (BERT's `##` pieces) bare, so a word is matched as `▁word`.

use unicode_normalization::UnicodeNormalization;

use crate::unicode;

/// BERT's normalizer switches (`tokenizer.ggml.normalizer.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Normalizer {
    pub lowercase: bool,
    pub strip_accents: bool,
}

/// The words of `text` after BERT's normalizer and pre-tokenizer (llama.cpp's `preprocess`).
pub(crate) fn words(text: &str, normalizer: Normalizer) -> Vec<String> {
    let chars: Vec<char> = if normalizer.strip_accents {
        text.nfd().collect()
    } else {
        text.chars().collect()
    };
    let mut words = vec![String::new()];
    for c in chars {
        let flags = unicode::flags(c);
        if flags & unicode::WHITESPACE != 0 {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if c == '\0' || c == '\u{FFFD}' || flags & unicode::CONTROL != 0 {
            continue;
        }
        if normalizer.strip_accents && flags & unicode::MARK != 0 {
            continue;
        }
        let c = if normalizer.lowercase {
            // llama.cpp's table maps one code point to one; where Unicode's lower case is
            // longer (U+0130), its first code point.
            c.to_lowercase().next().unwrap_or(c)
        } else {
            c
        };
        let alone = flags & unicode::PUNCT != 0
            || ((c as u32) < 0x7F && flags & unicode::SYMBOL != 0)
            || is_cjk_ideograph(c as u32);
        let last = words.last_mut().expect("never empty");
        if alone {
            if !last.is_empty() {
                words.push(String::new());
            }
            let last = words.last_mut().expect("never empty");
            last.push(c);
            words.push(String::new());
        } else {
            last.push(c);
        }
    }
    if words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    words
}

/// The CJK ideograph blocks BERT splits one by one (as HF tokenizers' Rust code has them:
/// Extension C starts at U+2B920 there).
fn is_cjk_ideograph(cp: u32) -> bool {
    matches!(cp,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// Appends the ids of one word: from its start, the longest vocabulary piece of at most
/// `max_len` bytes, again and again; a word with a position no piece starts at becomes `unk`
/// whole (nothing at all without an unknown token).
pub(crate) fn encode_word(
    word: &str,
    max_len: usize,
    lookup: impl Fn(&str) -> Option<u32>,
    unk: Option<u32>,
    out: &mut Vec<u32>,
) {
    let word = format!("\u{2581}{word}");
    let start_len = out.len();
    let mut i = 0;
    while i < word.len() {
        let mut end = (i + max_len + 1).min(word.len());
        let mut found = None;
        while end > i {
            if word.is_char_boundary(end) {
                if let Some(id) = lookup(&word[i..end]) {
                    found = Some((id, end));
                    break;
                }
            }
            end -= 1;
        }
        match found {
            Some((id, end)) => {
                out.push(id);
                i = end;
            }
            None => {
                out.truncate(start_len);
                break;
            }
        }
    }
    if out.len() == start_len {
        out.extend(unk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BERT: Normalizer = Normalizer {
        lowercase: true,
        strip_accents: true,
    };

    #[test]
    fn words_split_like_berts_pre_tokenizer() {
        assert_eq!(words("Hello, World!", BERT), ["hello", ",", "world", "!"]);
        assert_eq!(
            words("  Äpfel\tund 北京 ", BERT),
            ["apfel", "und", "北", "京"]
        );
        assert_eq!(words("a+b=c $5", BERT), ["a", "+", "b", "=", "c", "$", "5"]);
        assert!(words(" \n\t ", BERT).is_empty());
        let cased = Normalizer {
            lowercase: false,
            strip_accents: false,
        };
        assert_eq!(words("Äpfel", cased), ["Äpfel"]);
    }

    #[test]
    fn a_word_takes_the_longest_pieces_or_becomes_unknown() {
        let vocab = ["\u{2581}un", "\u{2581}unaff", "able", "aff", "\u{2581}x"];
        let lookup = |s: &str| vocab.iter().position(|v| *v == s).map(|i| i as u32);
        let mut out = Vec::new();
        encode_word("unaffable", 16, lookup, Some(99), &mut out);
        assert_eq!(out, [1, 2]);
        out.clear();
        encode_word("unaffy", 16, lookup, Some(99), &mut out);
        assert_eq!(out, [99]);
        out.clear();
        encode_word("unaffy", 16, lookup, None, &mut out);
        assert!(out.is_empty());
    }
}
