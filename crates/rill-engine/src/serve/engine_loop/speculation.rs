//! Speculative generations in the serving loop. Each runs on a session of its own (its KV cache
//! sized for its prompt and tokens, outside the loop's arena, as a draft needs a rollback the
//! arena's shared prefix blocks do not offer) and is stepped once per loop iteration: a pass
//! of its prompt, a pass of the draft taking the prompt in, or one round of drafting and
//! verifying. So it never holds the other requests for longer than one step, and its passes
//! show in the loop's timeline like any request's. At most [`MAX_SPECULATIONS`] run at once
//! (each holds a cache of its own, outside the arena's budget); later ones wait their turn.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rill_model::SeqId;

use super::super::metrics::Metrics;
use super::super::timeline::{LoopEventKind, SeqState, SeqView, StepPart};
use super::super::SpeculativeRequest;
use super::Loop;
use crate::speculative::SpeculativeRun;
use crate::{EngineError, Generation, Session, Speculator};

/// Speculative generations stepped at once; more wait, in order, for one of them to end.
pub(crate) const MAX_SPECULATIONS: usize = 2;

/// A speculative generation in progress.
pub(super) struct SpeculationTask<'t> {
    id: u64,
    /// A sequence id of its own, for the timeline and the server's view (not in the arena).
    seq: SeqId,
    run: SpeculativeRun<'t, Session, Speculator>,
    cancelled: Arc<AtomicBool>,
    reply: tokio::sync::oneshot::Sender<Result<Generation, EngineError>>,
}

impl<'t> Loop<'t> {
    /// Takes a speculative generation in: set up now (no forward pass yet: its steps come
    /// with the loop's) when fewer than [`MAX_SPECULATIONS`] run, else queued.
    pub(super) fn accept_speculation(&mut self, request: SpeculativeRequest) {
        if self.closing {
            // Dropping the reply tells the caller it never ran.
            return;
        }
        if self.speculations.len() >= MAX_SPECULATIONS {
            self.speculation_queue.push_back(request);
            return;
        }
        self.start_speculation(request);
    }

    /// Starts queued speculative generations while there is room (those whose caller left are
    /// dropped).
    fn start_queued_speculations(&mut self) {
        while self.speculations.len() < MAX_SPECULATIONS {
            let Some(request) = self.speculation_queue.pop_front() else {
                break;
            };
            if request.cancelled.load(Ordering::Relaxed) || request.reply.is_closed() {
                continue;
            }
            self.start_speculation(request);
        }
    }

    fn start_speculation(&mut self, request: SpeculativeRequest) {
        let SpeculativeRequest {
            id,
            prompt,
            source,
            speculative,
            params,
            context,
            cancelled,
            reply,
        } = request;
        let started = (|| {
            let speculator = Speculator::new(&self.engine, source, speculative)?;
            let session = self.engine.new_session(context)?;
            SpeculativeRun::start(
                session,
                speculator,
                self.tokenizer,
                &self.engine.model,
                self.engine.precision,
                &prompt,
                &params,
            )
        })();
        let run = match started {
            Ok(run) => run,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        self.timeline.event(
            id,
            LoopEventKind::Admitted {
                queue_seconds: 0.0,
                cached_tokens: 0,
            },
        );
        let seq = self.next_seq;
        self.next_seq += 1;
        self.speculations.push(SpeculationTask {
            id,
            seq,
            run,
            cancelled,
            reply,
        });
    }

    /// One step of every speculative generation; finished ones deliver their result and leave,
    /// and queued ones take their places.
    pub(super) fn step_speculations(&mut self) {
        self.start_queued_speculations();
        let mut i = 0;
        while i < self.speculations.len() {
            let task = &mut self.speculations[i];
            if task.cancelled.load(Ordering::Relaxed) || task.reply.is_closed() {
                let task = self.speculations.swap_remove(i);
                self.timeline.event(task.id, LoopEventKind::Cancelled);
                continue;
            }
            let decode = task.run.prompt_cached() == task.run.prompt_len();
            let started = Instant::now();
            let cancelled = &task.cancelled;
            let stepped = task.run.step(&mut self.engine.model, &mut |_| {
                !cancelled.load(Ordering::Relaxed)
            });
            let seconds = started.elapsed().as_secs_f64();
            let rows = task.run.last_step_rows();
            if rows > 0 {
                self.timeline.step(
                    started,
                    seconds,
                    std::iter::once(StepPart {
                        request: task.id,
                        seq: task.seq,
                        rows,
                        decode,
                    }),
                );
            }
            match stepped {
                Ok(false) => i += 1,
                Ok(true) => {
                    let task = self.speculations.swap_remove(i);
                    self.timeline.event(task.id, LoopEventKind::Finished);
                    Metrics::add(&self.shared.metrics.speculations, 1);
                    match task.run.finish() {
                        Some(generation) => {
                            let _ = task.reply.send(Ok(generation));
                        }
                        None => {
                            let _ = task.reply.send(Err(EngineError::BadParameter(
                                "the speculative generation did not finish".into(),
                            )));
                        }
                    }
                }
                Err(e) => {
                    let task = self.speculations.swap_remove(i);
                    self.timeline.event(task.id, LoopEventKind::Failed);
                    let _ = task.reply.send(Err(e));
                }
            }
        }
        self.start_queued_speculations();
    }

    /// Ends every speculative generation unanswered (the loop is stopping: their callers hear
    /// that it stopped).
    pub(super) fn drop_speculations(&mut self) {
        for task in std::mem::take(&mut self.speculations) {
            self.timeline.event(task.id, LoopEventKind::Cancelled);
        }
        self.speculation_queue.clear();
    }

    /// The speculative generations' sessions, for the server's view (their caches are their
    /// own, so they hold no block of the arena).
    pub(super) fn speculation_views(&self) -> impl Iterator<Item = SeqView> + '_ {
        self.speculations.iter().map(|t| {
            let cached = t.run.session().tokens().len();
            SeqView {
                seq: t.seq,
                request: t.id,
                choice: 0,
                state: SeqState::Speculative,
                tokens: t.run.prompt_len() + t.run.generated(),
                computed: cached,
                prompt_tokens: t.run.prompt_len(),
                cached_prompt: t.run.prompt_reused(),
            }
        })
    }
}
