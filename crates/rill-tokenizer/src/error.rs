//! The one error type of this crate.

/// Everything that can go wrong while building a tokenizer, decoding, or rendering a chat template.
///
/// Encoding itself cannot fail: any `&str` has a tokenization (unknown characters fall back to
/// byte tokens), so [`crate::Tokenizer::encode`] returns a plain `Vec<u32>`.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata key the tokenizer needs is absent.
    #[error("tokenizer metadata key {0:?} is missing")]
    MissingKey(String),
    /// A metadata key is present but holds the wrong kind of value.
    #[error("tokenizer metadata key {key:?} has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer family rill does not implement.
    #[error(
        "unsupported tokenizer model {0:?} (rill implements \"gpt2\" byte-level BPE, \"llama\" SentencePiece BPE, \"gemma4\" SentencePiece-style BPE and \"bert\" WordPiece)"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer rill does not implement. There is deliberately no
    /// fallback: a wrong split silently changes every prompt the model sees.
    #[error(
        "unsupported pre-tokenizer {0:?} (rill implements: {supported})",
        supported = crate::pretokenize::SUPPORTED_NAMES.join(", ")
    )]
    UnsupportedPreTokenizer(String),
    /// The vocabulary is inconsistent (duplicate tokens, array lengths that disagree, ...).
    #[error("invalid vocabulary: {0}")]
    InvalidVocab(String),
    /// A token id outside `0..vocab_size`.
    #[error("token id {id} is out of range (the vocabulary has {vocab_size} tokens)")]
    InvalidTokenId { id: u32, vocab_size: usize },
    /// The model has no chat template and none could be inferred from its vocabulary.
    #[error("the model has no chat template (tokenizer.chat_template is absent)")]
    NoChatTemplate,
    /// The chat template failed to compile or to render (syntax error, `raise_exception`, fuel
    /// exhausted, recursion limit, ...).
    #[error("chat template error: {0}")]
    Template(String),
    /// The rendered chat template grew beyond the output cap.
    #[error("chat template output exceeds the limit of {limit} bytes")]
    TemplateOutputTooLarge { limit: usize },
}

/// Result alias for this crate.
pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
