//! A model with its tokenizer.

use std::path::Path;
use std::sync::Arc;

use rill_model::{KvCache, Model, Precision, SeqId};
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
        let mut model = Model::load(path, threads)?;
        let tokenizer = Tokenizer::from_gguf(model.file().metadata())?;
        if precision == Precision::Fast {
            // The two-pass head's copy now rather than in the first answer's first step.
            model.set_two_pass_head(rill_model::TwoPassMode::Auto)?;
        }
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
        // Sliding-window layers keep their window and one pass (and the rollback slack).
        let kv = crate::session::session_kv_cache(&self.model, context, self.precision)?;
        Ok(Session::new(kv, context))
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

/// A shared KV cache lent to work outside a request (the serving loop's arena lent to a job):
/// where a lens ([`Engine::logit_lens_in`]) reads its cached prefix and leaves its positions.
pub struct CacheLease<'a> {
    pub kv: &'a mut KvCache,
    /// A sequence id no one else uses; the work adds it and removes it again.
    pub seq: SeqId,
    /// Start from the longest cached prefix and publish the positions computed.
    pub prefix_caching: bool,
}

/// Starts `seq` in `kv` from the longest cached prefix of `tokens` (all but the last token, whose
/// logits are wanted; nothing when `prefix_caching` is off), if `kv` has room for the positions
/// after it: the positions attached. None, with `seq` removed again, when it has no room.
pub(crate) fn start_from_prefix(
    kv: &mut KvCache,
    seq: SeqId,
    tokens: &[u32],
    prefix_caching: bool,
) -> Result<Option<usize>, EngineError> {
    kv.add_sequence_for(seq, tokens.len())?;
    let hit = if prefix_caching {
        kv.attach_prefix(seq, &tokens[..tokens.len().saturating_sub(1)])
            .unwrap_or(0)
    } else {
        0
    };
    let room = kv.fits(seq, tokens.len(), usize::MAX, 0);
    if !room {
        let _ = kv.remove_sequence(seq);
        return Ok(None);
    }
    Ok(Some(hit))
}
