//! The loop's requests and their sequences: taking a request in, ending it (cancelled, or
//! failed), and what a step's plan did to them (admitted, preempted, failed) told to the
//! metrics and the timeline.

use std::sync::atomic::Ordering;
use std::time::Instant;

use rill_model::SeqId;
use tokio::sync::mpsc::UnboundedSender;

use super::super::metrics::Metrics;
use super::super::scheduler::{PlanEvent, Scheduled};
use super::super::timeline::LoopEventKind;
use super::super::{Incoming, ServeEvent, Trace};
use super::lookup::Acceptance;
use super::Loop;
use crate::decoder::{Forcing, SeqDecoder};
use crate::speculative::AdaptiveDraft;
use crate::{FinishCause, FinishReason, GenerateParams};

/// One choice of a request: a sequence of the KV cache.
pub(super) struct Seq<'t> {
    pub(super) id: SeqId,
    pub(super) req: u64,
    pub(super) choice: usize,
    /// Prompt and generated tokens; all but the last are (or, waiting, will be) in the cache.
    pub(super) tokens: Vec<u32>,
    /// Tokens whose keys and values are in the cache (0 while waiting).
    pub(super) computed: usize,
    /// Its sampler, its state in the request's constraint and its output so far.
    pub(super) decoder: SeqDecoder<'t>,
    /// Choices still to fork from this sequence once its prompt is computed (`n - 1` for a
    /// request's first sequence, until then).
    pub(super) fork: usize,
    pub(super) last_token: Option<Instant>,
    pub(super) finished: bool,
    /// Prompt tokens that came from the prefix cache, and the forward passes (seconds, steps)
    /// that computed the rest (for [`Trace::explain`]).
    pub(super) cached_prompt: usize,
    pub(super) prefill_seconds: f64,
    pub(super) prefill_steps: usize,
    /// Tokens prompt lookup drafted to follow the next one, verified in this step's pass.
    pub(super) draft: Vec<u32>,
    /// How its drafts fared: what the next draft is worth.
    pub(super) acceptance: Acceptance,
    /// The adaptive draft length, while the loop has no measure of a row's cost.
    pub(super) draft_length: AdaptiveDraft,
}

impl Scheduled for Seq<'_> {
    fn id(&self) -> SeqId {
        self.id
    }

    fn request(&self) -> u64 {
        self.req
    }

    fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn computed(&self) -> usize {
        self.computed
    }

    fn preempted(&mut self) {
        self.computed = 0;
        self.draft.clear();
    }

    fn admitted(&mut self, hit: usize) {
        self.computed = hit;
        self.cached_prompt = hit;
    }

    fn forks_pending(&self) -> usize {
        self.fork
    }

    fn draft(&self) -> &[u32] {
        &self.draft
    }

    fn cut_draft(&mut self, keep: usize) {
        self.draft.truncate(keep);
    }

    fn head_cut(&self) -> rill_model::HeadCut {
        if self.fork > 0 {
            // Its choices fork from these logits, each with its own sampler.
            return rill_model::HeadCut::Full;
        }
        self.decoder.head_cut()
    }
}

pub(super) struct Request {
    pub(super) n: usize,
    pub(super) prompt_len: usize,
    pub(super) params: GenerateParams,
    pub(super) tx: UnboundedSender<ServeEvent>,
    pub(super) arrived: Instant,
    /// Scheduled at least once (it left the bounded queue).
    pub(super) scheduled: bool,
    pub(super) done: Vec<bool>,
    pub(super) completion_tokens: usize,
    pub(super) cached_tokens: usize,
    pub(super) first_token: bool,
    pub(super) trace: Trace,
    /// The prompt, kept when explaining (the first token reports it).
    pub(super) prompt: Vec<u32>,
    pub(super) queue_seconds: f64,
}

/// How a request ends early.
pub(super) enum End {
    Cancelled,
    Error(String),
}

impl<'t> Loop<'t> {
    pub(super) fn accept(&mut self, incoming: Incoming) {
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
        self.scheduler.waiting.push_back(Seq {
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
            draft: Vec::new(),
            acceptance: self.draft_record.seed(),
            draft_length: AdaptiveDraft::new(self.config.prompt_lookup_tokens),
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
    pub(super) fn reap_cancelled(&mut self) {
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
    pub(super) fn end_request(&mut self, id: u64, end: End) {
        let Some(mut r) = self.requests.remove(&id) else {
            return;
        };
        let kind = match end {
            End::Cancelled => LoopEventKind::Cancelled,
            End::Error(_) => LoopEventKind::Failed,
        };
        self.timeline.event(id, kind);
        self.scheduler.remove_request(&mut self.kv, id);
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

    /// Tells the metrics and the timeline what planning a step did to requests, in order;
    /// ends the requests that failed.
    pub(super) fn apply_plan_events(&mut self) {
        let events = std::mem::take(&mut self.plan.events);
        for event in &events {
            match event {
                PlanEvent::Preempted { request, seq } => {
                    self.timeline
                        .event(*request, LoopEventKind::Preempted { seq: *seq });
                    Metrics::add(&self.metrics().preemptions, 1);
                }
                PlanEvent::Failed { request, message } => {
                    self.end_request(*request, End::Error(message.clone()));
                }
                &PlanEvent::Admitted { request, hit } => self.admitted(request, hit),
            }
        }
        self.plan.events = events;
    }

    /// A sequence of request `req` was admitted with `hit` prompt tokens cached: the first
    /// time, the request leaves the bounded queue.
    fn admitted(&mut self, req: u64, hit: usize) {
        let Some(r) = self.requests.get_mut(&req) else {
            return;
        };
        if r.scheduled {
            return;
        }
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

/// The request's last event.
pub(super) fn finish_request(r: &Request, m: &Metrics) {
    m.e2e_latency.observe(r.arrived.elapsed().as_secs_f64());
    let _ = r.tx.send(ServeEvent::Usage {
        prompt_tokens: r.prompt_len,
        completion_tokens: r.completion_tokens,
        cached_prompt_tokens: r.cached_tokens,
    });
}
