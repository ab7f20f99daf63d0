//! The GGUF adapter: `tokenizer.*` metadata -> [`VocabConfig`] -> [`Tokenizer`].

use rill_gguf::{Metadata, Value};

use crate::config::{ModelKind, SpecialIds, TokenType, VocabConfig};
use crate::error::{Result, TokenizerError};
use crate::Tokenizer;

fn wrong(key: &str, expected: &'static str, found: &Value) -> TokenizerError {
    TokenizerError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_name().to_string(),
    }
}

fn get_str<'m>(md: &'m Metadata, key: &str) -> Result<Option<&'m str>> {
    md.get(key)
        .map(|v| v.as_str().ok_or_else(|| wrong(key, "string", v)))
        .transpose()
}

fn get_bool(md: &Metadata, key: &str) -> Result<Option<bool>> {
    md.get(key)
        .map(|v| v.as_bool().ok_or_else(|| wrong(key, "bool", v)))
        .transpose()
}

/// A token id. Negative values (some converters write -1 for "none") count as absent; values that
/// do not fit u32 are out of range and end up ignored like any other out-of-range id.
fn get_id(md: &Metadata, key: &str) -> Result<Option<u32>> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    if let Some(i) = v.as_i64() {
        return Ok((i >= 0).then(|| u32::try_from(i).unwrap_or(u32::MAX)));
    }
    if v.as_u64().is_some() {
        return Ok(Some(u32::MAX));
    }
    Err(wrong(key, "integer", v))
}

fn get_array<'m>(md: &'m Metadata, key: &str) -> Result<Option<&'m [Value]>> {
    md.get(key)
        .map(|v| v.as_array().ok_or_else(|| wrong(key, "array", v)))
        .transpose()
}

fn strings(key: &str, values: &[Value]) -> Result<Vec<String>> {
    values
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| wrong(key, "array of strings", v))
        })
        .collect()
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(md: &Metadata) -> Result<Tokenizer> {
        Tokenizer::from_config(vocab_config_from_gguf(md)?)
    }
}

/// Reads a [`VocabConfig`] from GGUF metadata (exposed for tools that want to inspect or adjust
/// it before building).
pub fn vocab_config_from_gguf(md: &Metadata) -> Result<VocabConfig> {
    const MODEL: &str = "tokenizer.ggml.model";
    const TOKENS: &str = "tokenizer.ggml.tokens";
    const SCORES: &str = "tokenizer.ggml.scores";
    const TYPES: &str = "tokenizer.ggml.token_type";
    const MERGES: &str = "tokenizer.ggml.merges";

    let model_name = get_str(md, MODEL)?.ok_or_else(|| TokenizerError::MissingKey(MODEL.into()))?;
    let model = match model_name {
        "gpt2" => ModelKind::Bpe,
        "llama" => ModelKind::Spm,
        "gemma4" => ModelKind::Gemma4,
        "bert" => ModelKind::WordPiece,
        other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
    };
    let tokens = strings(
        TOKENS,
        get_array(md, TOKENS)?.ok_or_else(|| TokenizerError::MissingKey(TOKENS.into()))?,
    )?;

    let scores = match get_array(md, SCORES)? {
        None => Vec::new(),
        Some(values) => values
            .iter()
            .map(|v| {
                v.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| wrong(SCORES, "array of numbers", v))
            })
            .collect::<Result<_>>()?,
    };
    let token_types = match get_array(md, TYPES)? {
        None => Vec::new(),
        Some(values) => values
            .iter()
            .map(|v| {
                v.as_i64()
                    .map(TokenType::from_code)
                    .ok_or_else(|| wrong(TYPES, "array of integers", v))
            })
            .collect::<Result<_>>()?,
    };
    let merges = match (model, get_array(md, MERGES)?) {
        (ModelKind::Bpe | ModelKind::Gemma4, None) => {
            return Err(TokenizerError::MissingKey(MERGES.into()))
        }
        (ModelKind::Bpe | ModelKind::Gemma4, Some(values)) => strings(MERGES, values)?,
        (ModelKind::Spm | ModelKind::WordPiece, _) => Vec::new(),
    };

    let special = SpecialIds {
        bos: get_id(md, "tokenizer.ggml.bos_token_id")?,
        eos: get_id(md, "tokenizer.ggml.eos_token_id")?,
        eot: get_id(md, "tokenizer.ggml.eot_token_id")?,
        eom: get_id(md, "tokenizer.ggml.eom_token_id")?,
        unk: get_id(md, "tokenizer.ggml.unknown_token_id")?,
        pad: get_id(md, "tokenizer.ggml.padding_token_id")?,
        sep: get_id(md, "tokenizer.ggml.seperator_token_id")?,
        fim_pad: get_id(md, "tokenizer.ggml.fim_pad_token_id")?,
        fim_rep: get_id(md, "tokenizer.ggml.fim_rep_token_id")?,
        fim_sep: get_id(md, "tokenizer.ggml.fim_sep_token_id")?,
    };

    Ok(VocabConfig {
        model,
        pre_tokenizer: get_str(md, "tokenizer.ggml.pre")?.unwrap_or("").to_string(),
        tokens,
        scores,
        token_types,
        merges,
        special,
        add_bos: get_bool(md, "tokenizer.ggml.add_bos_token")?,
        add_eos: get_bool(md, "tokenizer.ggml.add_eos_token")?,
        add_sep: get_bool(md, "tokenizer.ggml.add_sep_token")?,
        lowercase: get_bool(md, "tokenizer.ggml.normalizer.lowercase")?,
        strip_accents: get_bool(md, "tokenizer.ggml.normalizer.strip_accents")?,
        add_space_prefix: get_bool(md, "tokenizer.ggml.add_space_prefix")?,
        chat_template: get_str(md, "tokenizer.chat_template")?.map(str::to_string),
    })
}
