//! The way into a running engine loop: submitting requests (checked first, refused at once
//! when the queue is full), jobs, beam searches and speculative generations; pausing and
//! stepping the loop; reading its metrics, statistics and view.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rill_model::KvTypes;
use rill_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::{self, Metrics, Rejection};
use super::timeline;
use super::{
    KvEventBatch, KvStats, ModelInfo, ResponseStream, ServeConfig, ServeEvent, ServeRequest,
    SubmitError, MAX_CHOICES,
};
use crate::{CacheLease, Engine, EngineError, GenerateParams};

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

pub(super) struct Handle {
    pub(super) shared: Arc<Shared>,
    pub(super) commands: mpsc::Sender<Command>,
    pub(super) thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(super) tokenizer: Arc<Tokenizer>,
    pub(super) info: ModelInfo,
    pub(super) summary: ModelSummary,
    pub(super) config: ServeConfig,
    pub(super) next_id: AtomicU64,
    pub(super) kv_events: Mutex<Option<tokio::sync::mpsc::Receiver<KvEventBatch>>>,
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
    /// Recurrent state one sequence holds (its state and snapshot; 0 for a model without
    /// recurrent layers): fixed, whatever the length.
    pub state_bytes_per_sequence: usize,
    /// Sequences the recurrent-state arena holds at once (0 without recurrent layers).
    pub state_sequences: usize,
    /// Bytes of the recurrent-state arena (taken from the KV budget first).
    pub state_arena_bytes: usize,
}

/// The way into a running engine loop. Cheap to clone; every clone drives the same loop. When
/// every handle is gone, the loop finishes the requests in flight and exits.
#[derive(Clone)]
pub struct ServeHandle {
    pub(super) inner: Arc<Handle>,
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
        let config = &self.inner.summary.config;
        if !config.output_head {
            let architecture = config.architecture.name().to_string();
            return Err(SubmitError::NotGenerative { architecture });
        }
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
