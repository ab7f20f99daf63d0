//! What happens to each chosen token, the same way everywhere a sequence generates
//! ([`crate::Session::generate`], speculative decoding, the serving loop): the stop checks in a
//! fixed order (stop and end-of-generation tokens, `max_tokens`, a full context, stop strings),
//! the streamed text through the tokenizer's [`StreamDecoder`] with stop strings held back by the
//! [`StopMatcher`], and the token's log-probabilities. It keeps only per-sequence state and takes
//! the parameters with each token, so a serving-loop sequence can keep it across steps and
//! preemptions; it reuses its buffers, so a token costs no allocation.

use rill_tokenizer::{StreamDecoder, Tokenizer};

use crate::{EngineError, FinishCause, GenerateParams, SamplerChain, StopMatcher, TokenLogprobs};

/// The sampler chain of a generation: `min_tokens` withholds the stop tokens and (unless
/// ignored) the end-of-generation tokens. Choice `c` of a request is seeded with `seed + c`, so
/// choice 0 draws what a single generation with the same seed draws.
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

/// One sequence's output so far (see the module documentation).
pub(crate) struct TokenOutput<'t> {
    tokenizer: &'t Tokenizer,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    generated: usize,
    piece: String,
    released: String,
    logprobs: TokenLogprobs,
    /// The next token completes the constrained text ([`TokenOutput::complete_next`]).
    complete: bool,
    /// The next token ends generation with this cause ([`TokenOutput::end_next`]).
    end: Option<FinishCause>,
}

impl<'t> TokenOutput<'t> {
    pub(crate) fn new(
        tokenizer: &'t Tokenizer,
        params: &GenerateParams,
    ) -> Result<TokenOutput<'t>, EngineError> {
        Ok(TokenOutput {
            tokenizer,
            decoder: tokenizer.stream_decoder().continuing(),
            stop: StopMatcher::new(&params.stop)?,
            generated: 0,
            piece: String::new(),
            released: String::new(),
            logprobs: TokenLogprobs::default(),
            complete: false,
            end: None,
        })
    }

    /// Tokens generated so far.
    pub(crate) fn generated(&self) -> usize {
        self.generated
    }

    /// Text released by the last token: complete UTF-8, never any part of a stop string
    /// (possibly empty; the released texts add up to the generation's text).
    pub(crate) fn text(&self) -> &str {
        &self.released
    }

    /// The last token's log-probabilities (computed only when `params.top_logprobs` asks).
    pub(crate) fn logprobs(&self) -> &TokenLogprobs {
        &self.logprobs
    }

    /// The next [`TokenOutput::emit`] ends generation with
    /// [`FinishCause::ConstraintComplete`] (unless the token is itself a stop): the constraint
    /// allows nothing after it.
    pub(crate) fn complete_next(&mut self) {
        self.complete = true;
    }

    /// The next [`TokenOutput::emit`] ends generation with `cause` (the last token of a
    /// closing forced for the budget), whatever else it would have ended with.
    pub(crate) fn end_next(&mut self, cause: FinishCause) {
        self.end = Some(cause);
    }

    /// Takes in `token`, drawn with `probability` from the processed distribution `dist` of
    /// `logits`, when `cached` tokens are in the sequence (the token itself not yet), in a
    /// context of `context` positions. Returns what ended the generation, if this token did.
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
    ) -> Option<FinishCause> {
        self.generated += 1;
        if let Some(n) = params.top_logprobs {
            self.logprobs.compute(logits, dist, token, probability, n);
        }
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
            if std::mem::take(&mut self.complete) {
                finish = Some(FinishCause::ConstraintComplete);
            } else if self.generated >= params.max_tokens {
                finish = Some(FinishCause::MaxTokens(params.max_tokens));
            } else if cached >= context {
                finish = Some(FinishCause::ContextFull { context });
            }
        }
        if let Some(cause) = self.end.take() {
            self.complete = false;
            finish = Some(cause);
        }
        if finish.is_some() {
            self.piece.push_str(&self.decoder.finish());
        }
        self.released.clear();
        self.stop.set_armed(self.generated >= params.min_tokens);
        if let Some(i) = self.stop.push(&self.piece, &mut self.released) {
            finish = Some(FinishCause::StopString(params.stop[i].clone()));
        } else if finish.is_some() {
            self.stop.finish(&mut self.released);
        }
        finish
    }
}
