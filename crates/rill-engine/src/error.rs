/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] rill_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] rill_tokenizer::TokenizerError),
    #[error(transparent)]
    Kv(#[from] rill_model::KvError),
    #[error(transparent)]
    Constraint(#[from] rill_constrain::ConstraintError),
    #[error("the prompt has {prompt} tokens but the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("{uncached} positions are not in the prefix cache, more than the {limit} a lens may compute between two steps")]
    NotCached { uncached: usize, limit: usize },
    #[error("the prompt is empty: a model needs at least one token to predict from")]
    EmptyPrompt,
    #[error("invalid sampling parameter: {0}")]
    BadParameter(String),
    #[error("invalid serving configuration: {0}")]
    BadConfig(String),
    #[error("{what}: token id {token} is outside the vocabulary ({vocab_size} tokens)")]
    TokenOutOfVocab {
        what: &'static str,
        token: u32,
        vocab_size: usize,
    },
    #[error("the draft model's vocabulary is not the model's: {0}")]
    DraftVocabulary(String),
    #[error(
        "draft layers must be in 1..={max} (the model has {model_layers} layers), got {layers}",
        max = model_layers.saturating_sub(1)
    )]
    DraftLayers { layers: usize, model_layers: usize },
    #[error("the model has no multi-token-prediction block to draft with: {0}")]
    NoMtp(String),
}
