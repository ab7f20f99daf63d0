//! One sequence's state across calls: its tokens, their KV cache and the last logits, and the
//! autoregressive loop that extends it: sampling through the chain, stop conditions (end of
//! generation, stop tokens, stop strings held back while streaming, `max_tokens`, a full
//! context), log-probabilities on request, and one event per token.

use std::fmt;
use std::time::Instant;

use rill_model::{Batch, HeadCut, KvCache, Model, Precision};

use crate::decoder::{Emitted, Forcing, SeqDecoder};
use crate::logprobs::{check_top_logprobs, PromptTokenLogprobs, TokenLogprobs};
use crate::sampling::check_tokens;
use crate::{Engine, EngineError, SamplingParams, SpeculativeStats, StopMatcher};

pub(crate) const SEQ: rill_model::SeqId = 0;

/// Logits of all prompt rows are computed in chunks of at most this many bytes and rows.
const PROMPT_LOGITS_BYTES: usize = 32 << 20;
const PROMPT_LOGITS_ROWS: usize = 64;

/// The most positions a session computes in one pass: a prompt, or tokens appended at once, go
/// through in chunks of this many (the same bits as one pass: a row's arithmetic does not depend
/// on what shares its pass). So a sliding-window layer holds its window and one chunk (plus the
/// rollback slack), not the whole context, and a pass's activations stay bounded.
pub const SESSION_PASS_ROWS: usize = 512;

/// The passes that compute `tokens` after `start` cached positions: batches of at most
/// [`SESSION_PASS_ROWS`], only the last one's last row wanting logits (the head is a large
/// product), each with the tokens it adds.
pub(crate) fn prompt_passes(tokens: &[u32], start: usize) -> impl Iterator<Item = (Batch, &[u32])> {
    let n_chunks = tokens.len().div_ceil(SESSION_PASS_ROWS);
    tokens
        .chunks(SESSION_PASS_ROWS)
        .enumerate()
        .map(move |(c, chunk)| {
            let mut batch = Batch::prompt(SEQ, chunk, start + c * SESSION_PASS_ROWS, false);
            if c + 1 < n_chunks {
                batch.rows.iter_mut().for_each(|r| r.logits = false);
            }
            (batch, chunk)
        })
}

/// Positions a sliding-window layer of a session's cache (or a draft's) holds: the window, one
/// pass ([`SESSION_PASS_ROWS`]), the rollback slack (speculation's rejected drafts) and a block
/// either side for alignment.
pub(crate) fn window_layer_positions(window: usize) -> usize {
    let slack = rill_model::SlidingWindow::DEFAULT_ROLLBACK_SLACK;
    let block = rill_model::KvCache::DEFAULT_BLOCK_SIZE;
    window + SESSION_PASS_ROWS + slack + 2 * block
}

/// A cache of `capacity` positions for `model` on `precision`'s path; a sliding-window model's
/// window layers hold only [`window_layer_positions`].
pub(crate) fn session_kv_cache(
    model: &Model,
    capacity: usize,
    precision: Precision,
) -> Result<rill_model::KvCache, EngineError> {
    Ok(match model.config().sliding_window {
        Some(window) => {
            let held = window_layer_positions(window).min(capacity);
            model.new_windowed_kv_cache(capacity, held, precision)?
        }
        None => model.new_kv_cache(capacity, precision)?,
    })
}

/// Why generation ended, in OpenAI's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token, a stop token, a stop string, or a complete constrained text.
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

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What exactly ended generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishCause {
    /// An end-of-generation token of the model (EOS, EOT, ...), not ignored.
    EndOfGeneration(u32),
    /// One of [`GenerateParams::stop_token_ids`].
    StopToken(u32),
    /// One of [`GenerateParams::stop`] (as given).
    StopString(String),
    /// [`GenerateParams::max_tokens`] tokens were generated.
    MaxTokens(usize),
    /// The constrained text was closed for the budget: with `max_tokens` about to cut it
    /// mid-document, the decoder forced `closing` tokens that complete it (a valid document
    /// whose end the model did not choose).
    ClosedForMaxTokens { max_tokens: usize, closing: usize },
    /// The context holds no more tokens.
    ContextFull { context: usize },
    /// The constraint's text is complete and nothing may follow it.
    ConstraintComplete,
    /// The callback returned `false`.
    Cancelled,
}

impl FinishCause {
    pub fn reason(&self) -> FinishReason {
        match self {
            FinishCause::EndOfGeneration(_)
            | FinishCause::StopToken(_)
            | FinishCause::StopString(_)
            | FinishCause::ConstraintComplete => FinishReason::Stop,
            FinishCause::MaxTokens(_)
            | FinishCause::ClosedForMaxTokens { .. }
            | FinishCause::ContextFull { .. } => FinishReason::Length,
            FinishCause::Cancelled => FinishReason::Cancelled,
        }
    }
}

impl fmt::Display for FinishCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FinishCause::EndOfGeneration(t) => write!(f, "end-of-generation token {t}"),
            FinishCause::StopToken(t) => write!(f, "stop token {t}"),
            FinishCause::StopString(s) => write!(f, "stop string {s:?}"),
            FinishCause::MaxTokens(n) => write!(f, "max_tokens ({n}) reached"),
            FinishCause::ClosedForMaxTokens {
                max_tokens,
                closing,
            } => write!(
                f,
                "max_tokens ({max_tokens}) reached: the constrained text was closed with \
                 {closing} forced token{}",
                if *closing == 1 { "" } else { "s" }
            ),
            FinishCause::ContextFull { context } => {
                write!(f, "the context is full ({context} tokens)")
            }
            FinishCause::ConstraintComplete => write!(f, "the constrained text is complete"),
            FinishCause::Cancelled => write!(f, "cancelled by the caller"),
        }
    }
}

/// Parameters of one generation. The default: greedy, at most 256 tokens, stop at
/// end-of-generation tokens, no log-probabilities.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Most tokens to generate (the token that stops generation included).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep going past end-of-generation tokens (they are then decoded like any token).
    pub ignore_eos: bool,
    /// End-of-generation tokens (unless ignored) and stop tokens are never sampled, and stop
    /// strings never match, before this many tokens have been generated.
    pub min_tokens: usize,
    /// Stop strings, matched on the decoded text even across tokens; neither the stop string nor
    /// anything after it is returned, and streamed text is held back while it could be the start
    /// of one.
    pub stop: Vec<String>,
    /// Tokens that end generation (not included in the text).
    pub stop_token_ids: Vec<u32>,
    /// Report each generated token's log-probabilities with this many alternatives (at most
    /// [`crate::MAX_TOP_LOGPROBS`]; 0 for the token's own only). `None`: nothing is computed.
    pub top_logprobs: Option<usize>,
    /// Compute each prompt token's log-probability given its prefix (with `top_logprobs`
    /// alternatives). The whole prompt is then computed again, the cached prefix is not reused.
    pub prompt_logprobs: bool,
    /// What the text must be (a JSON schema, regex, choice or grammar, compiled by
    /// [`rill_constrain::Constrainer`]): each step samples only from the tokens it allows,
    /// tokens it forces are appended without sampling (unless log-probabilities are asked
    /// for), and generation ends when the text is complete.
    pub constraint: Option<rill_constrain::Grammar>,
    /// A reasoning model's thinking ends after this many tokens (its closing forced).
    pub thinking_budget: Option<crate::ThinkingBudget>,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 256,
            sampling: SamplingParams::default(),
            ignore_eos: false,
            min_tokens: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            top_logprobs: None,
            prompt_logprobs: false,
            constraint: None,
            thinking_budget: None,
        }
    }
}

impl GenerateParams {
    /// Checks every parameter, token ids against a vocabulary of `vocab_size` tokens.
    pub fn validate(&self, vocab_size: usize) -> Result<(), EngineError> {
        self.sampling.validate_for_vocab(vocab_size)?;
        check_tokens("stop_token_ids", &self.stop_token_ids, vocab_size)?;
        StopMatcher::new(&self.stop)?;
        if let Some(n) = self.top_logprobs {
            check_top_logprobs(n)?;
        }
        Ok(())
    }
}

/// One generated token, as it is produced.
#[derive(Debug, Clone)]
pub struct TokenEvent<'a> {
    pub token: u32,
    /// Text released by this token: complete UTF-8 only, and nothing that could still be the
    /// start of a stop string (so it may be empty, or hold the text of earlier tokens). The
    /// events' texts add up to [`Generation::text`].
    pub text: &'a str,
    /// Probability the token was drawn with, in the processed distribution (1 for greedy).
    pub probability: f32,
    /// Index of the token among the generated ones.
    pub index: usize,
    /// Log-probabilities, when [`GenerateParams::top_logprobs`] asked for them.
    pub logprobs: Option<&'a TokenLogprobs>,
    /// Set on the last event when generation ends by itself (not on cancellation, which the
    /// callback decides).
    pub finish_reason: Option<FinishReason>,
}

/// The result of a generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Every generated token, the one that stopped generation included.
    pub tokens: Vec<u32>,
    /// The generated text: without end-of-generation and stop tokens, cut before a stop string.
    /// On cancellation, the text streamed until then (held-back text is dropped).
    pub text: String,
    pub finish_reason: FinishReason,
    /// What exactly ended generation (the stop string or token, if one did).
    pub finish: FinishCause,
    /// Per generated token, when [`GenerateParams::top_logprobs`] asked for them.
    pub logprobs: Vec<TokenLogprobs>,
    /// Per prompt token after the first, when [`GenerateParams::prompt_logprobs`] asked.
    pub prompt_logprobs: Vec<PromptTokenLogprobs>,
    /// Prompt tokens actually computed (the rest were reused from the cache).
    pub prompt_tokens_computed: usize,
    pub prompt_tokens_reused: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Drafted and accepted tokens, when generated with speculative decoding
    /// ([`Session::generate_speculative`]).
    pub speculative: Option<SpeculativeStats>,
    /// Generated tokens that the constraint forced: appended without sampling, computed
    /// together in one forward pass ([`GenerateParams::constraint`]).
    pub forced_tokens: usize,
}

impl Generation {
    /// The stop string that ended generation.
    pub fn stop_string(&self) -> Option<&str> {
        match &self.finish {
            FinishCause::StopString(s) => Some(s),
            _ => None,
        }
    }

    /// The token that ended generation: an end-of-generation or stop token.
    pub fn stop_token(&self) -> Option<u32> {
        match self.finish {
            FinishCause::EndOfGeneration(t) | FinishCause::StopToken(t) => Some(t),
            _ => None,
        }
    }

    /// Prompt tokens computed per second of prefill.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens_computed as f64 / self.prefill_seconds.max(1e-9)
    }

    /// Generated tokens per second of decoding.
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.tokens.len() as f64 / self.decode_seconds.max(1e-9)
    }
}

/// A sequence with its KV cache.
pub struct Session {
    pub(crate) kv: KvCache,
    pub(crate) context: usize,
    /// Tokens whose keys and values are in `kv`.
    pub(crate) tokens: Vec<u32>,
    /// Logits after the last token of `tokens`.
    pub(crate) logits: Vec<f32>,
    /// Reused for every decode step, so stepping allocates no batch.
    step: Batch,
    /// What the next pass's last row needs of its logits (set by a generation for its steps).
    next_cut: HeadCut,
    /// Whether `logits` hold every logit exactly (else only a sampler's cut of them).
    logits_full: bool,
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
            next_cut: HeadCut::Full,
            logits_full: true,
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

    /// Logits after the last cached token. After a generation whose sampler let the output head
    /// take two passes, only what that sampler read is exact ([`Session::last_logits_are_full`]).
    pub fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    /// Whether every one of [`Session::last_logits`] is exact (else only a sampler's cut).
    pub fn last_logits_are_full(&self) -> bool {
        self.logits_full
    }

    /// Makes the cache hold exactly `prompt`, computing only what differs from what is cached
    /// (the longest common prefix is kept). Returns (computed, reused) token counts.
    pub fn set_prompt(
        &mut self,
        model: &mut Model,
        precision: Precision,
        prompt: &[u32],
    ) -> Result<(usize, usize), EngineError> {
        self.check_prompt(prompt)?;
        let mut common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // The last prompt token must be computed to get its logits.
        if common == prompt.len() {
            if common == self.tokens.len() && !self.logits.is_empty() && self.logits_full {
                return Ok((0, common));
            }
            common -= 1;
        }
        // Fewer when the window layers let go of what a query at `common` reads.
        let common = self.kv.truncate(SEQ, common)?;
        self.tokens.truncate(common);
        self.logits.clear();
        let rest = &prompt[common..];
        self.forward_chunks(model, precision, rest)?;
        Ok((rest.len(), common))
    }

    /// Computes `tokens` after the cached ones, [`SESSION_PASS_ROWS`] at a time, leaving the
    /// logits after the last. A pass that fails leaves the chunks before it cached (and the
    /// tokens saying so) and no logits.
    fn forward_chunks(
        &mut self,
        model: &mut Model,
        precision: Precision,
        tokens: &[u32],
    ) -> Result<(), EngineError> {
        self.logits.clear();
        self.logits_full = self.next_cut == HeadCut::Full;
        for (mut batch, chunk) in prompt_passes(tokens, self.tokens.len()) {
            if let Some(last) = batch.rows.last_mut().filter(|r| r.logits) {
                last.head = self.next_cut;
            }
            model.forward(&batch, &mut self.kv, precision, &mut self.logits)?;
            self.tokens.extend_from_slice(chunk);
        }
        Ok(())
    }

    pub(crate) fn check_prompt(&self, prompt: &[u32]) -> Result<(), EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > self.context {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                context: self.context,
            });
        }
        Ok(())
    }

    /// Makes the cache hold exactly `prompt`, computing all of it (nothing is reused: the
    /// cached positions have no logits left), with the logits of every position, in chunks of
    /// bounded size. Returns each prompt token's log-probability given its prefix (from the
    /// second token on) with `top_n` alternatives.
    pub fn set_prompt_with_logprobs(
        &mut self,
        model: &mut Model,
        precision: Precision,
        prompt: &[u32],
        top_n: usize,
    ) -> Result<Vec<PromptTokenLogprobs>, EngineError> {
        self.check_prompt(prompt)?;
        check_top_logprobs(top_n)?;
        self.kv.truncate(SEQ, 0)?;
        self.tokens.clear();
        self.logits.clear();
        let vocab = model.config().vocab_size.max(1);
        let chunk = (PROMPT_LOGITS_BYTES / (vocab * 4)).clamp(1, PROMPT_LOGITS_ROWS);
        let mut scored = Vec::with_capacity(prompt.len() - 1);
        let mut rows = Vec::new();
        for (c, part) in prompt.chunks(chunk).enumerate() {
            let start = c * chunk;
            let batch = Batch::prompt(SEQ, part, start, true);
            model.forward(&batch, &mut self.kv, precision, &mut rows)?;
            self.tokens.extend_from_slice(part);
            for (r, row) in rows.chunks_exact(vocab).enumerate() {
                // The row at `pos` predicts the token at `pos + 1`.
                let pos = start + r;
                match prompt.get(pos + 1) {
                    Some(&next) => {
                        scored.push(PromptTokenLogprobs::from_logits(row, pos + 1, next, top_n))
                    }
                    None => self.logits.extend_from_slice(row),
                }
            }
        }
        Ok(scored)
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
        self.step
            .push_cut(SEQ, token, self.tokens.len(), self.next_cut);
        self.logits_full = self.next_cut == HeadCut::Full;
        model.forward(&self.step, &mut self.kv, precision, &mut self.logits)?;
        self.tokens.push(token);
        Ok(())
    }

    /// Appends `tokens` ([`SESSION_PASS_ROWS`] per pass) and computes the logits after the last.
    fn extend(
        &mut self,
        model: &mut Model,
        precision: Precision,
        tokens: &[u32],
    ) -> Result<(), EngineError> {
        if let [token] = tokens {
            return self.push(model, precision, *token);
        }
        let start = self.tokens.len();
        if start + tokens.len() > self.context {
            return Err(EngineError::PromptTooLong {
                prompt: start + tokens.len(),
                context: self.context,
            });
        }
        self.forward_chunks(model, precision, tokens)
    }

    /// Generates after `prompt`: prefills what is not cached, then samples token by token,
    /// calling `on_token` for each (return `false` from it to cancel). Stops at an
    /// end-of-generation token (unless `ignore_eos`), a stop token, a stop string, after
    /// `max_tokens`, or when the context is full (with reason `length`, not an error).
    pub fn generate(
        &mut self,
        engine: &mut Engine,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_token: impl FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation, EngineError> {
        self.start(engine, prompt, params)?;
        let prefill = self.prefill(engine, prompt, params)?;
        let Engine {
            model,
            tokenizer,
            precision,
        } = engine;
        let decoder = SeqDecoder::new(tokenizer, params, 0, false, Forcing::WhenUnobserved)?;
        let mut out = Emitter::new(decoder, params, self.context);
        let mut pending = Vec::new();
        let finish = loop {
            if out.generated() >= params.max_tokens {
                break FinishCause::MaxTokens(params.max_tokens);
            }
            if let Some(finish) = out.decode(&self.logits, &self.tokens, &mut on_token)? {
                break finish;
            }
            // Tokens the constraint forced follow the sampled one, computed in one pass.
            pending.clear();
            pending.extend_from_slice(out.step_tokens());
            self.next_cut = out.head_cut();
            let extended = self.extend(model, *precision, &pending);
            self.next_cut = HeadCut::Full;
            extended?;
        };
        let forced = out.forced();
        let mut generation = out.finish(finish, prefill);
        generation.forced_tokens = forced;
        Ok(generation)
    }

    /// Checks a generation's parameters and prompt.
    pub(crate) fn start(
        &self,
        engine: &Engine,
        prompt: &[u32],
        params: &GenerateParams,
    ) -> Result<(), EngineError> {
        params.validate(engine.model.config().vocab_size)?;
        self.check_prompt(prompt)
    }

    /// A generation's prefill: the prompt made the cached sequence (with its log-probabilities
    /// when asked for), timed.
    pub(crate) fn prefill(
        &mut self,
        engine: &mut Engine,
        prompt: &[u32],
        params: &GenerateParams,
    ) -> Result<Prefill, EngineError> {
        let started = Instant::now();
        let (prompt_logprobs, computed, reused) = if params.prompt_logprobs {
            let top_n = params.top_logprobs.unwrap_or(0);
            let scored =
                self.set_prompt_with_logprobs(&mut engine.model, engine.precision, prompt, top_n)?;
            (scored, prompt.len(), 0)
        } else {
            let (computed, reused) =
                self.set_prompt(&mut engine.model, engine.precision, prompt)?;
            (Vec::new(), computed, reused)
        };
        Ok(Prefill {
            prompt_logprobs,
            computed,
            reused,
            seconds: started.elapsed().as_secs_f64(),
            decode_started: Instant::now(),
        })
    }
}

/// What a generation's prefill did.
pub(crate) struct Prefill {
    pub(crate) prompt_logprobs: Vec<PromptTokenLogprobs>,
    pub(crate) computed: usize,
    pub(crate) reused: usize,
    pub(crate) seconds: f64,
    pub(crate) decode_started: Instant,
}

/// A generation's record around its [`SeqDecoder`]: every token the decoder emits is kept (its
/// text and log-probabilities too) and told to the caller's callback as a [`TokenEvent`].
/// Shared by [`Session::generate`] and speculative decoding, so both end generation the same way.
pub(crate) struct Emitter<'t> {
    /// Its own copy, so that a generation stepped from outside (speculation in the serving
    /// loop) can own its emitter.
    params: GenerateParams,
    context: usize,
    decoder: SeqDecoder<'t>,
    tokens: Vec<u32>,
    text: String,
    all_logprobs: Vec<TokenLogprobs>,
}

/// What the record keeps of each emitted token, then the callback.
struct Record<'a, F> {
    params: &'a GenerateParams,
    tokens: &'a mut Vec<u32>,
    text: &'a mut String,
    all_logprobs: &'a mut Vec<TokenLogprobs>,
    on_token: F,
}

impl<F: FnMut(&TokenEvent<'_>) -> bool> Record<'_, F> {
    fn take(&mut self, e: Emitted<'_>) -> bool {
        self.tokens.push(e.token);
        self.text.push_str(e.text);
        let keep_going = (self.on_token)(&TokenEvent {
            token: e.token,
            text: e.text,
            probability: e.probability,
            index: e.index,
            logprobs: self.params.top_logprobs.map(|_| e.logprobs),
            finish_reason: e.finish.map(FinishCause::reason),
        });
        if self.params.top_logprobs.is_some() {
            self.all_logprobs.push(e.logprobs.clone());
        }
        keep_going
    }
}

impl<'t> Emitter<'t> {
    /// What its next step reads of the logits.
    pub(crate) fn head_cut(&self) -> HeadCut {
        self.decoder.head_cut()
    }

    pub(crate) fn new(decoder: SeqDecoder<'t>, params: &GenerateParams, context: usize) -> Self {
        Emitter {
            params: params.clone(),
            context,
            decoder,
            tokens: Vec::new(),
            text: String::new(),
            all_logprobs: Vec::new(),
        }
    }

    pub(crate) fn decoder(&self) -> &SeqDecoder<'t> {
        &self.decoder
    }

    pub(crate) fn decoder_mut(&mut self) -> &mut SeqDecoder<'t> {
        &mut self.decoder
    }

    pub(crate) fn params(&self) -> &GenerateParams {
        &self.params
    }

    pub(crate) fn max_tokens(&self) -> usize {
        self.params.max_tokens
    }

    /// Tokens generated so far.
    pub(crate) fn generated(&self) -> usize {
        self.tokens.len()
    }

    /// Tokens the constraint forced so far.
    pub(crate) fn forced(&self) -> usize {
        self.decoder.forced()
    }

    /// The tokens the last [`Emitter::decode`] emitted (see [`SeqDecoder::step_tokens`]).
    pub(crate) fn step_tokens(&self) -> &[u32] {
        self.decoder.step_tokens()
    }

    /// A decode step from `logits` after `history` ([`SeqDecoder::decode`]). Returns what
    /// ended generation, if anything did (or the callback cancelled).
    pub(crate) fn decode(
        &mut self,
        logits: &[f32],
        history: &[u32],
        on_token: &mut impl FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Option<FinishCause>, EngineError> {
        self.recorded(on_token, |decoder, params, context, sink| {
            decoder.decode(params, context, logits, history, false, sink)
        })
    }

    /// Emits `token`, chosen with `probability` from the decoder's last distribution over
    /// `logits`, at `position` ([`SeqDecoder::emit`]). Returns what ended generation, if this
    /// token did (or the callback cancelled).
    pub(crate) fn emit(
        &mut self,
        token: u32,
        probability: f32,
        logits: &[f32],
        position: usize,
        on_token: &mut impl FnMut(&TokenEvent<'_>) -> bool,
    ) -> Option<FinishCause> {
        self.recorded(on_token, |decoder, params, context, sink| {
            decoder.emit(params, context, token, probability, logits, position, sink)
        })
    }

    /// Runs `step` on the decoder with a sink that records every token it emits and tells
    /// `on_token` about it.
    fn recorded<R>(
        &mut self,
        on_token: &mut impl FnMut(&TokenEvent<'_>) -> bool,
        step: impl FnOnce(
            &mut SeqDecoder<'t>,
            &GenerateParams,
            usize,
            &mut dyn FnMut(Emitted<'_>) -> bool,
        ) -> R,
    ) -> R {
        let Emitter {
            params,
            context,
            decoder,
            tokens,
            text,
            all_logprobs,
        } = self;
        let mut record = Record {
            params,
            tokens,
            text,
            all_logprobs,
            on_token,
        };
        step(decoder, params, *context, &mut |e| record.take(e))
    }

    /// The result, once `finish` ended generation.
    pub(crate) fn finish(self, finish: FinishCause, prefill: Prefill) -> Generation {
        Generation {
            tokens: self.tokens,
            text: self.text,
            finish_reason: finish.reason(),
            finish,
            logprobs: self.all_logprobs,
            prompt_logprobs: prefill.prompt_logprobs,
            prompt_tokens_computed: prefill.computed,
            prompt_tokens_reused: prefill.reused,
            prefill_seconds: prefill.seconds,
            decode_seconds: prefill.decode_started.elapsed().as_secs_f64(),
            speculative: None,
            forced_tokens: 0,
        }
    }
}
