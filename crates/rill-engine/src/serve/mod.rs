//! Serving many requests at once: one engine loop on a dedicated OS thread owns the model and
//! one paged KV cache, and runs iteration-level continuous batching over every request in
//! flight; requests come in through [`ServeHandle::submit`] and their tokens stream out through
//! a [`ResponseStream`] each.
//!
//! **Scheduling.** Every step builds one batch: first one decode row for every running sequence
//! that has a next token to compute, then the next chunk of every sequence still in prefill (in
//! admission order), then new sequences from the front of the waiting queue, as long as the
//! step's token budget ([`ServeConfig::max_batch_tokens`]), [`ServeConfig::max_running`] and the
//! KV cache allow. A long prompt is so split over several steps (chunked prefill) and never
//! stalls the others' decoding. A sequence is admitted only when blocks for its whole prompt can
//! be reserved with a block to spare for each running sequence (blocks kept only for the prefix
//! cache count as free); decoding grows sequences block by block, and when no block is left the
//! most recently admitted running sequence is preempted: its blocks are freed, it goes back to
//! the front of the queue and is recomputed later (mostly from the prefix cache), with its
//! generated tokens and its sampler state (so its output does not change). Each sequence samples with its own seeded
//! [`crate::SamplerChain`]; the kernels are batch invariant, so a request gives the same tokens
//! alone or batched with others, however its prompt is chunked and whatever was preempted.
//!
//! **Prefix caching.** Full KV blocks are published under a hash of their tokens chained with
//! their prefix's hash ([`rill_model::KvCache::publish_prefix`]); a new sequence starts with the
//! longest run of cached full blocks of its prompt and computes only the rest. Cached blocks no
//! sequence uses stay until their room is needed (least recently used first) and count as free.
//! `n > 1` choices prefill the prompt once and fork it (copy on write).
//!
//! **Cancellation** is dropping the [`ResponseStream`]: the loop notices within one step and
//! frees the request's blocks. **Backpressure**: at most [`ServeConfig::max_queue`] requests
//! wait; `submit` refuses more at once with [`SubmitError::QueueFull`].

mod metrics;
mod scheduler;
pub mod timeline;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rill_model::{KvCache, KvTypes};
use rill_tokenizer::Tokenizer;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use crate::{
    CacheLease, Engine, EngineError, FinishCause, FinishReason, GenerateParams, TokenLogprobs,
};
use metrics::{Metrics, Rejection};

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
    /// Record the prefix cache's changes ([`KvEventBatch`], one per step that changed it) for
    /// [`ServeHandle::take_kv_events`]: what prefix-aware routers subscribe to.
    pub kv_events: bool,
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
    rx: UnboundedReceiver<ServeEvent>,
    id: u64,
    ended: bool,
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

/// A speculative generation for the loop to step ([`ServeHandle::speculative`]).
pub(crate) struct SpeculativeRequest {
    pub(crate) id: u64,
    pub(crate) prompt: Vec<u32>,
    pub(crate) source: crate::DraftSource,
    pub(crate) speculative: crate::SpeculativeParams,
    pub(crate) params: GenerateParams,
    /// Positions of its session's cache.
    pub(crate) context: usize,
    pub(crate) cancelled: Arc<AtomicBool>,
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<crate::Generation, crate::EngineError>>,
}

/// A request on its way to the loop.
pub(crate) struct Incoming {
    pub(crate) id: u64,
    pub(crate) request: ServeRequest,
    pub(crate) tx: UnboundedSender<ServeEvent>,
    pub(crate) arrived: Instant,
}

/// Work that needs the whole engine (a logit lens, a counterfactual): it runs on the loop's
/// thread between two steps, every other request paused meanwhile. It returns what
/// delivers its result, which the loop calls once the job is counted in the metrics (so a caller
/// holding the result sees it counted).
/// It is lent the loop's KV arena with a sequence id of its own ([`ServeHandle::run_cache_job`]).
pub type Job = Box<dyn FnOnce(&mut Engine, CacheLease<'_>) -> Box<dyn FnOnce() + Send> + Send>;

/// A beam search for the loop to run in its arena ([`ServeHandle::beam_search`]).
pub(crate) struct BeamRequest {
    pub(crate) id: u64,
    pub(crate) prompt: Vec<u32>,
    pub(crate) params: crate::BeamParams,
    pub(crate) cancelled: Arc<AtomicBool>,
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<crate::BeamOutput, crate::BeamError>>,
}

pub(crate) enum Command {
    Submit(Box<Incoming>),
    Job(Job),
    Beam(Box<BeamRequest>),
    Speculative(Box<SpeculativeRequest>),
    /// Stop (true) or resume (false) stepping; see [`ServeHandle::pause`].
    Pause(bool),
    /// Answered with the KV statistics at the end of the loop iteration that takes it in (paused:
    /// the iteration it lets run); see [`ServeHandle::next_step`].
    Checkpoint(tokio::sync::oneshot::Sender<KvStats>),
    /// Answered at once (between steps, paused or not) with the whole server's state and its
    /// newest steps (at most this many).
    View(usize, tokio::sync::oneshot::Sender<timeline::ServerView>),
    Shutdown,
}

/// What the loop and the handles share.
pub(crate) struct Shared {
    pub(crate) metrics: Metrics,
    /// Requests submitted and not yet scheduled (the bounded queue).
    pub(crate) queued: AtomicUsize,
    pub(crate) closed: AtomicBool,
    /// Draining: `submit` refuses new requests while the ones in flight run to their end.
    pub(crate) draining: AtomicBool,
    /// Requests submitted and not yet ended (queued, waiting or running).
    pub(crate) in_flight: AtomicUsize,
    pub(crate) kv_total: AtomicUsize,
    pub(crate) kv_used: AtomicUsize,
    pub(crate) kv_cached_free: AtomicUsize,
    pub(crate) kv_window_total: usize,
    pub(crate) kv_window_used: AtomicUsize,
    pub(crate) block_size: usize,
    pub(crate) iterations: AtomicU64,
}

impl Shared {
    pub(crate) fn kv_stats(&self) -> KvStats {
        // Read first: what follows was published at this step or later.
        let step = self.iterations.load(Ordering::Acquire);
        KvStats {
            step,
            blocks_total: self.kv_total.load(Ordering::Relaxed),
            blocks_used: self.kv_used.load(Ordering::Relaxed),
            blocks_cached_free: self.kv_cached_free.load(Ordering::Relaxed),
            block_size: self.block_size,
            window_blocks_total: self.kv_window_total,
            window_blocks_used: self.kv_window_used.load(Ordering::Relaxed),
        }
    }
}

struct Handle {
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    tokenizer: Arc<Tokenizer>,
    info: ModelInfo,
    summary: ModelSummary,
    config: ServeConfig,
    next_id: AtomicU64,
    kv_events: Mutex<Option<tokio::sync::mpsc::Receiver<KvEventBatch>>>,
}

/// The served model's shapes and costs, and how the loop runs it.
#[derive(Debug, Clone)]
pub struct ModelSummary {
    pub config: rill_model::ModelConfig,
    pub cost: rill_model::ModelCost,
    pub precision: rill_model::Precision,
    pub threads: usize,
    pub kv_types: KvTypes,
    pub kv_block_size: usize,
    pub kv_blocks_total: usize,
    /// KV bytes one position takes (all layers, keys and values).
    pub kv_bytes_per_token: usize,
    /// KV bytes one position takes once it has left the sliding window (the layers without
    /// one): what each position of a long context costs. Equal to `kv_bytes_per_token`
    /// without a window.
    pub kv_context_bytes_per_token: usize,
    /// Blocks of the sliding-window layers' arena (0 without a window).
    pub kv_window_blocks_total: usize,
}

/// The way into a running engine loop. Cheap to clone; every clone drives the same loop. When
/// every handle is gone, the loop finishes the requests in flight and exits.
#[derive(Clone)]
pub struct ServeHandle {
    inner: Arc<Handle>,
}

impl std::fmt::Debug for ServeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeHandle")
            .field("model", &self.inner.info)
            .finish()
    }
}

fn invalid(param: &str, message: impl Into<String>) -> SubmitError {
    SubmitError::Invalid {
        param: param.into(),
        message: message.into(),
    }
}

/// The parameter an engine error is about, as a request field name.
fn param_of(error: &EngineError) -> &'static str {
    match error {
        EngineError::TokenOutOfVocab { what, .. } => what,
        EngineError::BadParameter(m) => {
            const NAMES: [(&str, &str); 14] = [
                ("temperature", "temperature"),
                ("top_p", "top_p"),
                ("min_p", "min_p"),
                ("typical_p", "typical_p"),
                ("top_k", "top_k"),
                ("repeat_penalty", "repeat_penalty"),
                ("presence_penalty", "presence_penalty"),
                ("frequency_penalty", "frequency_penalty"),
                ("a penalty", "repeat_penalty"),
                ("logit bias", "logit_bias"),
                ("top_logprobs", "top_logprobs"),
                ("stop string", "stop"),
                ("sampler stage", "sampler_order"),
                ("sampler order", "sampler_order"),
            ];
            NAMES
                .iter()
                .find(|(key, _)| m.contains(key))
                .map_or("sampling", |&(_, name)| name)
        }
        _ => "params",
    }
}

/// How `kv_cache_bytes` is shared between the global layers' blocks and the sliding-window
/// layers' (0 without a window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSplit {
    pub blocks: usize,
    pub window_blocks: usize,
}

/// Conversation length the automatic split of the KV budget is made for (or the served
/// context, when shorter).
pub const KV_SPLIT_CONVERSATION_TOKENS: usize = 4096;

/// Shares the KV budget out between the global layers and the sliding-window layers.
///
/// `kv_window_cache_bytes`, when set, is the window layers' share. Otherwise the budget is
/// split so that both arenas fill together with conversations of
/// [`KV_SPLIT_CONVERSATION_TOKENS`] (a window and two blocks each in the window arena), for at
/// most twice `max_running` of them (the second half keeps finished conversations' last
/// windows for their next turns), plus one step's prompt rows. Longer conversations then fit
/// fewer at once, shorter ones as many as `max_running` allows.
pub fn split_kv_budget(
    mc: &rill_model::ModelConfig,
    kv_types: KvTypes,
    config: &ServeConfig,
) -> KvSplit {
    let block = KvCache::DEFAULT_BLOCK_SIZE;
    let kv_dim = mc.n_kv_heads * mc.head_dim;
    let all = kv_types.bytes_per_token(mc.n_layers, kv_dim) * block;
    let budget = config.kv_cache_bytes;
    let Some(window) = rill_model::SlidingWindow::of(mc) else {
        return KvSplit {
            blocks: budget / all.max(1),
            window_blocks: 0,
        };
    };
    let windowed = kv_types.bytes_per_token(window.n_window_layers(), kv_dim) * block;
    let global = (all - windowed).max(1);
    let per_sequence = window.size.div_ceil(block) + 2;
    let one_step = config.max_batch_tokens.div_ceil(block);
    let window_blocks = match config.kv_window_cache_bytes {
        0 => {
            let context = match config.context {
                0 => mc.context_length,
                c => c.min(mc.context_length),
            };
            let conversation = context
                .clamp(1, KV_SPLIT_CONVERSATION_TOKENS)
                .div_ceil(block);
            let per_conversation =
                conversation * global + per_sequence.min(conversation) * windowed;
            let fit = budget.saturating_sub(one_step * windowed) / per_conversation;
            fit.clamp(1, 2 * config.max_running) * per_sequence.min(conversation) + one_step
        }
        bytes => bytes / windowed.max(1),
    };
    let blocks = budget.saturating_sub(window_blocks.saturating_mul(windowed)) / global;
    if blocks >= window_blocks || config.kv_window_cache_bytes > 0 {
        return KvSplit {
            blocks,
            window_blocks,
        };
    }
    // Too small a budget to split: every layer gets the same blocks.
    let both = budget / all.max(1);
    KvSplit {
        blocks: both,
        window_blocks: both,
    }
}

/// What a KV budget holds, split as [`split_kv_budget`] splits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCapacity {
    pub split: KvSplit,
    /// Positions of context the global layers hold (one long conversation).
    pub positions: usize,
    /// Conversations of [`KV_SPLIT_CONVERSATION_TOKENS`] held at once.
    pub conversations: usize,
}

/// What `config.kv_cache_bytes` holds for a model.
pub fn kv_capacity(
    mc: &rill_model::ModelConfig,
    kv_types: KvTypes,
    config: &ServeConfig,
) -> KvCapacity {
    let block = KvCache::DEFAULT_BLOCK_SIZE;
    let split = split_kv_budget(mc, kv_types, config);
    let conversation = KV_SPLIT_CONVERSATION_TOKENS.div_ceil(block);
    let mut conversations = split.blocks / conversation;
    if let Some(window) = rill_model::SlidingWindow::of(mc) {
        let per_sequence = (window.size.div_ceil(block) + 2).min(conversation);
        let room = split
            .window_blocks
            .saturating_sub(config.max_batch_tokens.div_ceil(block));
        conversations = conversations.min(room / per_sequence);
    }
    KvCapacity {
        split,
        positions: split.blocks * block,
        conversations,
    }
}

/// Starts the engine loop on a thread of its own, with a KV cache of
/// [`ServeConfig::kv_cache_bytes`] allocated now.
pub fn spawn(engine: Engine, config: ServeConfig) -> Result<ServeHandle, EngineError> {
    let bad = |m: String| Err(EngineError::BadParameter(m));
    if config.max_running == 0 {
        return bad("max_running must be at least 1".into());
    }
    if config.max_batch_tokens < config.max_running {
        return bad(format!(
            "max_batch_tokens ({}) must be at least max_running ({}): every running sequence needs a row each step",
            config.max_batch_tokens, config.max_running
        ));
    }
    if config.max_queue == 0 {
        return bad("max_queue must be at least 1".into());
    }
    if config.kv_window_cache_bytes >= config.kv_cache_bytes && config.kv_window_cache_bytes > 0 {
        return bad(format!(
            "kv_window_cache_bytes ({}) must be less than kv_cache_bytes ({}): the global layers need the rest",
            config.kv_window_cache_bytes, config.kv_cache_bytes
        ));
    }
    let precision = engine.precision;
    let model = &engine.model;
    let mc = model.config();
    let kv_types = model.kv_types(precision);
    let block = KvCache::DEFAULT_BLOCK_SIZE;
    let split = split_kv_budget(mc, kv_types, &config);
    if split.blocks == 0 {
        return bad(format!(
            "kv_cache_bytes ({}) holds no KV block: one block of {block} positions takes {} bytes",
            config.kv_cache_bytes,
            kv_types.bytes_per_token(mc.n_layers, mc.n_kv_heads * mc.head_dim) * block
        ));
    }
    let mut kv = match rill_model::SlidingWindow::of(mc) {
        Some(window) => KvCache::with_window(
            (mc.n_layers, mc.n_kv_heads, mc.head_dim),
            split.blocks * block,
            block,
            kv_types,
            window,
            split.window_blocks * block,
        )?,
        None => KvCache::new(
            mc.n_layers,
            mc.n_kv_heads,
            mc.head_dim,
            split.blocks * block,
            block,
            kv_types,
        )?,
    };
    // Sequences in the loop never roll back: their window layers keep only their window.
    kv.set_rollback_slack(0);
    let (event_tx, event_rx) = if config.kv_events {
        kv.record_events(true);
        let (tx, rx) = tokio::sync::mpsc::channel(KV_EVENT_BACKLOG);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let trained = mc.context_length.max(1);
    let context = match config.context {
        0 => trained,
        c => c.min(trained),
    }
    .min(kv.capacity_tokens());
    let name = if config.model_name.is_empty() {
        model
            .file()
            .metadata()
            .get("general.name")
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or("model")
            .to_string()
    } else {
        config.model_name.clone()
    };
    let info = ModelInfo {
        name,
        context,
        vocab_size: mc.vocab_size,
    };
    let summary = ModelSummary {
        config: mc.clone(),
        cost: model.cost(),
        precision,
        threads: model.threads(),
        kv_types,
        kv_block_size: kv.block_size(),
        kv_blocks_total: kv.total_blocks(),
        kv_bytes_per_token: kv.bytes_per_token(),
        kv_context_bytes_per_token: kv.global_bytes_per_token(),
        kv_window_blocks_total: kv.total_window_blocks(),
    };
    let shared = Arc::new(Shared {
        metrics: Metrics::new(),
        queued: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        kv_total: AtomicUsize::new(kv.total_blocks()),
        kv_used: AtomicUsize::new(0),
        kv_cached_free: AtomicUsize::new(0),
        kv_window_total: kv.total_window_blocks(),
        kv_window_used: AtomicUsize::new(0),
        block_size: kv.block_size(),
        iterations: AtomicU64::new(0),
    });
    Metrics::set(&shared.metrics.kv_blocks_total, kv.total_blocks() as u64);
    Metrics::set(
        &shared.metrics.kv_window_blocks_total,
        kv.total_window_blocks() as u64,
    );
    let tokenizer = engine.tokenizer.clone();
    let (tx, rx) = mpsc::channel();
    let parts = scheduler::Parts {
        engine,
        kv,
        config: config.clone(),
        context,
        shared: shared.clone(),
        commands: rx,
        kv_events: event_tx,
    };
    let thread = std::thread::Builder::new()
        .name("rill-engine-loop".into())
        .spawn(move || scheduler::run(parts))
        .map_err(|e| EngineError::BadParameter(format!("cannot start the engine thread: {e}")))?;
    Ok(ServeHandle {
        inner: Arc::new(Handle {
            shared,
            commands: tx,
            thread: Mutex::new(Some(thread)),
            tokenizer,
            info,
            summary,
            config,
            next_id: AtomicU64::new(0),
            kv_events: Mutex::new(event_rx),
        }),
    })
}

impl ServeHandle {
    /// Checks a request and queues it; its events come through the returned stream. Never
    /// blocks: a full queue is [`SubmitError::QueueFull`] at once.
    pub fn submit(&self, request: ServeRequest) -> Result<ResponseStream, SubmitError> {
        let h = &*self.inner;
        let metrics = &h.shared.metrics;
        let reject = |why: Rejection, e: SubmitError| {
            metrics.reject(why);
            Err(e)
        };
        if h.shared.closed.load(Ordering::Acquire) || h.shared.draining.load(Ordering::Acquire) {
            return reject(Rejection::ShuttingDown, SubmitError::ShuttingDown);
        }
        if let Err(e) = self.validate(&request) {
            let why = match e {
                SubmitError::PromptTooLong { .. } => Rejection::PromptTooLong,
                _ => Rejection::Invalid,
            };
            return reject(why, e);
        }
        let max_queue = h.config.max_queue;
        if h.shared
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < max_queue).then_some(q + 1)
            })
            .is_err()
        {
            let retry_after_s = metrics.retry_after_s();
            return reject(
                Rejection::QueueFull,
                SubmitError::QueueFull { retry_after_s },
            );
        }
        let id = h.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // Counted before the loop can see it; the loop uncounts it when the request ends.
        h.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        let incoming = Box::new(Incoming {
            id,
            request,
            tx,
            arrived: Instant::now(),
        });
        if h.commands.send(Command::Submit(incoming)).is_err() {
            h.shared.queued.fetch_sub(1, Ordering::AcqRel);
            h.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            return reject(Rejection::ShuttingDown, SubmitError::ShuttingDown);
        }
        Metrics::add(&metrics.requests_submitted, 1);
        Ok(ResponseStream {
            rx,
            id,
            ended: false,
        })
    }

    fn validate(&self, request: &ServeRequest) -> Result<(), SubmitError> {
        let info = &self.inner.info;
        let vocab = info.vocab_size;
        let prompt = &request.prompt;
        if prompt.is_empty() {
            return Err(invalid(
                "prompt",
                "the prompt is empty: a model needs at least one token to predict from",
            ));
        }
        if let Some(&t) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(invalid(
                "prompt",
                format!("token id {t} is outside the vocabulary ({vocab} tokens)"),
            ));
        }
        let max_n = MAX_CHOICES.min(self.inner.config.max_running);
        if request.n == 0 || request.n > max_n {
            return Err(invalid(
                "n",
                format!("n must be in 1..={max_n}, got {}", request.n),
            ));
        }
        let params = &request.params;
        if params.max_tokens == 0 {
            return Err(invalid("max_tokens", "max_tokens must be at least 1"));
        }
        if params.prompt_logprobs {
            return Err(invalid(
                "prompt_logprobs",
                "prompt log-probabilities are not available from the serving loop",
            ));
        }
        if let Err(e) = params.validate(vocab) {
            return Err(invalid(param_of(&e), e.to_string()));
        }
        if prompt.len().saturating_add(params.max_tokens) > info.context {
            return Err(SubmitError::PromptTooLong {
                prompt_tokens: prompt.len(),
                max_tokens: params.max_tokens,
                context: info.context,
            });
        }
        Ok(())
    }

    /// Every metric in Prometheus' text format, names prefixed `rill_`.
    pub fn render_prometheus(&self) -> String {
        self.inner.shared.metrics.render(&self.cache_info())
    }

    /// The prefix cache's changes, a batch per engine step that changed it, when
    /// [`ServeConfig::kv_events`] is set: the receiver, once (then `None`). Batches a reader
    /// leaves unread past [`KV_EVENT_BACKLOG`] are dropped, never waited for.
    pub fn take_kv_events(&self) -> Option<tokio::sync::mpsc::Receiver<KvEventBatch>> {
        self.inner
            .kv_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The metrics under vLLM's names (`vllm:*`), for routers and dashboards that read those.
    pub fn render_prometheus_vllm(&self) -> String {
        self.inner.shared.metrics.render_vllm(&self.cache_info())
    }

    fn cache_info(&self) -> metrics::CacheInfo<'_> {
        let h = &*self.inner;
        metrics::CacheInfo {
            block_size: h.shared.block_size,
            blocks_total: h.shared.kv_total.load(Ordering::Relaxed),
            dtype: h.summary.kv_types.name(),
            prefix_caching: h.config.prefix_caching,
            model_name: &h.info.name,
        }
    }

    pub fn model_info(&self) -> ModelInfo {
        self.inner.info.clone()
    }

    /// The model's shapes and costs.
    pub fn model_summary(&self) -> &ModelSummary {
        &self.inner.summary
    }

    /// Runs `job` on the engine loop's thread with the whole engine, between two steps (every
    /// request in flight pauses while it runs); its result comes through the receiver, which
    /// errs if the loop shut down before running it. Jobs do not count against the queue.
    pub fn run_job<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Engine) -> R + Send + 'static,
    ) -> Result<tokio::sync::oneshot::Receiver<R>, SubmitError> {
        self.run_cache_job(move |engine, _| job(engine))
    }

    /// A beam search in the loop's KV arena: one forward pass of its beams per loop iteration,
    /// between the steps of the other requests (which it never holds for longer than a step),
    /// with the blocks it may grow into set aside when it starts; its beams show in
    /// [`ServeHandle::server_view`] under the id returned. The prompt should be in the prefix
    /// cache already (the search computes what is not, at once). Setting `cancelled` (or
    /// dropping the receiver) ends it after the current step, sending nothing. The receiver
    /// errs if the loop shut down before the search ended.
    #[allow(clippy::type_complexity)]
    pub fn beam_search(
        &self,
        prompt: Vec<u32>,
        params: crate::BeamParams,
        cancelled: Arc<AtomicBool>,
    ) -> Result<
        (
            u64,
            tokio::sync::oneshot::Receiver<Result<crate::BeamOutput, crate::BeamError>>,
        ),
        SubmitError,
    > {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(Command::Beam(Box::new(BeamRequest {
            id,
            prompt,
            params,
            cancelled,
            reply,
        })))?;
        Ok((id, rx))
    }

    /// A speculative generation of `prompt` with a draft from `source`, on a session of its own
    /// with `context` positions (outside the loop's KV arena), stepped once per loop iteration
    /// between the steps of the other requests (a pass of the prompt, a pass of the draft taking
    /// it in, or one round of drafting and verifying), so it never holds them for longer than
    /// a step; it shows in [`ServeHandle::server_view`] under the id returned. At most two run
    /// at once (each holds a cache of its own); later ones wait, in order, for room. Setting
    /// `cancelled` (or dropping the receiver) ends it after the current step, sending nothing.
    /// The receiver errs if the loop shut down before the generation ended.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    pub fn speculative(
        &self,
        prompt: Vec<u32>,
        source: crate::DraftSource,
        speculative: crate::SpeculativeParams,
        params: GenerateParams,
        context: usize,
        cancelled: Arc<AtomicBool>,
    ) -> Result<
        (
            u64,
            tokio::sync::oneshot::Receiver<Result<crate::Generation, crate::EngineError>>,
        ),
        SubmitError,
    > {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.send(Command::Speculative(Box::new(SpeculativeRequest {
            id,
            prompt,
            source,
            speculative,
            params,
            context,
            cancelled,
            reply,
        })))?;
        Ok((id, rx))
    }

    /// [`ServeHandle::run_job`], lent the loop's KV arena too: the job may start a sequence of
    /// its own (the id given) from the prefix cache, compute, publish what it computed, and
    /// must remove the sequence before it returns (so no request ever sees it).
    pub fn run_cache_job<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Engine, CacheLease<'_>) -> R + Send + 'static,
    ) -> Result<tokio::sync::oneshot::Receiver<R>, SubmitError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |engine: &mut Engine, lease: CacheLease<'_>| {
            let result = job(engine, lease);
            Box::new(move || {
                let _ = tx.send(result);
            })
        });
        self.send(Command::Job(job))?;
        Ok(rx)
    }

    /// Stops the loop from stepping after the step in progress: requests are still taken in
    /// and dropped streams still reaped, but no token is computed until [`ServeHandle::resume`],
    /// except one step per [`ServeHandle::next_step`]. Commands are taken in the order they are
    /// sent, so a request submitted after `pause` gets no step before the next `next_step`.
    /// For stepping through the engine by hand (and for tests that must not race the loop).
    pub fn pause(&self) -> Result<(), SubmitError> {
        self.send(Command::Pause(true))
    }

    /// Lets a paused loop step freely again.
    pub fn resume(&self) -> Result<(), SubmitError> {
        self.send(Command::Pause(false))
    }

    /// Answers with the KV statistics at the end of the next loop iteration, one that begins
    /// after this call: every request submitted and every stream dropped before it has been
    /// taken in or reaped, and at most one step has run. On a paused loop it lets exactly one
    /// iteration (one step, if there is work) run. The receiver errs if the loop shuts down
    /// first.
    pub fn next_step(&self) -> Result<tokio::sync::oneshot::Receiver<KvStats>, SubmitError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Command::Checkpoint(tx))?;
        Ok(rx)
    }

    /// The whole server between two steps: every KV block with its references, every sequence,
    /// and the newest `steps` steps of the loop with what happened to requests meanwhile (the
    /// glass box's notepad and assembly line). Answered even while paused.
    pub fn server_view(
        &self,
        steps: usize,
    ) -> Result<tokio::sync::oneshot::Receiver<timeline::ServerView>, SubmitError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Command::View(steps, tx))?;
        Ok(rx)
    }

    fn send(&self, command: Command) -> Result<(), SubmitError> {
        let h = &*self.inner;
        if h.shared.closed.load(Ordering::Acquire) {
            return Err(SubmitError::ShuttingDown);
        }
        h.commands
            .send(command)
            .map_err(|_| SubmitError::ShuttingDown)
    }

    /// The model's tokenizer (to tokenize prompts and apply chat templates outside the loop).
    pub fn tokenizer(&self) -> Arc<Tokenizer> {
        self.inner.tokenizer.clone()
    }

    /// The configuration the loop runs with.
    pub fn config(&self) -> &ServeConfig {
        &self.inner.config
    }

    /// The statistics the loop last published (they may lag a step behind the streams: to read
    /// them after something happened, use [`ServeHandle::next_step`]).
    pub fn kv_stats(&self) -> KvStats {
        self.inner.shared.kv_stats()
    }

    /// Counts speculative tokens drafted and accepted outside the loop's own requests (the
    /// glass-box speculative generations), for the acceptance metrics.
    pub fn record_speculation(&self, drafted: usize, accepted: usize) {
        let m = &self.inner.shared.metrics;
        Metrics::add(&m.spec_draft_tokens, drafted as u64);
        Metrics::add(&m.spec_accepted_tokens, accepted as u64);
    }

    /// Requests submitted and not yet scheduled.
    pub fn queued(&self) -> usize {
        self.inner.shared.queued.load(Ordering::Relaxed)
    }

    /// Starts draining: `submit` refuses new requests ([`SubmitError::ShuttingDown`]) while
    /// those in flight run to their end as usual; [`ServeHandle::in_flight`] counts them down.
    /// Jobs and everything else still work; [`ServeHandle::shutdown`] ends what is left.
    pub fn drain(&self) {
        self.inner.shared.draining.store(true, Ordering::Release);
    }

    /// Whether [`ServeHandle::drain`] (or a shutdown) was called.
    pub fn is_draining(&self) -> bool {
        let s = &self.inner.shared;
        s.draining.load(Ordering::Acquire) || s.closed.load(Ordering::Acquire)
    }

    /// Requests submitted and not yet ended (queued, waiting for KV blocks or running): exact,
    /// not a step behind; a request counts until its stream's last event was sent.
    pub fn in_flight(&self) -> usize {
        self.inner.shared.in_flight.load(Ordering::Acquire)
    }

    /// Stops admitting requests (`submit` returns [`SubmitError::ShuttingDown`]), ends every
    /// request in flight with `Done` (finish reason `cancelled`, unless a choice finished on its
    /// own) and `Usage`, and waits for the loop's thread to exit (at most one engine step).
    /// Idempotent.
    pub fn shutdown(&self) {
        let h = &*self.inner;
        h.shared.closed.store(true, Ordering::Release);
        let _ = h.commands.send(Command::Shutdown);
        let thread = h.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// The handle is shared between threads (an HTTP server's tasks); a stream moves to the task
/// that reads it.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<ServeHandle>();
    send::<ResponseStream>();
    send_sync::<ServeEvent>();
};
