//! Pre-tokenizers for byte-level BPE: the word splits applied before merges, reproducing
//! llama.cpp's `unicode_regex_split` for each `tokenizer.ggml.pre` value rill supports.
//!
//! llama.cpp applies a *sequence* of regexes: each one splits every segment produced by the
//! previous one, and the text between matches becomes a segment of its own. The two big GPT-2 and
//! Llama-3 style regexes are hand-written state machines in llama.cpp (`unicode.cpp`,
//! `unicode_regex_split_custom_gpt2` / `_llama3`); they are reproduced here step by step, including
//! their exact treatment of segment boundaries, so that the splits are identical, not merely
//! regex-equivalent. The short single-class regexes (`\p{N}`, `[0-9][0-9][0-9]`, ...) are simple
//! scans.

use crate::error::{Result, TokenizerError};
use crate::unicode::{self, DEFINED, LETTER, NUMBER, PUNCT, WHITESPACE};

/// The `tokenizer.ggml.pre` values this crate accepts (each maps to one llama.cpp regex set).
pub(crate) const SUPPORTED_NAMES: &[&str] = &[
    "default",
    "gpt-2",
    "phi-2",
    "mpt",
    "olmo",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "dbrx",
    "smaug-bpe",
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "megrez",
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
];

/// One regex set of llama.cpp's `llm_tokenizer_bpe`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `LLAMA_VOCAB_PRE_TYPE_DEFAULT`: punctuation runs, the GPT-2 regex, digit runs, digit triples.
    Default,
    /// `LLAMA_VOCAB_PRE_TYPE_GPT2`: the original GPT-2 regex.
    Gpt2,
    /// `LLAMA_VOCAB_PRE_TYPE_LLAMA3` (also dbrx, smaug): the Llama-3 regex, numbers in groups of 3.
    Llama3,
    /// `LLAMA_VOCAB_PRE_TYPE_QWEN2` (also stablelm2): the Llama-3 regex with single digits.
    Qwen2,
    /// `LLAMA_VOCAB_PRE_TYPE_SMOLLM` (also starcoder, refact, command-r, ...): every digit on its
    /// own, then the GPT-2 regex.
    Smollm,
}

/// What a `tokenizer.ggml.pre` name implies besides the split.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreInfo {
    pub kind: PreTokenizer,
    /// Whole words that are already a vocabulary token skip the merges (llama.cpp
    /// `ignore_merges`; matters when a token is unreachable through the merge list).
    pub ignore_merges: bool,
    /// llama.cpp's default for `add_bos` before the metadata key is read.
    pub add_bos_default: bool,
}

impl PreTokenizer {
    /// Maps a `tokenizer.ggml.pre` value; an empty name is llama.cpp's "missing, use default".
    pub(crate) fn from_name(name: &str) -> Result<PreInfo> {
        let info = |kind, ignore_merges, add_bos_default| PreInfo {
            kind,
            ignore_merges,
            add_bos_default,
        };
        Ok(match name {
            "" | "default" => info(PreTokenizer::Default, false, false),
            "gpt-2" | "phi-2" | "mpt" | "olmo" => info(PreTokenizer::Gpt2, false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" => {
                info(PreTokenizer::Llama3, true, true)
            }
            "dbrx" | "smaug-bpe" => info(PreTokenizer::Llama3, false, false),
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" => {
                info(PreTokenizer::Qwen2, false, false)
            }
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => info(PreTokenizer::Smollm, false, false),
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        })
    }

    /// Splits `text` into pre-tokenized words (slices of `text`, in order, covering all of it).
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        if text.is_empty() {
            return Vec::new();
        }
        let text_ctx = Text::new(text);
        let mut segs = vec![(0usize, text_ctx.cps.len())];
        match self {
            PreTokenizer::Default => {
                segs = split_by(&text_ctx, &segs, |t, pos, end| {
                    find_run(t, pos, end, |c, f| {
                        f & PUNCT != 0 || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
                    })
                });
                segs = split_gpt2(&text_ctx, &segs);
                segs = split_by(&text_ctx, &segs, |t, pos, end| {
                    find_run(t, pos, end, |_, f| f & NUMBER != 0)
                });
                segs = split_by(&text_ctx, &segs, find_ascii_digit_triple);
            }
            PreTokenizer::Gpt2 => segs = split_gpt2(&text_ctx, &segs),
            PreTokenizer::Llama3 => segs = split_llama3(&text_ctx, &segs, 3),
            PreTokenizer::Qwen2 => segs = split_llama3(&text_ctx, &segs, 1),
            PreTokenizer::Smollm => {
                segs = split_by(&text_ctx, &segs, |t, pos, end| {
                    (pos..end)
                        .find(|&i| t.flags[i] & NUMBER != 0)
                        .map(|i| (i, i + 1))
                });
                segs = split_gpt2(&text_ctx, &segs);
            }
        }
        segs.into_iter()
            .map(|(s, e)| &text[text_ctx.byte_at[s]..text_ctx.byte_at[e]])
            .collect()
    }
}

/// The text as code points with their class flags and byte offsets.
struct Text {
    cps: Vec<char>,
    flags: Vec<u8>,
    /// `byte_at[i]` = byte offset of code point `i`; one extra entry for the end.
    byte_at: Vec<usize>,
}

impl Text {
    fn new(text: &str) -> Text {
        let mut cps = Vec::with_capacity(text.len());
        let mut flags = Vec::with_capacity(text.len());
        let mut byte_at = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cps.push(c);
            flags.push(unicode::flags(c));
            byte_at.push(i);
        }
        byte_at.push(text.len());
        Text {
            cps,
            flags,
            byte_at,
        }
    }
}

/// Applies one "regex": `find(text, pos, end)` returns the leftmost match `(start, end)` in
/// `pos..end`. Text between matches becomes its own segment, like llama.cpp's
/// `unicode_regex_split_stl`.
fn split_by(
    text: &Text,
    segs: &[(usize, usize)],
    find: impl Fn(&Text, usize, usize) -> Option<(usize, usize)>,
) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(segs.len() * 2);
    for &(start, end) in segs {
        let mut pos = start;
        while pos < end {
            let Some((ms, me)) = find(text, pos, end) else {
                break;
            };
            if ms > pos {
                out.push((pos, ms));
            }
            out.push((ms, me));
            pos = me;
        }
        if pos < end {
            out.push((pos, end));
        }
    }
    out
}

/// Leftmost maximal run of characters satisfying `pred` (a `[class]+` regex).
fn find_run(
    text: &Text,
    pos: usize,
    end: usize,
    pred: impl Fn(char, u8) -> bool,
) -> Option<(usize, usize)> {
    let start = (pos..end).find(|&i| pred(text.cps[i], text.flags[i]))?;
    let mut stop = start + 1;
    while stop < end && pred(text.cps[stop], text.flags[stop]) {
        stop += 1;
    }
    Some((start, stop))
}

/// `[0-9][0-9][0-9]`: the leftmost three consecutive ASCII digits.
fn find_ascii_digit_triple(text: &Text, pos: usize, end: usize) -> Option<(usize, usize)> {
    let is_digit = |i: usize| text.cps[i].is_ascii_digit();
    (pos..end.saturating_sub(2))
        .find(|&i| is_digit(i) && is_digit(i + 1) && is_digit(i + 2))
        .map(|i| (i, i + 3))
}

/// Shared state of the hand-written splitters for one segment `[ini, end)`.
struct Seg<'a> {
    text: &'a Text,
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<(usize, usize)>,
}

impl Seg<'_> {
    /// Code point at `pos`, or `None` outside the segment (llama.cpp's `OUT_OF_RANGE`).
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.ini <= pos && pos < self.end).then(|| self.text.cps[pos])
    }

    /// Flags at `pos`, or 0 outside the segment.
    fn flags(&self, pos: usize) -> u8 {
        if self.ini <= pos && pos < self.end {
            self.text.flags[pos]
        } else {
            0
        }
    }

    /// Closes the current word at `end`; returns its length in code points.
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push((self.prev_end, end));
        }
        self.prev_end = end;
        len
    }
}

fn is_contraction_1(c: char) -> bool {
    matches!(c, 's' | 't' | 'm' | 'd')
}

fn is_contraction_2(a: char, b: char) -> bool {
    matches!((a, b), ('r', 'e') | ('v', 'e') | ('l', 'l'))
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(text: &Text, segs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(segs.len() * 2);
    for &(ini, end) in segs {
        let mut s = Seg {
            text,
            ini,
            end,
            prev_end: ini,
            out: &mut out,
        };
        let mut pos = ini;
        while pos < end {
            let cpt = text.cps[pos];
            let flags = text.flags[pos];

            if cpt == '\'' && pos + 1 < end {
                let next = text.cps[pos + 1];
                if is_contraction_1(next) {
                    pos += s.add(pos + 2);
                    continue;
                }
                if pos + 2 < end && is_contraction_2(next, text.cps[pos + 2]) {
                    pos += s.add(pos + 3);
                    continue;
                }
            }

            let space = usize::from(cpt == ' ');
            let mut flags2 = if cpt == ' ' { s.flags(pos + 1) } else { flags };
            if flags2 & LETTER != 0 {
                pos += space;
                while flags2 & LETTER != 0 {
                    pos += 1;
                    flags2 = s.flags(pos);
                }
                s.add(pos);
                continue;
            }
            if flags2 & NUMBER != 0 {
                pos += space;
                while flags2 & NUMBER != 0 {
                    pos += 1;
                    flags2 = s.flags(pos);
                }
                s.add(pos);
                continue;
            }
            if flags2 & (WHITESPACE | LETTER | NUMBER) == 0 && flags2 & DEFINED != 0 {
                pos += space;
                while flags2 & (WHITESPACE | LETTER | NUMBER) == 0 && flags2 & DEFINED != 0 {
                    pos += 1;
                    flags2 = s.flags(pos);
                }
                s.add(pos);
                continue;
            }

            let mut n_ws = 0;
            while s.flags(pos + n_ws) & WHITESPACE != 0 {
                n_ws += 1;
            }
            // \s+(?!\S): leave the last whitespace to prefix the next word.
            if n_ws > 1 && s.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                s.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                s.add(pos);
                continue;
            }
            pos += 1;
            s.add(pos);
        }
    }
    out
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
///
/// With `max_digits == 3` this is llama.cpp's custom Llama-3 splitter; with 1 it is the Qwen2
/// regex (which llama.cpp runs through `std::regex`, with the same result).
fn split_llama3(text: &Text, segs: &[(usize, usize)], max_digits: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(segs.len() * 2);
    for &(ini, end) in segs {
        let mut s = Seg {
            text,
            ini,
            end,
            prev_end: ini,
            out: &mut out,
        };
        let mut pos = ini;
        while pos < end {
            let cpt = text.cps[pos];
            let flags = text.flags[pos];

            if cpt == '\'' && pos + 1 < end {
                let next = text.cps[pos + 1].to_ascii_lowercase();
                if is_contraction_1(next) {
                    pos += s.add(pos + 2);
                    continue;
                }
                if pos + 2 < end && is_contraction_2(next, text.cps[pos + 2].to_ascii_lowercase()) {
                    pos += s.add(pos + 3);
                    continue;
                }
            }

            // [^\r\n\p{L}\p{N}]?\p{L}+
            if !(cpt == '\r' || cpt == '\n' || flags & NUMBER != 0)
                && (flags & LETTER != 0 || s.flags(pos + 1) & LETTER != 0)
            {
                pos += 1;
                while s.flags(pos) & LETTER != 0 {
                    pos += 1;
                }
                s.add(pos);
                continue;
            }

            // \p{N}{1,max_digits}
            if flags & NUMBER != 0 {
                let mut group_start = pos;
                while s.flags(pos) & NUMBER != 0 {
                    pos += 1;
                    if pos - group_start >= max_digits {
                        s.add(pos);
                        group_start = pos;
                    }
                }
                s.add(pos);
                continue;
            }

            // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (llama.cpp tests the *current* flags for being defined,
            // which only matters past the segment end)
            let space = usize::from(cpt == ' ');
            let mut flags2 = if cpt == ' ' { s.flags(pos + 1) } else { flags };
            if flags2 & (WHITESPACE | LETTER | NUMBER) == 0 && flags & DEFINED != 0 {
                pos += space;
                while flags2 & (WHITESPACE | LETTER | NUMBER) == 0 && flags2 & DEFINED != 0 {
                    pos += 1;
                    flags2 = s.flags(pos);
                }
                while matches!(s.cpt(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                s.add(pos);
                continue;
            }

            let mut n_ws = 0;
            let mut last_end_r_or_n = 0;
            while s.flags(pos + n_ws) & WHITESPACE != 0 {
                if matches!(text.cps[pos + n_ws], '\r' | '\n') {
                    last_end_r_or_n = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            // \s*[\r\n]+
            if last_end_r_or_n > 0 {
                pos = last_end_r_or_n;
                s.add(pos);
                continue;
            }
            // \s+(?!\S)
            if n_ws > 1 && s.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                s.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                s.add(pos);
                continue;
            }
            pos += 1;
            s.add(pos);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(kind: PreTokenizer, text: &str) -> Vec<&str> {
        kind.split(text)
    }

    #[test]
    fn gpt2_basic() {
        assert_eq!(
            split(PreTokenizer::Gpt2, "Hello  world's 123 !!"),
            vec!["Hello", " ", " world", "'s", " 123", " !!"]
        );
        assert_eq!(split(PreTokenizer::Gpt2, "a   "), vec!["a", "   "]);
        assert_eq!(split(PreTokenizer::Gpt2, ""), Vec::<&str>::new());
    }

    #[test]
    fn smollm_splits_digits() {
        assert_eq!(
            split(PreTokenizer::Smollm, "x 1234 -42"),
            vec!["x", " ", "1", "2", "3", "4", " -", "4", "2"]
        );
    }

    #[test]
    fn llama3_numbers_and_newlines() {
        assert_eq!(
            split(PreTokenizer::Llama3, "12345 I'M ok\n\n  x"),
            vec!["123", "45", " I", "'M", " ok", "\n\n", " ", " x"]
        );
        assert_eq!(split(PreTokenizer::Qwen2, "123"), vec!["1", "2", "3"]);
    }

    #[test]
    fn default_set() {
        assert_eq!(
            split(PreTokenizer::Default, "a,b 12345"),
            vec!["a", ",", "b", " ", "123", "45"]
        );
    }

    #[test]
    fn unknown_name_is_an_error() {
        assert!(matches!(
            PreTokenizer::from_name("tekken"),
            Err(TokenizerError::UnsupportedPreTokenizer(n)) if n == "tekken"
        ));
    }
}
