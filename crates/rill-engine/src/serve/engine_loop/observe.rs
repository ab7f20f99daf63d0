//! What the loop tells the world: each step in the timeline and the metrics, the steps that
//! explain their tokens described, the whole server's view, the KV statistics and the prefix
//! cache's events the handles read.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::super::metrics::Metrics;
use super::super::timeline::{SeqState, SeqView, ServerView, StepPart};
use super::super::StepInfo;
use super::requests::Seq;
use super::Loop;

impl Loop<'_> {
    /// Records a forward pass that began at `started` and took `seconds` (the timeline, the
    /// metrics); returns the step's description when a request in it explains its tokens.
    pub(super) fn observe_step(&mut self, started: Instant, seconds: f64) -> Option<StepInfo> {
        let running = &self.scheduler.running;
        self.timeline.step(
            started,
            seconds,
            self.plan.parts.iter().map(|p| StepPart {
                request: running[p.idx].req,
                seq: running[p.idx].id,
                rows: p.rows,
                decode: p.decode,
            }),
        );
        // Described only when a request in the batch explains its tokens.
        let explaining = self.plan.parts.iter().any(|p| {
            self.requests
                .get(&running[p.idx].req)
                .is_some_and(|r| r.trace.explain)
        });
        let step = explaining.then(|| self.step_info(seconds));
        let m = &self.shared.metrics;
        Metrics::add(&m.steps, 1);
        m.batch_rows.observe(self.plan.batch.len() as f64);
        let (prefill_rows, _) = self.plan.prefill_and_decode_rows();
        Metrics::add(&m.computed_prompt_tokens, prefill_rows as u64);
        step
    }

    /// The whole server now, with the newest `steps` steps.
    pub(super) fn view(&self, steps: usize) -> ServerView {
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
            .scheduler
            .running
            .iter()
            .map(|s| seq_view(s, SeqState::Running))
            .chain(
                self.scheduler
                    .waiting
                    .iter()
                    .map(|s| seq_view(s, SeqState::Waiting)),
            )
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
        let (prefill_rows, decode_rows) = self.plan.prefill_and_decode_rows();
        self.scratch.clear();
        for p in &self.plan.parts {
            self.scratch.push(self.scheduler.running[p.idx].req);
        }
        self.scratch.sort_unstable();
        self.scratch.dedup();
        StepInfo {
            id: self.shared.iterations.load(Ordering::Relaxed),
            seconds,
            rows: self.plan.batch.len(),
            sequences: self.plan.parts.len(),
            requests: self.scratch.len(),
            prefill_rows,
            decode_rows,
        }
    }

    /// Answers the checkpoints this iteration served: every one, or, paused, the one that let
    /// it run.
    pub(super) fn answer_checkpoints(&mut self) {
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
    pub(super) fn publish_stats(&mut self) {
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
        self.scratch
            .extend(self.scheduler.running.iter().map(|s| s.req));
        self.scratch.sort_unstable();
        self.scratch.dedup();
        let running = self.scratch.len();
        Metrics::set(&m.running, running as u64);
        Metrics::set(&m.running_sequences, self.scheduler.running.len() as u64);
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
                    .try_send(super::super::KvEventBatch {
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
