/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] rill_model::ModelError),
    #[error(transparent)]
    Tokenizer(#[from] rill_tokenizer::TokenizerError),
    #[error(transparent)]
    Kv(#[from] rill_model::KvError),
    #[error("the prompt has {prompt} tokens but the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("the prompt is empty: a model needs at least one token to predict from")]
    EmptyPrompt,
    #[error("invalid sampling parameter: {0}")]
    BadParameter(String),
    #[error("{what}: token id {token} is outside the vocabulary ({vocab_size} tokens)")]
    TokenOutOfVocab {
        what: &'static str,
        token: u32,
        vocab_size: usize,
    },
}
