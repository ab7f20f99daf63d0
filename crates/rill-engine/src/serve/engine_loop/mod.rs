//! The engine loop: it owns the model and the KV cache, takes commands from the handles, and
//! runs one forward pass per step over every sequence in flight (see the module docs of
//! [`crate::serve`] for the policy). Each step is plan → run → commit → observe: the
//! [`Scheduler`] decides the batch (and makes the KV calls that takes), the model runs it,
//! [`commit`] decodes and retires sequences, [`observe`] records it for the metrics, the
//! timeline and the glass box.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use rill_model::{KvCache, ModelCost, SeqId};
use rill_tokenizer::Tokenizer;

use super::metrics::Metrics;
use super::scheduler::{Policy, Scheduler, StepPlan};
use super::timeline::Timeline;
use super::{Command, ServeConfig, Shared};
use crate::{CacheLease, Engine};

mod beams;
mod commit;
mod lookup;
mod observe;
mod requests;
mod speculation;

use beams::BeamTask;
use requests::{End, Request, Seq};
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
    /// The running and waiting sequences, and the policy that schedules them.
    scheduler: Scheduler<Seq<'t>>,
    next_seq: SeqId,
    /// The step being run, as planned.
    plan: StepPlan,
    logits: Vec<f32>,
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
    /// What a decoding step's row costs, for prompt lookup's drafts.
    row_cost: lookup::RowCost,
    /// Every sequence's drafts' rounds: where a new sequence's record starts.
    draft_record: lookup::Acceptance,
}

impl<'t> Loop<'t> {
    fn new(parts: Parts, tokenizer: &'t Tokenizer) -> Loop<'t> {
        let vocab = parts.engine.model.config().vocab_size;
        let policy = Policy {
            max_batch_tokens: parts.config.max_batch_tokens,
            max_prefill_rows_while_decoding: parts.config.max_prefill_rows_while_decoding,
            max_running: parts.config.max_running,
            context: parts.context,
            prefix_caching: parts.config.prefix_caching,
        };
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
            scheduler: Scheduler::new(policy),
            next_seq: 0,
            plan: StepPlan::default(),
            logits: Vec::new(),
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
            row_cost: lookup::RowCost::default(),
            draft_record: lookup::Acceptance::default(),
        }
    }

    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    fn run(mut self) {
        loop {
            let idle = self.scheduler.is_idle()
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
            if may_step && !self.scheduler.is_idle() {
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

    /// One step: plan it, tell the world what planning did to requests, run the forward pass,
    /// record it, then commit its results.
    fn step(&mut self) {
        self.prepare_drafts();
        self.scheduler
            .plan(&mut self.kv, self.closing, &mut self.plan);
        self.apply_plan_events();
        if self.plan.batch.is_empty() {
            return;
        }
        let started = Instant::now();
        let result = self.engine.model.forward(
            &self.plan.batch,
            &mut self.kv,
            self.engine.precision,
            &mut self.logits,
        );
        let seconds = started.elapsed().as_secs_f64();
        if result.is_ok() && self.plan.prefill_and_decode_rows().0 == 0 {
            self.row_cost.observe(self.plan.batch.len(), seconds);
        }
        let head = self.engine.model.head_stats();
        self.engine.model.reset_head_stats();
        let m = &self.shared.metrics;
        Metrics::add(&m.head_two_pass_rows, head.rows);
        Metrics::add(&m.head_one_pass_rows, head.full_rows);
        Metrics::add(&m.head_refined_tokens, head.refined);
        Metrics::add(&m.head_bytes, head.bytes);
        let step = self.observe_step(started, seconds);
        if let Err(e) = result {
            self.scratch.clear();
            let running = &self.scheduler.running;
            self.scratch
                .extend(self.plan.parts.iter().map(|p| running[p.idx].req));
            self.scratch.sort_unstable();
            self.scratch.dedup();
            let failed = std::mem::take(&mut self.scratch);
            for &req in &failed {
                self.end_request(req, End::Error(format!("the forward pass failed: {e}")));
            }
            self.scratch = failed;
            return;
        }
        self.commit(seconds, step);
    }
}
