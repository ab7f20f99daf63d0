//! One sequence's state across calls: its tokens, their KV cache and the last logits, and the
//! autoregressive loop that extends it.

use rill_model::{Batch, KvCache, Model, Precision};
use rill_tokenizer::Tokenizer;

use crate::{Engine, EngineError, Sampler, SamplingParams};

const SEQ: rill_model::SeqId = 0;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token.
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// The caller asked to stop.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Parameters of one generation.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            ignore_eos: false,
        }
    }
}

/// One generated token, as it is produced.
#[derive(Debug, Clone)]
pub struct TokenEvent<'a> {
    pub token: u32,
    /// Complete UTF-8 text this token finished (may be empty while a character is partial).
    pub text: &'a str,
    /// Probability the token was drawn with (1 for greedy).
    pub probability: f32,
    pub index: usize,
}

/// The result of a generation.
#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    /// Prompt tokens actually computed (the rest were reused from the cache).
    pub prompt_tokens_computed: usize,
    pub prompt_tokens_reused: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

/// A sequence with its KV cache.
pub struct Session {
    kv: KvCache,
    context: usize,
    /// Tokens whose keys and values are in `kv`.
    tokens: Vec<u32>,
    /// Logits after the last token of `tokens`.
    logits: Vec<f32>,
    /// Reused for every decode step, so stepping allocates no batch.
    step: Batch,
}

impl Session {
    pub(crate) fn new(mut kv: KvCache, context: usize) -> Session {
        kv.add_sequence(SEQ)
            .expect("a fresh cache has no sequences");
        Session {
            kv,
            context,
            tokens: Vec::new(),
            logits: Vec::new(),
            step: Batch::new(),
        }
    }

    /// Tokens currently cached.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn context(&self) -> usize {
        self.context
    }

    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    /// Logits after the last cached token.
    pub fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    /// Makes the cache hold exactly `prompt`, computing only what differs from what is cached
    /// (the longest common prefix is kept). Returns (computed, reused) token counts.
    pub fn set_prompt(
        &mut self,
        model: &mut Model,
        precision: Precision,
        prompt: &[u32],
    ) -> Result<(usize, usize), EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > self.context {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                context: self.context,
            });
        }
        let mut common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // The last prompt token must be computed to get its logits.
        if common == prompt.len() {
            if common == self.tokens.len() && !self.logits.is_empty() {
                return Ok((0, common));
            }
            common -= 1;
        }
        self.kv.truncate(SEQ, common)?;
        self.tokens.truncate(common);
        self.logits.clear();
        let rest = &prompt[common..];
        let batch = Batch::prompt(SEQ, rest, common, false);
        model.forward(&batch, &mut self.kv, precision, &mut self.logits)?;
        self.tokens.extend_from_slice(rest);
        Ok((rest.len(), common))
    }

    /// Appends one token and computes the logits after it.
    pub fn push(
        &mut self,
        model: &mut Model,
        precision: Precision,
        token: u32,
    ) -> Result<(), EngineError> {
        if self.tokens.len() >= self.context {
            return Err(EngineError::PromptTooLong {
                prompt: self.tokens.len() + 1,
                context: self.context,
            });
        }
        self.step.rows.clear();
        self.step.push(SEQ, token, self.tokens.len(), true);
        model.forward(&self.step, &mut self.kv, precision, &mut self.logits)?;
        self.tokens.push(token);
        Ok(())
    }

    /// Generates after `prompt`: prefills what is not cached, then samples token by token,
    /// calling `on_token` for each (return `false` from it to cancel).
    pub fn generate(
        &mut self,
        engine: &mut Engine,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_token: impl FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation, EngineError> {
        let mut sampler = Sampler::new(params.sampling)?;
        let started = std::time::Instant::now();
        let (computed, reused) = self.set_prompt(&mut engine.model, engine.precision, prompt)?;
        let prefill_seconds = started.elapsed().as_secs_f64();
        let decode_started = std::time::Instant::now();

        let tokenizer: &Tokenizer = &engine.tokenizer;
        let mut decoder = tokenizer.stream_decoder().continuing();
        let mut tokens = Vec::new();
        let mut text = String::new();
        let finish_reason = loop {
            if tokens.len() >= params.max_tokens {
                break FinishReason::Length;
            }
            let (token, probability) = sampler.sample(&self.logits);
            tokens.push(token);
            let end = tokenizer.is_end_of_generation(token) && !params.ignore_eos;
            let piece = if end {
                String::new()
            } else {
                decoder.push(token)
            };
            text.push_str(&piece);
            let keep_going = on_token(&TokenEvent {
                token,
                text: &piece,
                probability,
                index: tokens.len() - 1,
            });
            if end {
                break FinishReason::Stop;
            }
            if !keep_going {
                break FinishReason::Cancelled;
            }
            if tokens.len() >= params.max_tokens {
                break FinishReason::Length;
            }
            if self.tokens.len() >= self.context {
                break FinishReason::Length;
            }
            self.push(&mut engine.model, engine.precision, token)?;
        };
        let tail = decoder.finish();
        if !tail.is_empty() {
            text.push_str(&tail);
            on_token(&TokenEvent {
                token: *tokens.last().unwrap_or(&0),
                text: &tail,
                probability: 1.0,
                index: tokens.len().saturating_sub(1),
            });
        }
        Ok(Generation {
            tokens,
            text,
            finish_reason,
            prompt_tokens_computed: computed,
            prompt_tokens_reused: reused,
            prefill_seconds,
            decode_seconds: decode_started.elapsed().as_secs_f64(),
        })
    }
}
