//! One choice's output: streamed text through the tokenizer's [`StreamDecoder`], stop strings
//! held back by the [`StopMatcher`], the stop checks and log-probabilities, in exactly the order
//! [`crate::Session::generate`] applies them (so a choice's tokens, text and finish are what a
//! session would give). The session's emitter borrows its parameters for one call; a choice
//! lives across engine steps and preemptions, so it keeps its own state here.

use rill_tokenizer::{StreamDecoder, Tokenizer};

use crate::{EngineError, FinishCause, GenerateParams, SamplerChain, StopMatcher, TokenLogprobs};

/// What one token produced.
pub(crate) struct Emitted {
    /// Text released by this token (stop-string safe, possibly empty).
    pub(crate) text: String,
    pub(crate) logprobs: Option<TokenLogprobs>,
    /// Set when this token ended the choice.
    pub(crate) finish: Option<FinishCause>,
}

pub(crate) struct Output<'t> {
    tokenizer: &'t Tokenizer,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    generated: usize,
    piece: String,
    logprobs: TokenLogprobs,
}

/// The sampler chain of one choice, as [`crate::Session::generate`] sets it up: `min_tokens`
/// withholds the stop tokens and (unless ignored) the end-of-generation tokens. Choice `c` is
/// seeded with `seed + c`, so choice 0 draws what a single request with the same seed draws.
pub(crate) fn sampler_for(
    tokenizer: &Tokenizer,
    params: &GenerateParams,
    choice: usize,
) -> Result<SamplerChain, EngineError> {
    let mut sampling = params.sampling.clone();
    sampling.seed = sampling.seed.wrapping_add(choice as u64);
    let mut sampler = SamplerChain::new(sampling)?;
    if params.min_tokens > 0 {
        let mut withheld = params.stop_token_ids.clone();
        if !params.ignore_eos {
            withheld.extend_from_slice(tokenizer.end_of_generation_ids());
        }
        sampler.set_min_tokens(params.min_tokens, &withheld);
    }
    Ok(sampler)
}

impl<'t> Output<'t> {
    pub(crate) fn new(
        tokenizer: &'t Tokenizer,
        params: &GenerateParams,
    ) -> Result<Output<'t>, EngineError> {
        Ok(Output {
            tokenizer,
            decoder: tokenizer.stream_decoder().continuing(),
            stop: StopMatcher::new(&params.stop)?,
            generated: 0,
            piece: String::new(),
            logprobs: TokenLogprobs::default(),
        })
    }

    /// Tokens generated so far.
    pub(crate) fn generated(&self) -> usize {
        self.generated
    }

    /// Emits `token`, drawn with `probability` from the processed distribution `dist` of
    /// `logits`, when `cached` tokens are in the sequence (the token itself not yet), in a
    /// context of `context` positions.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn emit(
        &mut self,
        params: &GenerateParams,
        context: usize,
        token: u32,
        probability: f32,
        logits: &[f32],
        dist: &[(u32, f32)],
        cached: usize,
    ) -> Emitted {
        self.generated += 1;
        let logprobs = params.top_logprobs.map(|n| {
            self.logprobs.compute(logits, dist, token, probability, n);
            self.logprobs.clone()
        });
        let mut finish = if params.stop_token_ids.contains(&token) {
            Some(FinishCause::StopToken(token))
        } else if !params.ignore_eos && self.tokenizer.is_end_of_generation(token) {
            Some(FinishCause::EndOfGeneration(token))
        } else {
            None
        };
        self.piece.clear();
        if finish.is_none() {
            self.piece.push_str(&self.decoder.push(token));
            if self.generated >= params.max_tokens {
                finish = Some(FinishCause::MaxTokens(params.max_tokens));
            } else if cached >= context {
                finish = Some(FinishCause::ContextFull { context });
            }
        }
        if finish.is_some() {
            self.piece.push_str(&self.decoder.finish());
        }
        let mut text = String::new();
        self.stop.set_armed(self.generated >= params.min_tokens);
        if let Some(i) = self.stop.push(&self.piece, &mut text) {
            finish = Some(FinishCause::StopString(params.stop[i].clone()));
        } else if finish.is_some() {
            self.stop.finish(&mut text);
        }
        Emitted {
            text,
            logprobs,
            finish,
        }
    }
}
