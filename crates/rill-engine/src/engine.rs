//! A model with its tokenizer.

use std::path::Path;
use std::sync::Arc;

use rill_model::{Model, Precision};
use rill_tokenizer::{ChatMessage, Tokenizer};

use crate::{check_draft_vocabulary, EngineError, Session};

pub struct Engine {
    pub model: Model,
    /// Shared: the serving loop's handles tokenize prompts while the loop generates.
    pub tokenizer: Arc<Tokenizer>,
    pub precision: Precision,
}

impl Engine {
    /// Loads the model and builds its tokenizer from the same file.
    pub fn load(
        path: impl AsRef<Path>,
        threads: usize,
        precision: Precision,
    ) -> Result<Engine, EngineError> {
        let model = Model::load(path, threads)?;
        let tokenizer = Tokenizer::from_gguf(model.file().metadata())?;
        Ok(Engine {
            model,
            tokenizer: Arc::new(tokenizer),
            precision,
        })
    }

    /// A fresh session whose KV cache holds `context` positions (capped at the model's trained
    /// context length).
    pub fn new_session(&self, context: usize) -> Result<Session, EngineError> {
        let context = context.clamp(1, self.model.config().context_length);
        Ok(Session::new(
            self.model.new_kv_cache(context, self.precision)?,
            context,
        ))
    }

    /// Renders `messages` with the model's chat template (with the generation prompt) and
    /// tokenizes the result, control tokens included; BOS is added only if the template did not
    /// already render one.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, EngineError> {
        let text = self.tokenizer.apply_chat_template(messages, true)?;
        Ok(self.tokenizer.encode_with_special(&text, true, true))
    }

    /// Loads a draft model for speculative decoding (with `threads` compute threads, 0: all
    /// cores), refusing one whose vocabulary differs from this model's (size or any token's
    /// text).
    pub fn load_draft_model(
        &self,
        path: impl AsRef<Path>,
        threads: usize,
    ) -> Result<Model, EngineError> {
        let draft = Model::load(path, threads)?;
        check_draft_vocabulary(&self.tokenizer, self.model.config().vocab_size, &draft)?;
        Ok(draft)
    }
}
