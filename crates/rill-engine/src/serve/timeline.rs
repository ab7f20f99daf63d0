//! The assembly line's record: the engine loop's recent steps (which requests' rows each forward
//! pass computed, prompt chunks against decode rows) and what happened to requests between them
//! (admitted after a wait in the queue, preempted, cancelled, finished), kept in fixed rings so
//! that recording costs a few small copies per step. [`ServerView`] is the whole server at one
//! moment: this record with the KV arena's blocks and every sequence, for the glass box.

use std::collections::VecDeque;
use std::time::Instant;

use rill_model::{BlockMap, SeqId};

/// Steps and events kept.
pub const TIMELINE_STEPS: usize = 256;
pub const TIMELINE_EVENTS: usize = 256;

/// One sequence's rows in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepPart {
    pub request: u64,
    pub seq: SeqId,
    pub rows: usize,
    /// A decode row (the sequence's next token), not a chunk of its prompt.
    pub decode: bool,
}

/// One forward pass of the loop.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepRecord {
    pub id: u64,
    /// Seconds since the loop started, when the pass began.
    pub at: f64,
    pub seconds: f64,
    pub parts: Vec<StepPart>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoopEventKind {
    /// Left the queue for the running set (first time only), after `queue_seconds`, with
    /// `cached_tokens` of its prompt from the prefix cache.
    Admitted {
        queue_seconds: f64,
        cached_tokens: usize,
    },
    /// A sequence lost its blocks to make room; it waits to be recomputed.
    Preempted { seq: SeqId },
    /// Its client went away (or it was cancelled) before it finished.
    Cancelled,
    /// It ended with an error.
    Failed,
    /// Every choice finished.
    Finished,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoopEvent {
    /// Seconds since the loop started.
    pub at: f64,
    /// Steps the loop had run when it happened.
    pub after_step: u64,
    pub request: u64,
    pub kind: LoopEventKind,
}

/// The rings.
pub(crate) struct Timeline {
    start: Instant,
    steps: VecDeque<StepRecord>,
    events: VecDeque<LoopEvent>,
    step_count: u64,
}

impl Timeline {
    pub(crate) fn new() -> Timeline {
        Timeline {
            start: Instant::now(),
            steps: VecDeque::with_capacity(TIMELINE_STEPS),
            events: VecDeque::with_capacity(TIMELINE_EVENTS),
            step_count: 0,
        }
    }

    pub(crate) fn since_start(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64()
    }

    /// Records a forward pass that began at `started` and took `seconds`.
    pub(crate) fn step(
        &mut self,
        started: Instant,
        seconds: f64,
        parts: impl Iterator<Item = StepPart>,
    ) {
        // The oldest record's allocation is reused once the ring is full.
        let mut record = if self.steps.len() == TIMELINE_STEPS {
            self.steps.pop_front().unwrap_or_default()
        } else {
            StepRecord::default()
        };
        self.step_count += 1;
        record.id = self.step_count;
        record.at = self.since_start(started);
        record.seconds = seconds;
        record.parts.clear();
        record.parts.extend(parts);
        self.steps.push_back(record);
    }

    pub(crate) fn event(&mut self, request: u64, kind: LoopEventKind) {
        if self.events.len() == TIMELINE_EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(LoopEvent {
            at: self.since_start(Instant::now()),
            after_step: self.step_count,
            request,
            kind,
        });
    }

    /// The newest `steps` steps and every kept event since the oldest of them.
    pub(crate) fn recent(&self, steps: usize) -> (Vec<StepRecord>, Vec<LoopEvent>) {
        let skip = self.steps.len().saturating_sub(steps);
        let steps: Vec<StepRecord> = self.steps.iter().skip(skip).cloned().collect();
        let from = steps.first().map_or(self.step_count, |s| s.id - 1);
        let events = self
            .events
            .iter()
            .filter(|e| e.after_step >= from)
            .copied()
            .collect();
        (steps, events)
    }
}

/// Where a sequence is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqState {
    /// Holds KV blocks and is computed in steps.
    Running,
    /// In the queue (new, or preempted): holds no blocks.
    Waiting,
    /// A running beam of a beam search (`choice`: its rank among the beams, best first).
    Beam,
    /// No positions: blocks a beam search keeps for its beams' growth, so no other request
    /// takes them.
    Reserved,
    /// A speculative generation's session: its KV cache is its own, outside the arena (it
    /// holds no block).
    Speculative,
}

/// One sequence (a choice of a request) at the moment of a [`ServerView`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqView {
    pub seq: SeqId,
    pub request: u64,
    pub choice: usize,
    pub state: SeqState,
    /// Prompt and generated tokens so far, and how many are in the cache.
    pub tokens: usize,
    pub computed: usize,
    pub prompt_tokens: usize,
    /// Prompt tokens that came from the prefix cache.
    pub cached_prompt: usize,
}

/// The whole server at one moment, between two steps.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerView {
    /// Seconds since the loop started.
    pub now: f64,
    pub kv: BlockMap,
    pub sequences: Vec<SeqView>,
    /// Requests in the bounded queue (never scheduled yet).
    pub queued: usize,
    pub steps: Vec<StepRecord>,
    pub events: Vec<LoopEvent>,
}
