//! The engine loop: it owns the model and the KV cache, takes commands from the handles, and
//! runs one forward pass per step over every sequence in flight (see the module docs of
//! [`crate::serve`] for the policy).

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use rill_model::{Batch, KvCache, KvError, ModelCost, SeqId};
use rill_tokenizer::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;
use super::timeline::{LoopEventKind, SeqState, SeqView, ServerView, StepPart, Timeline};
use super::{
    Command, Incoming, PickRule, PromptInfo, ServeConfig, ServeEvent, Shared, StepInfo, TokenCost,
    TokenDetail, Trace,
};
use crate::decoder::{Emitted, Forcing, SampledFrom, SeqDecoder};
use crate::{CacheLease, Engine, FinishCause, FinishReason, GenerateParams};

mod beams;
mod prompt_rows;
mod speculation;

use beams::BeamTask;
use prompt_rows::share_prompt_rows;
use speculation::SpeculationTask;

/// What the loop is started with.
pub(crate) struct Parts {
    pub(crate) engine: Engine,
    pub(crate) kv: KvCache,
    pub(crate) config: ServeConfig,
    pub(crate) context: usize,
    pub(crate) shared: Arc<Shared>,
    pub(crate) commands: mpsc::Receiver<Command>,
    pub(crate) kv_events: Option<tokio::sync::mpsc::Sender<super::KvEventBatch>>,
}

/// The loop thread's body. A panic (a bug) ends the loop without taking the process down:
/// streams then end with an error and `submit` answers `ShuttingDown`.
pub(crate) fn run(parts: Parts) {
    let tokenizer = parts.engine.tokenizer.clone();
    let shared = parts.shared.clone();
    let outcome = catch_unwind(AssertUnwindSafe(|| Loop::new(parts, &tokenizer).run()));
    shared.closed.store(true, Ordering::Release);
    if outcome.is_err() {
        Metrics::add(&shared.metrics.errors, 1);
    }
}

/// One choice of a request: a sequence of the KV cache.
struct Seq<'t> {
    id: SeqId,
    req: u64,
    choice: usize,
    /// Prompt and generated tokens; all but the last are (or, waiting, will be) in the cache.
    tokens: Vec<u32>,
    /// Tokens whose keys and values are in the cache (0 while waiting).
    computed: usize,
    /// Its sampler, its state in the request's constraint and its output so far.
    decoder: SeqDecoder<'t>,
    /// Choices still to fork from this sequence once its prompt is computed (`n - 1` for a
    /// request's first sequence, until then).
    fork: usize,
    last_token: Option<Instant>,
    finished: bool,
    /// Prompt tokens that came from the prefix cache, and the forward passes (seconds, steps)
    /// that computed the rest (for [`Trace::explain`]).
    cached_prompt: usize,
    prefill_seconds: f64,
    prefill_steps: usize,
}

/// Takes a sequence's blocks back, publishing its computed positions first (with prefix
/// caching), the partly filled last block included: a context that ended mid-block is shared
/// up to its last computed position by whatever continues it (a lens, the next turn).
fn retire(kv: &mut KvCache, s: &Seq<'_>, prefix_caching: bool) {
    if prefix_caching {
        let _ = kv.publish_tail(s.id, &s.tokens[..s.computed]);
    }
    let _ = kv.remove_sequence(s.id);
}

impl Seq<'_> {
    /// Positions still to compute before the next token can be sampled.
    fn left(&self) -> usize {
        self.tokens.len() - self.computed
    }
}

struct Request {
    n: usize,
    prompt_len: usize,
    params: GenerateParams,
    tx: UnboundedSender<ServeEvent>,
    arrived: Instant,
    /// Scheduled at least once (it left the bounded queue).
    scheduled: bool,
    done: Vec<bool>,
    completion_tokens: usize,
    cached_tokens: usize,
    first_token: bool,
    trace: Trace,
    /// The prompt, kept when explaining (the first token reports it).
    prompt: Vec<u32>,
    queue_seconds: f64,
}

/// How a request ends early.
enum End {
    Cancelled,
    Error(String),
}

/// One sequence's part of a step's batch.
#[derive(Clone, Copy)]
struct Planned {
    /// Index in `running`.
    idx: usize,
    rows: usize,
    /// Its row in the step's logits, when the batch computes its next token's logits.
    logits: Option<usize>,
    decode: bool,
}

struct Loop<'t> {
    engine: Engine,
    cost: ModelCost,
    kv: KvCache,
    tokenizer: &'t Tokenizer,
    config: ServeConfig,
    context: usize,
    vocab: usize,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
    requests: HashMap<u64, Request>,
    /// Front first; sequences here hold no KV blocks.
    waiting: VecDeque<Seq<'t>>,
    /// In admission order (preemption takes from the end).
    running: Vec<Seq<'t>>,
    next_seq: SeqId,
    batch: Batch,
    logits: Vec<f32>,
    plan: Vec<Planned>,
    /// This step's prefilling sequences (indices in `running`) and the rows each takes.
    prefilling: Vec<usize>,
    prompt_left: Vec<usize>,
    shares: Vec<(usize, usize)>,
    scratch: Vec<u64>,
    closing: bool,
    disconnected: bool,
    /// Stepping stopped by [`super::ServeHandle::pause`]: only checkpoints let a step run.
    paused: bool,
    /// [`Command::Checkpoint`]s to answer: all at the end of this iteration, or, paused, the
    /// first one (each lets one iteration run).
    checkpoints: VecDeque<tokio::sync::oneshot::Sender<super::KvStats>>,
    kv_events: Option<tokio::sync::mpsc::Sender<super::KvEventBatch>>,
    /// The next KV-event batch's sequence number.
    kv_event_seq: u64,
    /// The recent steps and request events, for [`Command::View`].
    timeline: Timeline,
    /// Beam searches in progress, each stepped once per iteration.
    beams: Vec<BeamTask>,
    /// Speculative generations in progress, each stepped once per iteration.
    speculations: Vec<SpeculationTask<'t>>,
    /// Speculative generations waiting for room ([`speculation::MAX_SPECULATIONS`]).
    speculation_queue: VecDeque<super::SpeculativeRequest>,
}

impl<'t> Loop<'t> {
    fn new(parts: Parts, tokenizer: &'t Tokenizer) -> Loop<'t> {
        let vocab = parts.engine.model.config().vocab_size;
        Loop {
            cost: parts.engine.model.cost(),
            engine: parts.engine,
            kv: parts.kv,
            tokenizer,
            config: parts.config,
            context: parts.context,
            vocab,
            shared: parts.shared,
            commands: parts.commands,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_seq: 0,
            batch: Batch::new(),
            logits: Vec::new(),
            plan: Vec::new(),
            prefilling: Vec::new(),
            prompt_left: Vec::new(),
            shares: Vec::new(),
            scratch: Vec::new(),
            closing: false,
            disconnected: false,
            paused: false,
            checkpoints: VecDeque::new(),
            kv_events: parts.kv_events,
            kv_event_seq: 0,
            timeline: Timeline::new(),
            beams: Vec::new(),
            speculations: Vec::new(),
            speculation_queue: VecDeque::new(),
        }
    }

    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    fn run(mut self) {
        loop {
            let idle = self.running.is_empty()
                && self.waiting.is_empty()
                && self.beams.is_empty()
                && self.speculations.is_empty()
                && self.speculation_queue.is_empty();
            if (idle && self.checkpoints.is_empty()) || (self.paused && self.checkpoints.is_empty())
            {
                self.publish_stats();
                if self.closing || self.disconnected {
                    break;
                }
                // Idle or paused: block until something comes.
                match self.commands.recv() {
                    Ok(c) => self.command(c),
                    Err(_) => self.disconnected = true,
                }
            }
            loop {
                match self.commands.try_recv() {
                    Ok(c) => self.command(c),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        self.disconnected = true;
                        break;
                    }
                }
            }
            if self.closing {
                break;
            }
            self.reap_cancelled();
            let may_step = !self.paused || !self.checkpoints.is_empty();
            if may_step && (!self.running.is_empty() || !self.waiting.is_empty()) {
                self.step();
            }
            if may_step && !self.beams.is_empty() {
                self.step_beams();
            }
            if may_step && !(self.speculations.is_empty() && self.speculation_queue.is_empty()) {
                self.step_speculations();
            }
            self.publish_stats();
            self.answer_checkpoints();
        }
        self.closing = true;
        self.shared.closed.store(true, Ordering::Release);
        for task in std::mem::take(&mut self.beams) {
            // Their callers hear that the search never completed.
            self.end_beam(task, None);
        }
        self.drop_speculations();
        let mut ids: Vec<u64> = self.requests.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.end_request(id, End::Cancelled);
        }
        // Requests that raced with the shutdown.
        while let Ok(c) = self.commands.try_recv() {
            if let Command::Submit(incoming) = c {
                self.command(Command::Submit(incoming));
                let ids: Vec<u64> = self.requests.keys().copied().collect();
                for id in ids {
                    self.end_request(id, End::Cancelled);
                }
            }
        }
        self.publish_stats();
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Shutdown => self.closing = true,
            Command::Submit(incoming) => self.accept(*incoming),
            Command::Pause(paused) => self.paused = paused,
            Command::Beam(request) => self.start_beam(*request),
            Command::Speculative(request) => self.accept_speculation(*request),
            Command::Checkpoint(reply) => self.checkpoints.push_back(reply),
            Command::View(steps, reply) => {
                let _ = reply.send(self.view(steps));
            }
            Command::Job(job) => {
                if self.closing {
                    // Dropping it tells the caller it never ran.
                    return;
                }
                let started = Instant::now();
                let seq = self.next_seq;
                self.next_seq += 1;
                let lease = CacheLease {
                    kv: &mut self.kv,
                    seq,
                    prefix_caching: self.config.prefix_caching,
                };
                let deliver = job(&mut self.engine, lease);
                if self.kv.has_sequence(seq) {
                    // A job that left its sequence behind would hold blocks forever.
                    let _ = self.kv.remove_sequence(seq);
                }
                let m = &self.shared.metrics;
                Metrics::add(&m.jobs, 1);
                m.job_seconds.observe(started.elapsed().as_secs_f64());
                deliver();
            }
        }
    }

    fn accept(&mut self, incoming: Incoming) {
        let Incoming {
            id,
            request,
            tx,
            arrived,
        } = incoming;
        let seq = self.next_seq;
        self.next_seq += 1;
        let tokenizer = self.tokenizer;
        let n = request.n.max(1);
        let explain = request.trace.explain || request.trace.full_logits;
        let made = SeqDecoder::new(
            tokenizer,
            &request.params,
            0,
            explain,
            Forcing::WhenUnobserved,
        );
        let decoder = match made {
            Ok(m) => m,
            Err(e) => {
                // `submit` validated the parameters; this cannot happen.
                self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                Metrics::add(&self.metrics().errors, 1);
                let _ = tx.send(ServeEvent::Error {
                    message: e.to_string(),
                });
                return;
            }
        };
        self.waiting.push_back(Seq {
            id: seq,
            req: id,
            choice: 0,
            tokens: request.prompt.clone(),
            computed: 0,
            decoder,
            fork: n - 1,
            last_token: None,
            finished: false,
            cached_prompt: 0,
            prefill_seconds: 0.0,
            prefill_steps: 0,
        });
        let trace = request.trace;
        self.requests.insert(
            id,
            Request {
                n,
                prompt_len: request.prompt.len(),
                params: request.params,
                tx,
                arrived,
                scheduled: false,
                done: vec![false; n],
                completion_tokens: 0,
                cached_tokens: 0,
                first_token: false,
                trace: Trace {
                    explain,
                    full_logits: trace.full_logits,
                },
                prompt: if explain {
                    request.prompt.clone()
                } else {
                    Vec::new()
                },
                queue_seconds: 0.0,
            },
        );
    }

    /// Ends the requests whose stream was dropped, freeing their blocks.
    fn reap_cancelled(&mut self) {
        self.scratch.clear();
        self.scratch.extend(
            self.requests
                .iter()
                .filter(|(_, r)| r.tx.is_closed())
                .map(|(&id, _)| id),
        );
        let closed = std::mem::take(&mut self.scratch);
        for &id in &closed {
            self.end_request(id, End::Cancelled);
        }
        self.scratch = closed;
    }

    /// Removes every sequence of request `id` and ends it: unfinished choices get `Done`
    /// (cancelled) and the request its `Usage`, or the request gets an `Error`.
    fn end_request(&mut self, id: u64, end: End) {
        let Some(mut r) = self.requests.remove(&id) else {
            return;
        };
        let kind = match end {
            End::Cancelled => LoopEventKind::Cancelled,
            End::Error(_) => LoopEventKind::Failed,
        };
        self.timeline.event(id, kind);
        let (kv, caching) = (&mut self.kv, self.config.prefix_caching);
        self.running.retain(|s| {
            if s.req == id {
                retire(kv, s, caching);
                false
            } else {
                true
            }
        });
        self.waiting.retain(|s| s.req != id);
        let m = &self.shared.metrics;
        if !r.scheduled {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        match end {
            End::Cancelled => {
                for choice in 0..r.n {
                    if !std::mem::replace(&mut r.done[choice], true) {
                        m.finish(FinishReason::Cancelled);
                        let _ = r.tx.send(ServeEvent::Done {
                            choice,
                            finish_reason: FinishReason::Cancelled,
                            cause: FinishCause::Cancelled,
                        });
                    }
                }
                finish_request(&r, m);
            }
            End::Error(message) => {
                Metrics::add(&m.errors, 1);
                let _ = r.tx.send(ServeEvent::Error { message });
            }
        }
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Frees the most recently admitted running sequence's blocks and puts it back at the front
    /// of the queue, its tokens and sampler kept: it is recomputed when admitted again.
    fn preempt_last(&mut self) {
        if let Some(mut s) = self.running.pop() {
            retire(&mut self.kv, &s, self.config.prefix_caching);
            self.timeline
                .event(s.req, LoopEventKind::Preempted { seq: s.id });
            s.computed = 0;
            Metrics::add(&self.metrics().preemptions, 1);
            self.waiting.push_front(s);
        }
    }

    fn step(&mut self) {
        // 1. Room in the cache for what every running sequence computes next, oldest first;
        // preempting from the newest end when blocks run out.
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() {
            let (id, len, req, ahead) = {
                let s = &self.running[i];
                let ahead = s.left().min(self.config.max_batch_tokens);
                (s.id, s.tokens.len(), s.req, ahead)
            };
            // The window layers: only what this step may write.
            match self.kv.reserve_within(id, len, ahead) {
                Ok(()) => i += 1,
                Err(KvError::OutOfBlocks { .. }) if self.running.len() > 1 => {
                    self.preempt_last();
                    preempted = true;
                }
                Err(e) => {
                    self.end_request(req, End::Error(format!("KV cache: {e}")));
                    i = 0;
                }
            }
        }

        // 2. One batch within the token budget: decode rows first, then new sequences
        // admitted, then the prompts' next rows (shortest prompt left first).
        self.batch.rows.clear();
        self.plan.clear();
        let mut budget = self.config.max_batch_tokens;
        let mut n_logits = 0;
        for (idx, s) in self.running.iter().enumerate() {
            if s.left() == 1 && budget > 0 {
                self.batch
                    .push(s.id, s.tokens[s.computed], s.computed, true);
                self.plan.push(Planned {
                    idx,
                    rows: 1,
                    logits: Some(n_logits),
                    decode: true,
                });
                n_logits += 1;
                budget -= 1;
            }
        }
        // Prompt rows: fewer when others decode in this step (they wait for all of it).
        let cap = self.config.max_prefill_rows_while_decoding;
        if n_logits > 0 && cap > 0 {
            budget = budget.min(cap);
        }
        // Admission: not in a step that had to preempt (that would only thrash), and while
        // this step has prompt rows for them (counted as if they took theirs first).
        let mut room = budget;
        let first_admitted = self.running.len();
        while room > 0 && !preempted && !self.closing {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let group = 1 + front.fork;
            if !self.running.is_empty() && self.running.len() + group > self.config.max_running {
                break;
            }
            let (id, req, len) = (front.id, front.req, front.tokens.len());
            if let Err(e) = self.kv.add_sequence_for(id, self.context) {
                self.end_request(req, End::Error(format!("KV cache: {e}")));
                continue;
            }
            let hit = if self.config.prefix_caching {
                // The last token is always computed: its logits are needed.
                self.kv
                    .attach_prefix(id, &front.tokens[..len - 1])
                    .unwrap_or(0)
            } else {
                0
            };
            // Headroom: a block for every running sequence's next step, so admitting does
            // not force a preemption right away.
            let ahead = (len - hit).min(self.config.max_batch_tokens);
            let crowded =
                !self.running.is_empty() && !self.kv.fits(id, len, ahead, self.running.len());
            if crowded {
                let _ = self.kv.remove_sequence(id);
                break;
            }
            if let Err(e) = self.kv.reserve_within(id, len, ahead) {
                let _ = self.kv.remove_sequence(id);
                if self.running.is_empty() {
                    // Alone it does not fit: it never will.
                    self.end_request(req, End::Error(format!("KV cache: {e}")));
                    continue;
                }
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            s.computed = hit;
            s.cached_prompt = hit;
            if let Some(r) = self.requests.get_mut(&req) {
                if !r.scheduled {
                    r.scheduled = true;
                    r.cached_tokens = hit;
                    r.queue_seconds = r.arrived.elapsed().as_secs_f64();
                    self.timeline.event(
                        req,
                        LoopEventKind::Admitted {
                            queue_seconds: r.queue_seconds,
                            cached_tokens: hit,
                        },
                    );
                    self.shared.queued.fetch_sub(1, Ordering::AcqRel);
                    let m = &self.shared.metrics;
                    m.queue_time.observe(r.arrived.elapsed().as_secs_f64());
                    Metrics::add(&m.prompt_tokens, r.prompt_len as u64);
                    if self.config.prefix_caching {
                        Metrics::add(&m.prefix_query_tokens, r.prompt_len as u64);
                        Metrics::add(&m.prefix_hit_tokens, hit as u64);
                    }
                }
            }
            room -= s.left().min(room);
            self.running.push(s);
        }
        // The prompt rows, shortest prompt left first (the oldest sure of a share); a
        // sequence just admitted reads its prompt here even when the prefix cache left it one
        // token.
        self.prefilling.clear();
        self.prompt_left.clear();
        let reading = |(idx, s): &(usize, &Seq<'_>)| s.left() > 1 || *idx >= first_admitted;
        for (idx, s) in self.running.iter().enumerate().filter(reading) {
            self.prefilling.push(idx);
            self.prompt_left.push(s.left());
        }
        share_prompt_rows(&self.prompt_left, budget, &mut self.shares);
        for &(k, take) in &self.shares {
            let idx = self.prefilling[k];
            let s = &self.running[idx];
            push_rows(&mut self.batch, s, take);
            let logits = (take == s.left()).then(|| {
                n_logits += 1;
                n_logits - 1
            });
            self.plan.push(Planned {
                idx,
                rows: take,
                logits,
                decode: false,
            });
        }
        if self.batch.is_empty() {
            return;
        }

        // 3. The forward pass.
        let started = Instant::now();
        let result = self.engine.model.forward(
            &self.batch,
            &mut self.kv,
            self.engine.precision,
            &mut self.logits,
        );
        let seconds = started.elapsed().as_secs_f64();
        let running = &self.running;
        self.timeline.step(
            started,
            seconds,
            self.plan.iter().map(|p| StepPart {
                request: running[p.idx].req,
                seq: running[p.idx].id,
                rows: p.rows,
                decode: p.decode,
            }),
        );
        // Described only when a request in the batch explains its tokens.
        let explaining = self.plan.iter().any(|p| {
            self.requests
                .get(&self.running[p.idx].req)
                .is_some_and(|r| r.trace.explain)
        });
        let step = explaining.then(|| self.step_info(seconds));
        {
            let m = &self.shared.metrics;
            Metrics::add(&m.steps, 1);
            m.batch_rows.observe(self.batch.len() as f64);
            let prefill_rows: usize = self.plan.iter().filter(|p| !p.decode).map(|p| p.rows).sum();
            Metrics::add(&m.computed_prompt_tokens, prefill_rows as u64);
        }
        if let Err(e) = result {
            self.scratch.clear();
            self.scratch
                .extend(self.plan.iter().map(|p| self.running[p.idx].req));
            self.scratch.sort_unstable();
            self.scratch.dedup();
            let failed = std::mem::take(&mut self.scratch);
            for &req in &failed {
                self.end_request(req, End::Error(format!("the forward pass failed: {e}")));
            }
            self.scratch = failed;
            return;
        }

        // 4. Sample every sequence that got logits; fork the choices of prompts just computed.
        let now = Instant::now();
        let vocab = self.vocab;
        let context = self.context;
        let tokenizer = self.tokenizer;
        let m = &self.shared.metrics;
        let costs = Costs {
            sliding: &self.engine.model.config().layer_is_sliding,
            window: self.engine.model.config().sliding_window,
            cost: &self.cost,
            kv_bytes_per_token: self.kv.bytes_per_token(),
            kv_context_bytes_per_token: self.kv.global_bytes_per_token(),
            block_size: self.kv.block_size(),
            step,
        };
        let mut failed = Vec::new();
        for p in 0..self.plan.len() {
            let Planned {
                idx,
                rows,
                logits,
                decode,
            } = self.plan[p];
            let s = &mut self.running[idx];
            s.computed += rows;
            if !decode {
                s.prefill_seconds += seconds;
                s.prefill_steps += 1;
            }
            if self.config.prefix_caching {
                let _ = self.kv.publish_prefix(s.id, &s.tokens[..s.computed]);
            }
            let Some(row) = logits else {
                continue;
            };
            let row = &self.logits[row * vocab..(row + 1) * vocab];
            let Some(r) = self.requests.get_mut(&s.req) else {
                continue;
            };
            let mut children = Vec::new();
            if s.fork > 0 {
                for choice in 1..=s.fork {
                    let child = self.next_seq;
                    self.next_seq += 1;
                    let made = self
                        .kv
                        .fork(s.id, child)
                        .map_err(crate::EngineError::from)
                        .and_then(|()| {
                            SeqDecoder::new(
                                tokenizer,
                                &r.params,
                                choice,
                                r.trace.explain,
                                Forcing::WhenUnobserved,
                            )
                        });
                    match made {
                        Ok(decoder) => children.push(Seq {
                            id: child,
                            req: s.req,
                            choice,
                            tokens: s.tokens.clone(),
                            computed: s.computed,
                            decoder,
                            fork: 0,
                            last_token: None,
                            finished: false,
                            cached_prompt: s.cached_prompt,
                            prefill_seconds: s.prefill_seconds,
                            prefill_steps: s.prefill_steps,
                        }),
                        Err(_) => {
                            // Cannot happen (a fresh id, validated parameters); the choice
                            // would then never run: end it rather than wait forever.
                            let _ = self.kv.remove_sequence(child);
                            r.done[choice] = true;
                            m.finish(FinishReason::Cancelled);
                            let _ = r.tx.send(ServeEvent::Done {
                                choice,
                                finish_reason: FinishReason::Cancelled,
                                cause: FinishCause::Cancelled,
                            });
                        }
                    }
                }
                s.fork = 0;
            }
            if let Err(e) = sample(s, row, r, context, m, now, &costs) {
                failed.push((s.req, e));
            }
            for mut child in children {
                if let Err(e) = sample(&mut child, row, r, context, m, now, &costs) {
                    failed.push((child.req, e));
                }
                self.running.push(child);
            }
        }
        for (req, e) in failed {
            self.end_request(req, End::Error(e.to_string()));
        }

        // 5. Finished choices leave (their blocks go back, full ones stay cached); requests
        // whose every choice is done get their usage.
        if self.running.iter().any(|s| s.finished) {
            self.scratch.clear();
            let (kv, caching) = (&mut self.kv, self.config.prefix_caching);
            let ended = &mut self.scratch;
            self.running.retain(|s| {
                if s.finished {
                    retire(kv, s, caching);
                    ended.push(s.req);
                    false
                } else {
                    true
                }
            });
            self.scratch.sort_unstable();
            self.scratch.dedup();
            for &req in &self.scratch {
                if self
                    .requests
                    .get(&req)
                    .is_some_and(|r| r.done.iter().all(|&d| d))
                {
                    if let Some(r) = self.requests.remove(&req) {
                        self.timeline.event(req, LoopEventKind::Finished);
                        finish_request(&r, &self.shared.metrics);
                        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                    }
                }
            }
        }
    }

    /// The whole server now, with the newest `steps` steps.
    fn view(&self, steps: usize) -> ServerView {
        let (steps, events) = self.timeline.recent(steps);
        let seq_view = |s: &Seq<'_>, state| SeqView {
            seq: s.id,
            request: s.req,
            choice: s.choice,
            state,
            tokens: s.tokens.len(),
            computed: s.computed,
            prompt_tokens: self.requests.get(&s.req).map_or(0, |r| r.prompt_len),
            cached_prompt: s.cached_prompt,
        };
        let sequences = self
            .running
            .iter()
            .map(|s| seq_view(s, SeqState::Running))
            .chain(self.waiting.iter().map(|s| seq_view(s, SeqState::Waiting)))
            .chain(self.beam_views())
            .chain(self.speculation_views())
            .collect();
        ServerView {
            now: self.timeline.since_start(Instant::now()),
            kv: self.kv.block_map(),
            sequences,
            queued: self.shared.queued.load(Ordering::Acquire),
            steps,
            events,
        }
    }

    /// What the step just planned is made of, with its forward pass's `seconds`.
    fn step_info(&mut self, seconds: f64) -> StepInfo {
        let (mut prefill_rows, mut decode_rows) = (0, 0);
        self.scratch.clear();
        for p in &self.plan {
            if p.decode {
                decode_rows += p.rows;
            } else {
                prefill_rows += p.rows;
            }
            self.scratch.push(self.running[p.idx].req);
        }
        self.scratch.sort_unstable();
        self.scratch.dedup();
        StepInfo {
            id: self.shared.iterations.load(Ordering::Relaxed),
            seconds,
            rows: self.batch.len(),
            sequences: self.plan.len(),
            requests: self.scratch.len(),
            prefill_rows,
            decode_rows,
        }
    }

    /// Answers the checkpoints this iteration served: every one, or, paused, the one that let
    /// it run.
    fn answer_checkpoints(&mut self) {
        let served = if self.paused {
            self.checkpoints.len().min(1)
        } else {
            self.checkpoints.len()
        };
        let stats = self.shared.kv_stats();
        for reply in self.checkpoints.drain(..served) {
            let _ = reply.send(stats);
        }
    }

    /// Gauges and the KV statistics the handles read.
    fn publish_stats(&mut self) {
        let s = &self.shared;
        let m = &s.metrics;
        s.kv_used.store(self.kv.used_blocks(), Ordering::Relaxed);
        s.kv_window_used
            .store(self.kv.used_window_blocks(), Ordering::Relaxed);
        Metrics::set(
            &m.kv_window_blocks_used,
            self.kv.used_window_blocks() as u64,
        );
        s.kv_cached_free
            .store(self.kv.idle_cached_blocks(), Ordering::Relaxed);
        Metrics::set(&m.kv_blocks_used, self.kv.used_blocks() as u64);
        Metrics::set(
            &m.kv_blocks_cached_free,
            self.kv.idle_cached_blocks() as u64,
        );
        Metrics::set(&m.kv_evictions, self.kv.evictions());
        self.scratch.clear();
        self.scratch.extend(self.running.iter().map(|s| s.req));
        self.scratch.sort_unstable();
        self.scratch.dedup();
        let running = self.scratch.len();
        Metrics::set(&m.running, running as u64);
        Metrics::set(&m.running_sequences, self.running.len() as u64);
        let waiting = self.requests.len().saturating_sub(running);
        Metrics::set(&m.waiting, waiting as u64);
        if let Some(tx) = &self.kv_events {
            let events = self.kv.take_events();
            if !events.is_empty() {
                let timestamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                let seq = self.kv_event_seq;
                self.kv_event_seq += 1;
                if tx
                    .try_send(super::KvEventBatch {
                        seq,
                        timestamp,
                        events,
                    })
                    .is_err()
                {
                    Metrics::add(&m.kv_events_dropped, 1);
                }
            }
        }
        s.iterations.fetch_add(1, Ordering::Release);
    }
}

/// Rows for the next `take` positions of `s`; the last asks for logits when it is the
/// sequence's last token.
fn push_rows(batch: &mut Batch, s: &Seq<'_>, take: usize) {
    let end = s.computed + take;
    for pos in s.computed..end {
        batch.push(s.id, s.tokens[pos], pos, pos + 1 == s.tokens.len());
    }
}

/// What a step's tokens are explained with.
struct Costs<'a> {
    sliding: &'a [bool],
    window: Option<usize>,
    cost: &'a ModelCost,
    kv_bytes_per_token: usize,
    /// The layers without a window's share of `kv_bytes_per_token`.
    kv_context_bytes_per_token: usize,
    block_size: usize,
    /// The step, when a request in it explains its tokens.
    step: Option<StepInfo>,
}

impl Costs<'_> {
    /// The cost of the row at `position` (attending to itself and what came before, within
    /// each sliding layer's window).
    fn token(&self, position: usize) -> TokenCost {
        let n_layers = self.sliding.len().max(1) as u64;
        let full = position as u64 + 1;
        let attended: u64 = self
            .sliding
            .iter()
            .map(|&sliding| match (sliding, self.window) {
                (true, Some(w)) => full.min(w as u64),
                _ => full,
            })
            .sum();
        TokenCost {
            flops: self.cost.flops_per_token
                + self.cost.attention_flops_per_position * attended / n_layers,
            weight_bytes: self.cost.weight_bytes_per_token,
            kv_bytes: self.kv_bytes_per_token as u64 * attended / n_layers,
        }
    }

    /// How sampled token `e` (drawn as `from` says) came to be, for the request's
    /// [`Trace::explain`].
    fn detail(
        &self,
        step: StepInfo,
        e: &Emitted<'_>,
        from: SampledFrom<'_>,
        prompt: &PromptFacts<'_>,
        now: Instant,
    ) -> TokenDetail {
        // The token sampled now sits at the sequence's next position; the cache holds every
        // position before it.
        let position = e.position;
        let bs = self.block_size;
        let blocks = (position + 1).div_ceil(bs);
        // The window layers hold the blocks from the one of the first position the next query
        // reads (the loop keeps no rollback slack).
        let window_blocks = match self.window {
            Some(w) => blocks - (position + 1).saturating_sub(w) / bs,
            None => blocks,
        };
        let window_bytes = self.kv_bytes_per_token - self.kv_context_bytes_per_token;
        TokenDetail {
            rule: if from.greedy {
                PickRule::Greedy
            } else {
                PickRule::Sampled
            },
            probability: e.probability,
            index: e.index,
            position,
            elapsed_s: now.duration_since(prompt.arrived).as_secs_f64(),
            step,
            kv_blocks: blocks,
            kv_bytes: (blocks * self.kv_context_bytes_per_token + window_blocks * window_bytes)
                * bs,
            kv_bytes_without_window: blocks * bs * self.kv_bytes_per_token,
            cost: self.token(position - 1),
            constraint: from.constraint,
            draw: from.draw,
            prompt: (e.index == 0).then(|| PromptInfo {
                tokens: prompt.tokens.to_vec(),
                cached_tokens: prompt.cached,
                computed_tokens: prompt.len - prompt.cached,
                prefill_seconds: prompt.seconds,
                prefill_steps: prompt.steps,
                queue_seconds: prompt.queue_seconds,
            }),
            logits: prompt.full_logits.then(|| from.logits.to_vec()),
        }
    }
}

/// What a sequence's token details report of its request and how its prompt was taken in.
struct PromptFacts<'a> {
    /// The prompt, kept when explaining; its length.
    tokens: &'a [u32],
    len: usize,
    arrived: Instant,
    queue_seconds: f64,
    full_logits: bool,
    /// Prompt tokens from the prefix cache; the forward passes that computed the rest.
    cached: usize,
    seconds: f64,
    steps: usize,
}

/// Samples the next token of `s` from `logits` (and appends the tokens the constraint forces
/// after it), streams each, and ends the choice when a stop condition says so.
fn sample(
    s: &mut Seq<'_>,
    logits: &[f32],
    r: &mut Request,
    context: usize,
    m: &Metrics,
    now: Instant,
    costs: &Costs<'_>,
) -> Result<(), crate::EngineError> {
    let explain = costs.step.is_some() && r.trace.explain;
    let Request {
        params,
        tx,
        arrived,
        prompt,
        prompt_len,
        queue_seconds,
        trace,
        completion_tokens,
        first_token,
        ..
    } = r;
    let facts = PromptFacts {
        tokens: prompt,
        len: *prompt_len,
        arrived: *arrived,
        queue_seconds: *queue_seconds,
        full_logits: trace.full_logits,
        cached: s.cached_prompt,
        seconds: s.prefill_seconds,
        steps: s.prefill_steps,
    };
    let (choice, last_token) = (s.choice, &mut s.last_token);
    let finish = s
        .decoder
        .decode(params, context, logits, &s.tokens, explain, &mut |mut e| {
            *completion_tokens += 1;
            Metrics::add(&m.generation_tokens, 1);
            let (logprobs, detail) = match e.sampled.take() {
                Some(from) => {
                    if !std::mem::replace(first_token, true) {
                        m.time_to_first_token
                            .observe(now.duration_since(facts.arrived).as_secs_f64());
                    }
                    if let Some(last) = last_token.replace(now) {
                        m.inter_token_latency
                            .observe(now.duration_since(last).as_secs_f64());
                    }
                    let logprobs = params.top_logprobs.map(|_| e.logprobs.clone());
                    let detail = costs
                        .step
                        .filter(|_| trace.explain)
                        .map(|step| Box::new(costs.detail(step, &e, from, &facts, now)));
                    (logprobs, detail)
                }
                None => {
                    Metrics::add(&m.forced_tokens, 1);
                    (None, None)
                }
            };
            let _ = tx.send(ServeEvent::Token {
                choice,
                token: e.token,
                text: e.text.to_string(),
                logprobs,
                detail,
            });
            true
        })?;
    s.tokens.extend_from_slice(s.decoder.step_tokens());
    if let Some(cause) = finish {
        s.finished = true;
        r.done[s.choice] = true;
        let finish_reason = cause.reason();
        m.finish(finish_reason);
        let _ = r.tx.send(ServeEvent::Done {
            choice: s.choice,
            finish_reason,
            cause,
        });
    }
    Ok(())
}

/// The request's last event.
fn finish_request(r: &Request, m: &Metrics) {
    m.e2e_latency.observe(r.arrived.elapsed().as_secs_f64());
    let _ = r.tx.send(ServeEvent::Usage {
        prompt_tokens: r.prompt_len,
        completion_tokens: r.completion_tokens,
        cached_prompt_tokens: r.cached_tokens,
    });
}
