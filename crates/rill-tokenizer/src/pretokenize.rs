//! Pre-tokenizers for BPE: the word splits applied before merges, reproducing llama.cpp's
//! `unicode_regex_split` for each `tokenizer.ggml.pre` value rill supports.
//!
//! llama.cpp applies a *sequence* of regexes: each one splits every segment produced by the
//! previous one, and the text between matches becomes a segment of its own. The big GPT-2 and
//! Llama-3 style regexes are hand-written state machines in llama.cpp (`unicode.cpp`); they are
//! reproduced in [`machines`] step by step. The short regexes (`\p{N}`, `[0-9][0-9][0-9]`,
//! DeepSeek's classes, ...) are simple scans in [`scan`].

mod machines;
mod scan;

use crate::error::{Result, TokenizerError};
use crate::unicode::{LETTER, MARK, NUMBER, PUNCT};
use machines::{split_gpt2, split_llama3};
use scan::{
    find_ascii_digit_triple, find_one, find_run, find_trailing_whitespace, find_ws_then_run,
    is_deepseek_cjk, is_deepseek_letter, is_deepseek_punct, split_by, split_newlines, Text,
};

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
    "qwen35",
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
    "falcon",
    "deepseek-llm",
    "deepseek-coder",
    "gemma4",
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
    /// `LLAMA_VOCAB_PRE_TYPE_QWEN35`: the Qwen2 regex with combining marks (`\p{M}`) joining
    /// letter runs.
    Qwen35,
    /// `LLAMA_VOCAB_PRE_TYPE_SMOLLM` (also starcoder, refact, command-r, ...): every digit on its
    /// own, then the GPT-2 regex.
    Smollm,
    /// `LLAMA_VOCAB_PRE_TYPE_FALCON`: punctuation runs (with `` ` ``), the GPT-2 regex, digit
    /// triples.
    Falcon,
    /// `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM`: line breaks, cased-letter runs, punctuation runs,
    /// trailing whitespace, CJK runs, digit runs.
    DeepseekLlm,
    /// `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_CODER`: line breaks, letter runs, punctuation runs, CJK runs,
    /// single digits.
    DeepseekCoder,
    /// `LLAMA_VOCAB_PRE_TYPE_GEMMA4`: SentencePiece-style BPE. Spaces become `▁`, the text is cut
    /// only into runs of newlines and runs of anything else, merges work on raw UTF-8 characters
    /// (no GPT-2 byte mapping) and unknown bytes fall back to `<0xNN>` tokens.
    Gemma4,
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
    /// llama.cpp turns `add_bos` on whatever the metadata says (its Gemma-4 workaround).
    pub force_add_bos: bool,
}

impl PreTokenizer {
    /// Maps a `tokenizer.ggml.pre` value; an empty name is llama.cpp's "missing, use default".
    pub(crate) fn from_name(name: &str) -> Result<PreInfo> {
        let info = |kind, ignore_merges, add_bos_default| PreInfo {
            kind,
            ignore_merges,
            add_bos_default,
            force_add_bos: false,
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
            "qwen35" => info(PreTokenizer::Qwen35, false, false),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => info(PreTokenizer::Smollm, false, false),
            "falcon" => info(PreTokenizer::Falcon, false, false),
            "deepseek-llm" => info(PreTokenizer::DeepseekLlm, false, false),
            "deepseek-coder" => info(PreTokenizer::DeepseekCoder, false, false),
            "gemma4" => PreInfo {
                force_add_bos: true,
                ..info(PreTokenizer::Gemma4, false, false)
            },
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        })
    }

    /// Whether words are GPT-2 byte-mapped before merging (byte-level BPE). `false` only for the
    /// SentencePiece-style [`PreTokenizer::Gemma4`], whose tokens are raw UTF-8 with `▁` for
    /// spaces.
    pub fn byte_level(&self) -> bool {
        !matches!(self, PreTokenizer::Gemma4)
    }

    /// Splits `text` into pre-tokenized words (slices of `text`, in order, covering all of it).
    /// For [`PreTokenizer::Gemma4`], `text` is expected with spaces already escaped to `▁`.
    pub fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        if text.is_empty() {
            return Vec::new();
        }
        let t = Text::new(text);
        let mut segs = vec![(0usize, t.cps.len())];
        let line_break = |c: char, _| c == '\r' || c == '\n';
        match self {
            PreTokenizer::Default => {
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_run(t, pos, end, |c, f| {
                        f & PUNCT != 0 || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
                    })
                });
                segs = split_gpt2(&t, &segs);
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_run(t, pos, end, |_, f| f & NUMBER != 0)
                });
                segs = split_by(&t, &segs, find_ascii_digit_triple);
            }
            PreTokenizer::Gpt2 => segs = split_gpt2(&t, &segs),
            PreTokenizer::Llama3 => segs = split_llama3(&t, &segs, 3, LETTER),
            PreTokenizer::Qwen2 => segs = split_llama3(&t, &segs, 1, LETTER),
            PreTokenizer::Qwen35 => segs = split_llama3(&t, &segs, 1, LETTER | MARK),
            PreTokenizer::Smollm => {
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_one(t, pos, end, |_, f| f & NUMBER != 0)
                });
                segs = split_gpt2(&t, &segs);
            }
            PreTokenizer::Falcon => {
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_run(t, pos, end, |c, f| {
                        f & PUNCT != 0
                            || matches!(c, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|' | '`')
                    })
                });
                segs = split_gpt2(&t, &segs);
                segs = split_by(&t, &segs, find_ascii_digit_triple);
            }
            PreTokenizer::DeepseekLlm => {
                segs = split_by(&t, &segs, |t, pos, end| find_one(t, pos, end, line_break));
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_ws_then_run(t, pos, end, is_deepseek_letter)
                });
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_ws_then_run(t, pos, end, is_deepseek_punct)
                });
                segs = split_by(&t, &segs, find_trailing_whitespace);
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_run(t, pos, end, is_deepseek_cjk)
                });
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_run(t, pos, end, |_, f| f & NUMBER != 0)
                });
            }
            PreTokenizer::DeepseekCoder => {
                segs = split_by(&t, &segs, |t, pos, end| find_one(t, pos, end, line_break));
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_ws_then_run(t, pos, end, |_, f| f & LETTER != 0)
                });
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_ws_then_run(t, pos, end, |_, f| f & PUNCT != 0)
                });
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_run(t, pos, end, is_deepseek_cjk)
                });
                segs = split_by(&t, &segs, |t, pos, end| {
                    find_one(t, pos, end, |_, f| f & NUMBER != 0)
                });
            }
            PreTokenizer::Gemma4 => segs = split_newlines(&t, &segs),
        }
        segs.into_iter()
            .map(|(s, e)| &text[t.byte_at[s]..t.byte_at[e]])
            .collect()
    }
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
    fn falcon_isolates_backticks() {
        assert_eq!(split(PreTokenizer::Default, " `x"), vec![" `", "x"]);
        assert_eq!(split(PreTokenizer::Falcon, " `x"), vec![" ", "`", "x"]);
        assert_eq!(
            split(PreTokenizer::Falcon, "b 12345"),
            vec!["b", " ", "123", "45"]
        );
    }

    #[test]
    fn qwen35_keeps_marks_in_words() {
        let text = "e\u{301}x 1";
        assert_eq!(
            split(PreTokenizer::Qwen2, text),
            vec!["e", "\u{301}x", " ", "1"]
        );
        assert_eq!(
            split(PreTokenizer::Qwen35, text),
            vec!["e\u{301}x", " ", "1"]
        );
    }

    #[test]
    fn deepseek_sets() {
        assert_eq!(
            split(PreTokenizer::DeepseekLlm, "Ab1 \n  我们x"),
            vec!["Ab", "1", " ", "\n", "  ", "我们", "x"]
        );
        assert_eq!(
            split(PreTokenizer::DeepseekCoder, "x12!? é"),
            vec!["x", "1", "2", "!?", " é"]
        );
    }

    #[test]
    fn gemma4_splits_newline_runs() {
        assert_eq!(
            split(PreTokenizer::Gemma4, "a\u{2581}b\n\nc\n"),
            vec!["a\u{2581}b", "\n\n", "c", "\n"]
        );
        assert!(!PreTokenizer::Gemma4.byte_level());
        assert!(PreTokenizer::from_name("gemma4").unwrap().force_add_bos);
    }

    #[test]
    fn unknown_name_is_an_error() {
        assert!(matches!(
            PreTokenizer::from_name("tekken"),
            Err(TokenizerError::UnsupportedPreTokenizer(n)) if n == "tekken"
        ));
    }
}
