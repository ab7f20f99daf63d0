//! The plain-data description a [`crate::Tokenizer`] is built from.

/// Tokenizer family (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// `gpt2`: byte-level BPE with ranked merges and a regex pre-tokenizer.
    Bpe,
    /// `llama`: SentencePiece-style BPE driven by token scores, `▁` for spaces, `<0xNN>` byte
    /// fallback.
    Spm,
    /// `gemma4`: BPE with ranked merges over raw UTF-8 text with `▁` for spaces and `<0xNN>` byte
    /// fallback (SentencePiece-style tokens, merged like BPE). llama.cpp runs it as a BPE
    /// vocabulary with its `gemma4` pre-tokenizer whatever `tokenizer.ggml.pre` says.
    Gemma4,
    /// `bert`: WordPiece, the longest vocabulary piece first, words split by BERT's
    /// normalizer and pre-tokenizer; a word's first piece written with a leading `▁`.
    WordPiece,
}

impl ModelKind {
    /// The `tokenizer.ggml.model` value of this family.
    pub fn gguf_name(self) -> &'static str {
        match self {
            ModelKind::Bpe => "gpt2",
            ModelKind::Spm => "llama",
            ModelKind::Gemma4 => "gemma4",
            ModelKind::WordPiece => "bert",
        }
    }
}

/// Token type as stored in `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// 0 (or any value outside 1..=6).
    Undefined,
    /// 1: an ordinary piece of text.
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: a control token (`<bos>`, `<|im_start|>`...): matched in text only when special-token
    /// parsing is requested, rendered only on request.
    Control,
    /// 4: a user-defined token: always matched in text, always rendered.
    UserDefined,
    /// 5: unused.
    Unused,
    /// 6: a byte-fallback token `<0xNN>`.
    Byte,
}

impl TokenType {
    /// Maps the GGUF integer code.
    pub fn from_code(code: i64) -> TokenType {
        match code {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Special token ids as given by metadata. `None` means "not given": the builder then applies
/// llama.cpp's per-family defaults (SPM: bos 1, eos 2, unk 0; BPE: bos 11, eos 11; Gemma4: none)
/// where they are in range.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// End of turn (auto-detected from the vocabulary when absent, e.g. `<|im_end|>`).
    pub eot: Option<u32>,
    /// End of message (auto-detected: `<|eom_id|>`).
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// The separator (`[SEP]`) a WordPiece vocabulary appends (`tokenizer.ggml.seperator_token_id`,
    /// as llama.cpp spells it).
    pub sep: Option<u32>,
    /// Fill-in-the-middle pad / repo / file-separator tokens: llama.cpp treats them as
    /// end-of-generation.
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Everything a tokenizer is built from, independent of any file format.
///
/// [`crate::Tokenizer::from_gguf`] fills it from GGUF metadata; tests can write one by hand.
#[derive(Debug, Clone)]
pub struct VocabConfig {
    pub model: ModelKind,
    /// `tokenizer.ggml.pre` (BPE only; empty = llama.cpp's "default"; ignored for
    /// [`ModelKind::Gemma4`], which always uses `gemma4`).
    pub pre_tokenizer: String,
    /// Token texts, indexed by id.
    pub tokens: Vec<String>,
    /// Per-token scores (SPM merge priorities); empty = all 0.
    pub scores: Vec<f32>,
    /// Per-token types; empty = all [`TokenType::Normal`].
    pub token_types: Vec<TokenType>,
    /// BPE merges, `"left right"`, in rank order.
    pub merges: Vec<String>,
    pub special: SpecialIds,
    /// `tokenizer.ggml.add_bos_token`; `None` = llama.cpp's default (SPM: true; BPE: true only for
    /// Llama-3 style pre-tokenizers). Gemma4 always adds BOS, as llama.cpp forces it.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`; `None` = false.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_sep_token`; `None` = llama.cpp's default (WordPiece: true).
    pub add_sep: Option<bool>,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece); `None` = llama.cpp's default, true.
    pub lowercase: Option<bool>,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece); `None` = as `lowercase`.
    pub strip_accents: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`; `None` = llama.cpp's default (SPM: true; BPE: false).
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template` (Jinja).
    pub chat_template: Option<String>,
}

impl VocabConfig {
    /// A config with the given family and tokens and every optional field empty.
    pub fn new(model: ModelKind, tokens: Vec<String>) -> VocabConfig {
        VocabConfig {
            model,
            pre_tokenizer: String::new(),
            tokens,
            scores: Vec::new(),
            token_types: Vec::new(),
            merges: Vec::new(),
            special: SpecialIds::default(),
            add_bos: None,
            add_eos: None,
            add_sep: None,
            lowercase: None,
            strip_accents: None,
            add_space_prefix: None,
            chat_template: None,
        }
    }
}
