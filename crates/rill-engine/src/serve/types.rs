//! The serving loop's public types: its configuration, a request, the events of its stream,
//! what each token reports when explained, and what the loop publishes between steps.

use tokio::sync::mpsc::UnboundedReceiver;

use crate::{FinishCause, FinishReason, GenerateParams, TokenLogprobs};

/// The most choices (`n`) one request may ask for (also at most [`ServeConfig::max_running`]).
pub const MAX_CHOICES: usize = 64;

/// How the engine loop serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// Bytes of the KV-cache arena (keys and values of every layer), allocated once at
    /// [`spawn`]; it is split into blocks of 16 positions.
    pub kv_cache_bytes: usize,
    /// For a model with sliding-window layers: how much of `kv_cache_bytes` their arena gets
    /// (0: about one window per running sequence, twice over; see [`split_kv_budget`]).
    pub kv_window_cache_bytes: usize,
    /// Most rows (prompt and generated tokens) in one forward pass. At least `max_running`.
    pub max_batch_tokens: usize,
    /// Most prompt rows in a step that also decodes (0: only `max_batch_tokens` bounds them).
    /// A step's time grows with its rows, and every decoding sequence waits for the whole step:
    /// this bounds their inter-token latency while prompts are taken in, at the price of
    /// spreading a prompt over more steps.
    pub max_prefill_rows_while_decoding: usize,
    /// Most sequences (choices) decoding at once.
    pub max_running: usize,
    /// Most requests waiting to be scheduled; `submit` refuses more.
    pub max_queue: usize,
    /// Per-sequence token limit (prompt and generated); 0: the model's trained context. Never
    /// more than the trained context nor than the KV arena holds.
    pub context: usize,
    /// Reuse cached KV blocks of identical prompt prefixes.
    pub prefix_caching: bool,
    /// Name reported by [`ServeHandle::model_info`]; empty: the file's `general.name`, else
    /// `"model"`. (The loop never sees the file's path: pass its stem here for that.)
    pub model_name: String,
    /// Prompt lookup in the loop: most tokens drafted per step for a decoding sequence whose
    /// last tokens occur earlier in its prompt or output (the tokens that followed them there),
    /// verified in the same forward pass as its plain row; 0 turns it off. Per sequence and
    /// step, a draft is as long as its tokens are worth their rows: the chance of each being
    /// kept (the sequence's record so far) against what a row costs beside what a token is
    /// worth (both measured on the loop's recent decoding steps), with a one-token probe now
    /// and then where nothing is worth it. The tokens are those plain decoding gives, draw
    /// for draw: a drafted token is kept when the sampler, run on its row, picks it.
    /// Sequences with a constraint, an explained trace or choices still to fork, and models
    /// with recurrent layers, decode plainly; drafts take only the rows a step has to spare.
    pub prompt_lookup_tokens: usize,
    /// Size prompt lookup's drafts by the measured rule above (the default). False: by the
    /// adaptive length of [`crate::SpeculativeParams::adaptive`] alone, so the loop's plan
    /// depends on no timing (what tests that count drafts or steps need).
    pub prompt_lookup_measured: bool,
    /// Record the prefix cache's changes ([`KvEventBatch`], one per step that changed it) for
    /// [`ServeHandle::take_kv_events`]: what prefix-aware routers subscribe to.
    pub kv_events: bool,
}

impl ServeConfig {
    /// Checks what does not depend on the model (what [`spawn`](super::spawn) checks first):
    /// a server validates its flags with it before it binds its port.
    pub fn validate(&self) -> Result<(), crate::EngineError> {
        let bad = |m: String| Err(crate::EngineError::BadConfig(m));
        if self.kv_cache_bytes == 0 {
            return bad("kv_cache_bytes must be positive (--kv-cache-mb: at least 1)".into());
        }
        if self.max_running == 0 {
            return bad("max_running must be at least 1".into());
        }
        if self.max_batch_tokens < self.max_running {
            return bad(format!(
                "max_batch_tokens ({}) must be at least max_running ({}): every running sequence needs a row each step",
                self.max_batch_tokens, self.max_running
            ));
        }
        if self.max_queue == 0 {
            return bad("max_queue must be at least 1".into());
        }
        if self.prompt_lookup_tokens > crate::speculative::MAX_DRAFT_TOKENS {
            return bad(format!(
                "prompt_lookup_tokens ({}) must be at most {}",
                self.prompt_lookup_tokens,
                crate::speculative::MAX_DRAFT_TOKENS
            ));
        }
        if self.kv_window_cache_bytes >= self.kv_cache_bytes && self.kv_window_cache_bytes > 0 {
            return bad(format!(
                "kv_window_cache_bytes ({}) must be less than kv_cache_bytes ({}): the global layers need the rest",
                self.kv_window_cache_bytes, self.kv_cache_bytes
            ));
        }
        Ok(())
    }
}

/// The prefix cache's changes in one engine step, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventBatch {
    /// Counts the batches from 0, those dropped for a slow reader included: a gap tells a
    /// subscriber it missed changes.
    pub seq: u64,
    /// Unix time (seconds) at the end of the step.
    pub timestamp: f64,
    pub events: Vec<rill_model::KvEvent>,
}

/// Most event batches kept for a reader that falls behind; past it, batches are dropped (and
/// counted in `rill_kv_events_dropped_total`): the engine never waits for a subscriber.
pub const KV_EVENT_BACKLOG: usize = 10_000;

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            kv_cache_bytes: 512 << 20,
            kv_window_cache_bytes: 0,
            max_batch_tokens: 512,
            max_prefill_rows_while_decoding: 32,
            max_running: 64,
            max_queue: 256,
            context: 0,
            prefix_caching: true,
            prompt_lookup_tokens: 5,
            prompt_lookup_measured: true,
            model_name: String::new(),
            kv_events: false,
        }
    }
}

/// What is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub name: String,
    /// The effective per-sequence context: prompt plus `max_tokens` must fit in it.
    pub context: usize,
    pub vocab_size: usize,
}

/// The KV cache's blocks, as of the end of the loop's last step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvStats {
    pub blocks_total: usize,
    /// Blocks referenced by sequences.
    pub blocks_used: usize,
    /// Blocks kept only for the prefix cache (free: taken, and evicted, when room is needed).
    pub blocks_cached_free: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Blocks of the sliding-window layers' arena (0 without a window).
    pub window_blocks_total: usize,
    /// Window blocks referenced by sequences (the rest are free, or kept for the prefix cache
    /// and reclaimable).
    pub window_blocks_used: usize,
    /// Loop iterations completed when these were published (an iteration takes in what was
    /// sent before it began, reaps dropped streams and runs at most one step).
    pub step: u64,
}

/// A request: a tokenized prompt, how to generate, and how many choices.
#[derive(Debug, Clone)]
pub struct ServeRequest {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// Choices to generate from the prompt, `1..=`[`MAX_CHOICES`]. Choice `c` samples with seed
    /// `params.sampling.seed + c`.
    pub n: usize,
    /// What to report with every token beyond its text (the glass box).
    pub trace: Trace,
}

/// What a request's token events carry beyond their text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trace {
    /// A [`TokenDetail`] with every token: how it was picked, the step that computed it, the KV
    /// memory its sequence holds and what it cost.
    pub explain: bool,
    /// The full raw logits each token was drawn from, in [`TokenDetail::logits`] (implies
    /// `explain`). Meant for one-token requests: a vocabulary of f32 per token.
    pub full_logits: bool,
}

/// How a token was picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PickRule {
    /// Temperature 0: the most likely token of the processed distribution.
    Greedy,
    /// Drawn at random from the processed distribution.
    Sampled,
}

impl PickRule {
    pub fn as_str(self) -> &'static str {
        match self {
            PickRule::Greedy => "greedy",
            PickRule::Sampled => "sampled",
        }
    }
}

/// The engine step (one forward pass) that computed a token's logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepInfo {
    /// The step's number (engine loop iterations since start).
    pub id: u64,
    /// Seconds its forward pass took.
    pub seconds: f64,
    /// Rows in its batch, over all sequences.
    pub rows: usize,
    /// Sequences with rows in the batch.
    pub sequences: usize,
    /// Distinct requests with rows in the batch.
    pub requests: usize,
    /// Rows of prompts being computed (chunked prefill) and of sequences decoding.
    pub prefill_rows: usize,
    pub decode_rows: usize,
}

/// How a choice's prompt was taken in, reported with its first token.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptInfo {
    /// The prompt's token ids.
    pub tokens: Vec<u32>,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub cached_tokens: usize,
    /// Prompt tokens computed.
    pub computed_tokens: usize,
    /// Seconds of the forward passes that computed them (shared with whatever else was in those
    /// steps), and how many steps that was.
    pub prefill_seconds: f64,
    pub prefill_steps: usize,
    /// Seconds from arrival to the first step that scheduled the request.
    pub queue_seconds: f64,
}

/// The arithmetic and memory traffic of computing one token's row, from the model's shapes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenCost {
    /// Weight matrices (2 per multiply-add, the output head included) plus attention over the
    /// positions each layer attends to.
    pub flops: u64,
    /// Every weight byte read once, as a decode step does.
    pub weight_bytes: u64,
    /// Keys and values read by attention.
    pub kv_bytes: u64,
}

/// Everything known about how one token came to be (see [`Trace::explain`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenDetail {
    pub rule: PickRule,
    /// Its probability in the processed distribution it was drawn from.
    pub probability: f32,
    /// Index among the choice's generated tokens.
    pub index: usize,
    /// Position in the sequence (the prompt's tokens come first).
    pub position: usize,
    /// Seconds from the request's arrival to this token's sampling.
    pub elapsed_s: f64,
    pub step: StepInfo,
    /// KV blocks (and their bytes, over all layers) the sequence holds with this token's
    /// keys and values stored; shared prefix blocks included. With a sliding window, its
    /// window layers hold only the blocks of their window.
    pub kv_blocks: usize,
    pub kv_bytes: usize,
    /// What those positions would take if every layer kept every one of them (as `kv_bytes`
    /// without a window).
    pub kv_bytes_without_window: usize,
    pub cost: TokenCost,
    /// The request's structured-output constraint at this step (none without one, or while a
    /// lazy one waits for its trigger), with its mask.
    pub constraint: Option<crate::ConstraintStep>,
    /// A sampled token's draw: the uniform the sequence's generator gave and the interval of
    /// the cumulative distribution the token covers (None when greedy).
    pub draw: Option<crate::Draw>,
    /// With the first token of a choice.
    pub prompt: Option<PromptInfo>,
    /// The raw logits, with [`Trace::full_logits`].
    pub logits: Option<Vec<f32>>,
}

impl ServeRequest {
    /// One choice.
    pub fn new(prompt: Vec<u32>, params: GenerateParams) -> ServeRequest {
        ServeRequest {
            prompt,
            params,
            n: 1,
            trace: Trace::default(),
        }
    }
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(
        "the server is at capacity (the request queue is full); retry after {retry_after_s} s"
    )]
    QueueFull { retry_after_s: u64 },
    #[error("invalid parameter {param}: {message}")]
    Invalid { param: String, message: String },
    #[error(
        "the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is more than the context of {context} tokens"
    )]
    PromptTooLong {
        prompt_tokens: usize,
        max_tokens: usize,
        context: usize,
    },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error(
        "this model ({architecture}) is an encoder without an output head: it embeds text \
         (/v1/embeddings, /api/embed) but cannot generate"
    )]
    NotGenerative { architecture: String },
}

/// One event of a request's stream. For every choice: its `Token`s, then one `Done`; after every
/// choice is done, one `Usage`, and the stream ends. An `Error` ends the stream instead.
#[derive(Debug, Clone, PartialEq)]
pub enum ServeEvent {
    /// A generated token, the one that ended the choice included (an end-of-generation or stop
    /// token comes with empty text). `text` is what this token releases: complete UTF-8, never
    /// any part of a stop string (possibly empty; all of a choice's texts add up to its text).
    Token {
        choice: usize,
        token: u32,
        text: String,
        /// When [`GenerateParams::top_logprobs`] asked for them.
        logprobs: Option<TokenLogprobs>,
        /// When [`ServeRequest::trace`] asked for it.
        detail: Option<Box<TokenDetail>>,
    },
    Done {
        choice: usize,
        finish_reason: FinishReason,
        cause: FinishCause,
    },
    Usage {
        prompt_tokens: usize,
        /// Tokens generated over all choices.
        completion_tokens: usize,
        /// Prompt tokens whose KV came from the prefix cache.
        cached_prompt_tokens: usize,
    },
    Error {
        message: String,
    },
}

/// The events of one request. Dropping it cancels the request (its blocks are freed within one
/// engine step).
pub struct ResponseStream {
    pub(super) rx: UnboundedReceiver<ServeEvent>,
    pub(super) id: u64,
    pub(super) ended: bool,
}

impl std::fmt::Debug for ResponseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStream")
            .field("id", &self.id)
            .field("ended", &self.ended)
            .finish()
    }
}

impl ResponseStream {
    /// The request's id (unique in this engine, in submission order).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event; `None` once the stream has ended (after `Usage` or `Error`).
    pub async fn recv(&mut self) -> Option<ServeEvent> {
        let event = self.rx.recv().await;
        self.track(event)
    }

    /// [`ResponseStream::recv`] for synchronous code (not from inside an async runtime).
    pub fn blocking_recv(&mut self) -> Option<ServeEvent> {
        let event = self.rx.blocking_recv();
        self.track(event)
    }

    /// The next event if one is ready.
    pub fn try_recv(&mut self) -> Option<ServeEvent> {
        match self.rx.try_recv() {
            Ok(e) => self.track(Some(e)),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => None,
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => self.track(None),
        }
    }

    /// An engine loop that went away before the request ended (it cannot, short of a bug) is
    /// reported as an error, so a stream always ends with `Usage` or `Error`.
    fn track(&mut self, event: Option<ServeEvent>) -> Option<ServeEvent> {
        match event {
            Some(e) => {
                if matches!(e, ServeEvent::Usage { .. } | ServeEvent::Error { .. }) {
                    self.ended = true;
                }
                Some(e)
            }
            None if !self.ended => {
                self.ended = true;
                Some(ServeEvent::Error {
                    message: "the engine loop stopped before the request finished".into(),
                })
            }
            None => None,
        }
    }
}
