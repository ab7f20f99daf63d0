//! rill's tokenizer: exact llama.cpp-compatible tokenization built from GGUF metadata.
//!
//! * [`Tokenizer`] encodes text to token ids and decodes ids back to text for three tokenizer
//!   families found in GGUF files: byte-level BPE (`tokenizer.ggml.model = gpt2`, with the
//!   pre-tokenizer named by `tokenizer.ggml.pre`), SentencePiece-style BPE by scores (`llama`),
//!   and Gemma 4's SentencePiece-style BPE by merges (`gemma4`). All follow llama.cpp's `llama-vocab.cpp` / `unicode.cpp` step by step, including
//!   special-token partitioning and its token-attribute fix-ups, so the ids match llama.cpp's.
//! * [`StreamDecoder`] turns a stream of generated ids into text without ever emitting a broken
//!   UTF-8 sequence.
//! * [`Tokenizer::apply_chat_template`] renders the model's Jinja chat template in a sandboxed,
//!   fuel-limited `minijinja` environment.
//!
//! The core is built from a plain [`VocabConfig`]; [`Tokenizer::from_gguf`] is a thin adapter that
//! fills one from GGUF metadata.

mod bpe;
mod chat;
mod config;
mod decode;
mod encode;
mod error;
mod gguf;
mod merge;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod unicode;
mod wordpiece;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

pub use chat::{ChatMessage, ChatTemplate, ChatTemplateSource, TemplateDate, TemplateLimits};
pub use config::{ModelKind, SpecialIds, TokenType, VocabConfig};
pub use error::{Result, TokenizerError};
pub use gguf::vocab_config_from_gguf;
pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;

use special::{Fragment, SpecialMatcher};

/// llama.cpp token attribute bits (`llama_token_attr`). Token types map to one bit each, and the
/// vocabulary loader later ORs in `CONTROL` (end-of-generation / FIM tokens) or `UNUSED`.
mod attr {
    pub const UNDEFINED: u8 = 0x01;
    pub const UNKNOWN: u8 = 0x02;
    pub const UNUSED: u8 = 0x04;
    pub const NORMAL: u8 = 0x08;
    pub const CONTROL: u8 = 0x10;
    pub const USER_DEFINED: u8 = 0x20;
    pub const BYTE: u8 = 0x40;
}

/// Token texts that end a turn, in llama.cpp's order (the first present becomes the EOT token
/// when metadata names none).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Token texts llama.cpp treats as end-of-generation (and forces to control type).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// The SentencePiece space marker U+2581.
const SPM_SPACE: &str = "\u{2581}";

/// A tokenizer for one model. Immutable after construction and `Send + Sync`; share it freely.
#[derive(Debug)]
pub struct Tokenizer {
    model: ModelKind,
    pre_name: String,
    /// The split for BPE models (`None` for SPM).
    pre: Option<PreTokenizer>,
    ignore_merges: bool,
    tokens: Vec<Arc<str>>,
    scores: Vec<f32>,
    types: Vec<TokenType>,
    attrs: Vec<u8>,
    /// Shares the strings of `tokens` (one allocation per token).
    token_to_id: HashMap<Arc<str>, u32>,
    merges: bpe::Merges,
    /// Byte -> token for byte fallback: SPM `<0xNN>` (or the raw one-byte token), BPE the GPT-2
    /// encoded single character.
    byte_tokens: [Option<u32>; 256],
    specials: SpecialMatcher,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    /// WordPiece: the separator appended after the text, and whether it is.
    sep: Option<u32>,
    add_sep: bool,
    /// WordPiece: BERT's normalizer switches.
    normalizer: wordpiece::Normalizer,
    /// Bytes of the longest token text (WordPiece matches at most that many at a time).
    max_token_len: usize,
    add_space_prefix: bool,
    /// Sorted, deduplicated end-of-generation ids.
    eog: Vec<u32>,
    chat_template: Option<String>,
    chat_template_source: Option<ChatTemplateSource>,
}

impl Tokenizer {
    /// Builds a tokenizer from a plain vocabulary description, applying llama.cpp's defaults and
    /// vocabulary fix-ups (EOT/EOG/FIM detection by token text, control-type overrides).
    pub fn from_config(config: VocabConfig) -> Result<Tokenizer> {
        let VocabConfig {
            model,
            pre_tokenizer,
            tokens,
            scores,
            token_types,
            merges,
            special,
            add_bos,
            add_eos,
            add_sep,
            lowercase,
            strip_accents,
            add_space_prefix,
            chat_template,
        } = config;

        let n = tokens.len();
        if n == 0 {
            return Err(TokenizerError::InvalidVocab(
                "the vocabulary is empty".into(),
            ));
        }
        if n > u32::MAX as usize {
            return Err(TokenizerError::InvalidVocab(format!(
                "{n} tokens do not fit u32 ids"
            )));
        }
        if !scores.is_empty() && scores.len() < n {
            return Err(TokenizerError::InvalidVocab(format!(
                "{} scores for {n} tokens",
                scores.len()
            )));
        }
        if !token_types.is_empty() && token_types.len() < n {
            return Err(TokenizerError::InvalidVocab(format!(
                "{} token types for {n} tokens",
                token_types.len()
            )));
        }

        // Family defaults (llama.cpp `llama_vocab::impl::load`).
        let (pre_info, add_space_prefix_default, default_ids) = match model {
            ModelKind::Bpe => (
                Some(PreTokenizer::from_name(&pre_tokenizer)?),
                false,
                (Some(11), Some(11), None),
            ),
            // llama.cpp sets the pre-tokenizer name itself for this family.
            ModelKind::Gemma4 => (
                Some(PreTokenizer::from_name("gemma4")?),
                false,
                (None, None, None),
            ),
            ModelKind::Spm => (None, true, (Some(1), Some(2), Some(0))),
            // [CLS] opens, [UNK] 100; no end of sequence ([SEP] 102 closes, below).
            ModelKind::WordPiece => (None, false, (Some(101), None, Some(100))),
        };
        let pre = pre_info.map(|i| i.kind);
        let ignore_merges = pre_info.is_some_and(|i| i.ignore_merges);
        // SPM (no pre-tokenizer) adds BOS by default.
        let add_bos_default = pre_info.is_none_or(|i| i.add_bos_default);
        let force_add_bos = pre_info.is_some_and(|i| i.force_add_bos);
        let pre_tokenizer = match model {
            ModelKind::Gemma4 => "gemma4".to_string(),
            _ => pre_tokenizer,
        };

        let mut token_texts: Vec<Arc<str>> = Vec::with_capacity(n);
        let mut token_to_id: HashMap<Arc<str>, u32> = HashMap::with_capacity(n);
        for (i, text) in tokens.into_iter().enumerate() {
            // llama.cpp renames empty tokens so that they stay distinct and unmatchable.
            let text: Arc<str> = if text.is_empty() {
                Arc::from(format!("[EMPTY_{i}]"))
            } else {
                Arc::from(text)
            };
            if let Some(prev) = token_to_id.insert(text.clone(), i as u32) {
                return Err(TokenizerError::InvalidVocab(format!(
                    "duplicate token {text:?} has ids {prev} and {i}"
                )));
            }
            token_texts.push(text);
        }

        let types: Vec<TokenType> = if token_types.is_empty() {
            vec![TokenType::Normal; n]
        } else {
            token_types[..n].to_vec()
        };
        let mut attrs: Vec<u8> = types
            .iter()
            .map(|t| match t {
                TokenType::Undefined => attr::UNDEFINED,
                TokenType::Normal => attr::NORMAL,
                TokenType::Unknown => attr::UNKNOWN,
                TokenType::Control => attr::CONTROL,
                TokenType::UserDefined => attr::USER_DEFINED,
                TokenType::Unused => attr::UNUSED,
                TokenType::Byte => attr::BYTE,
            })
            .collect();
        let scores = if scores.is_empty() {
            vec![0.0; n]
        } else {
            scores[..n].to_vec()
        };

        // Special ids: metadata wins when in range, else the family default when in range.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let pick = |given: Option<u32>, default: Option<u32>| in_range(given).or(in_range(default));
        let bos = pick(special.bos, default_ids.0);
        let eos = pick(special.eos, default_ids.1);
        let unk = pick(special.unk, default_ids.2);
        let wordpiece = model == ModelKind::WordPiece;
        let pad = in_range(special.pad).or(in_range(Some(0).filter(|_| wordpiece)));
        let sep = pick(special.sep, Some(102).filter(|_| wordpiece));
        // llama.cpp's WordPiece path always opens with BOS ([CLS]) and closes with [SEP] when
        // asked for special tokens, whatever the flags say (the converter writes add_sep false
        // and add_eos true, [SEP] being also the EOS); it never adds an EOS.
        let add_sep = (wordpiece || add_sep.unwrap_or(false)) && sep.is_some();
        let lowercase = lowercase.unwrap_or(true);
        let normalizer = wordpiece::Normalizer {
            lowercase,
            strip_accents: strip_accents.unwrap_or(lowercase),
        };
        let mut eot = in_range(special.eot);
        let mut eom = in_range(special.eom);
        let mut fim_pad = in_range(special.fim_pad);
        let mut fim_rep = in_range(special.fim_rep);
        let mut fim_sep = in_range(special.fim_sep);

        let add_bos =
            (wordpiece || force_add_bos || add_bos.unwrap_or(add_bos_default)) && bos.is_some();
        let add_eos = !wordpiece && add_eos.unwrap_or(false) && eos.is_some();
        let add_space_prefix = add_space_prefix.unwrap_or(add_space_prefix_default);

        // Auto-detection by token text. llama.cpp walks a hash map, so when several texts match
        // its choice is arbitrary; we take the first text in its list that the vocabulary has.
        let find_first = |texts: &[&str]| texts.iter().find_map(|t| token_to_id.get(*t).copied());
        let mut force_control = Vec::new();
        let mut detect = |slot: &mut Option<u32>, texts: &[&str]| {
            if slot.is_none() {
                if let Some(id) = find_first(texts) {
                    *slot = Some(id);
                    force_control.push(id);
                }
            }
        };
        detect(&mut eot, EOT_TEXTS);
        detect(&mut eom, &["<|eom_id|>"]);
        let (mut fim_pre, mut fim_suf, mut fim_mid) = (None, None, None);
        detect(&mut fim_pre, FIM_PRE_TEXTS);
        detect(&mut fim_suf, FIM_SUF_TEXTS);
        detect(&mut fim_mid, FIM_MID_TEXTS);
        detect(&mut fim_pad, FIM_PAD_TEXTS);
        detect(&mut fim_rep, FIM_REP_TEXTS);
        detect(&mut fim_sep, FIM_SEP_TEXTS);
        for id in force_control {
            attrs[id as usize] |= attr::CONTROL;
        }

        // Control tokens whose text says "unused" are unused.
        for (i, text) in token_texts.iter().enumerate() {
            if attrs[i] & attr::CONTROL != 0 && text.contains("unused") {
                attrs[i] |= attr::UNUSED;
            }
        }

        let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for text in EOG_TEXTS {
            if let Some(&id) = token_to_id.get(*text) {
                eog.push(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        // gpt-oss: these structural tokens must always be rendered.
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = token_to_id.get(text) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();

        // o200k_harmony / solar-open: "<|end|>" is not an end of generation there.
        let in_eog = |eog: &[u32], t: &str| {
            token_to_id
                .get(t)
                .is_some_and(|id| eog.binary_search(id).is_ok())
        };
        if (in_eog(&eog, "<|return|>") && in_eog(&eog, "<|call|>")
            || in_eog(&eog, "<|calls|>") && in_eog(&eog, "<|flush|>"))
            && in_eog(&eog, "<|end|>")
        {
            if let Some(&end_id) = token_to_id.get("<|end|>") {
                eog.retain(|&i| i != end_id);
                attrs[end_id as usize] = attr::USER_DEFINED;
            }
        }
        // gemma4 / paddleocr: "</s>" is not an end of generation when "<|tool_response>" is.
        if in_eog(&eog, "<|tool_response>") && in_eog(&eog, "</s>") {
            if let Some(&s_id) = token_to_id.get("</s>") {
                eog.retain(|&i| i != s_id);
                attrs[s_id as usize] = attr::NORMAL;
            }
        }

        let specials = SpecialMatcher::new(&token_texts, &attrs);

        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = match model {
                // Only the `<0xNN>` form (llama.cpp's BPE session has no one-byte fallback here).
                ModelKind::Gemma4 => token_to_id.get(format!("<0x{b:02X}>").as_str()).copied(),
                ModelKind::Spm => token_to_id
                    .get(format!("<0x{b:02X}>").as_str())
                    .or_else(|| {
                        // llama.cpp falls back to the byte itself as a one-byte token.
                        (b < 0x80)
                            .then(|| (b as u8 as char).to_string())
                            .and_then(|s| token_to_id.get(s.as_str()))
                    })
                    .copied(),
                ModelKind::Bpe => {
                    let c = unicode::byte_to_char_table()[b];
                    token_to_id.get(c.to_string().as_str()).copied()
                }
                ModelKind::WordPiece => None,
            };
        }

        let merges = match model {
            ModelKind::Bpe | ModelKind::Gemma4 => bpe::Merges::new(&merges),
            ModelKind::Spm | ModelKind::WordPiece => bpe::Merges::default(),
        };
        let max_token_len = token_texts.iter().map(|t| t.len()).max().unwrap_or(0);

        let (chat_template, chat_template_source) = match chat_template {
            Some(t) => (Some(t), Some(ChatTemplateSource::Metadata)),
            None => match chat::builtin_for_vocab(|t| token_to_id.contains_key(t)) {
                Some((t, src)) => (Some(t.to_string()), Some(src)),
                None => (None, None),
            },
        };

        Ok(Tokenizer {
            model,
            pre_name: pre_tokenizer,
            pre,
            ignore_merges,
            tokens: token_texts,
            scores,
            types,
            attrs,
            token_to_id,
            merges,
            byte_tokens,
            specials,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            add_bos,
            add_eos,
            sep,
            add_sep,
            normalizer,
            max_token_len,
            add_space_prefix,
            eog,
            chat_template,
            chat_template_source,
        })
    }

    // ----- encoding -----

    /// Whether `id` ends generation (EOS, EOT, EOM, FIM pad/repo/sep, and every token whose text
    /// marks an end of turn, as llama.cpp's vocabulary loader decides).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, ascending.
    pub fn end_of_generation_ids(&self) -> &[u32] {
        &self.eog
    }

    // ----- accessors -----

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (from metadata, else detected from the vocabulary).
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token (from metadata, else `<|eom_id|>` if present).
    pub fn eom_id(&self) -> Option<u32> {
        self.eom
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether [`Tokenizer::encode_with_special`] adds BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether [`Tokenizer::encode_with_special`] adds EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The separator a WordPiece vocabulary appends (`[SEP]`).
    pub fn sep_id(&self) -> Option<u32> {
        self.sep
    }

    /// Whether [`Tokenizer::encode_with_special`] appends the separator.
    pub fn add_sep(&self) -> bool {
        self.add_sep
    }

    /// Whether SPM text gets a leading `▁` (at the start and after each special token).
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// The token's vocabulary text (raw: `▁` / GPT-2 byte characters, not decoded).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(|t| &**t)
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// The token's type as stored in the metadata.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The token's score (0 when the model has none).
    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// Whether the token is treated as a control token (by type, or because llama.cpp's loader
    /// forces it, e.g. end-of-generation texts such as `</s>`).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::CONTROL != 0)
    }

    /// The effective chat template: `tokenizer.chat_template`, or a built-in one inferred from
    /// the vocabulary when the metadata has none (see [`Tokenizer::chat_template_source`]).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Where [`Tokenizer::chat_template`] came from.
    pub fn chat_template_source(&self) -> Option<ChatTemplateSource> {
        self.chat_template_source
    }

    pub fn model_kind(&self) -> ModelKind {
        self.model
    }

    /// The `tokenizer.ggml.pre` name ("" when absent; SPM models ignore it; always "gemma4" for
    /// [`ModelKind::Gemma4`]).
    pub fn pre_tokenizer(&self) -> &str {
        &self.pre_name
    }

    /// Number of BPE merges (0 for SPM).
    pub fn merge_count(&self) -> usize {
        self.merges.len()
    }

    /// Renders the chat template for `messages` with the default [`TemplateLimits`]; `bos_token`
    /// and `eos_token` are this vocabulary's BOS/EOS texts.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with_tools(messages, None, add_generation_prompt)
    }

    /// [`Tokenizer::apply_chat_template`] with the template given `tools`.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with_options(messages, tools, add_generation_prompt, None)
    }

    /// [`Tokenizer::apply_chat_template_with_tools`] with extra template variables
    /// ([`ChatTemplate::render_with_options`]).
    pub fn apply_chat_template_with_options(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String> {
        let source = self
            .chat_template
            .as_deref()
            .ok_or(TokenizerError::NoChatTemplate)?;
        let name = |id: Option<u32>| id.and_then(|i| self.token_text(i)).unwrap_or("");
        ChatTemplate::new(source, name(self.bos), name(self.eos)).render_with_options(
            messages,
            tools,
            add_generation_prompt,
            kwargs,
        )
    }
}

/// `<0xNN>` -> the byte.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}
