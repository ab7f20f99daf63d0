//! Beam searches in the serving loop: each runs in the loop's KV arena, one forward pass of its
//! running beams per loop iteration, between the loop's own steps, so a search never holds the
//! other requests for longer than one step, and its beams (and the blocks it keeps for their
//! growth) show in the server's view like any request's sequences.

use std::sync::atomic::Ordering;
use std::time::Instant;

use rill_model::{KvCache, KvError, SeqId};

use super::super::timeline::{LoopEventKind, SeqState, SeqView, StepPart};
use super::super::BeamRequest;
use super::Loop;
use crate::beam::{BeamError, BeamOutput, BeamRun};

/// A search in progress.
pub(super) struct BeamTask {
    id: u64,
    run: BeamRun,
    prompt_len: usize,
    /// An empty sequence holding the blocks the search may still take (its bound less what it
    /// holds): other requests cannot take them, so the search never runs out part-way.
    reservation: SeqId,
    cancelled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reply: tokio::sync::oneshot::Sender<Result<BeamOutput, BeamError>>,
}

/// Sets `reservation` to hold the blocks `run` may still take.
fn reserve_growth(kv: &mut KvCache, run: &BeamRun, reservation: SeqId) -> Result<(), KvError> {
    if kv.has_sequence(reservation) {
        kv.remove_sequence(reservation)?;
    }
    let wanted = run.blocks_bound(kv).saturating_sub(run.blocks_held(kv));
    kv.add_sequence(reservation)?;
    // Global blocks only: the beams' window layers let go as they take.
    let reserved = kv.reserve_within(reservation, wanted * kv.block_size(), 0);
    if reserved.is_err() {
        let _ = kv.remove_sequence(reservation);
    }
    reserved
}

impl Loop<'_> {
    /// Starts a search: its prompt from the prefix cache (the caller brings it there first, so
    /// only its last position is computed here), and the blocks it may grow into set aside.
    pub(super) fn start_beam(&mut self, request: BeamRequest) {
        if self.closing {
            // Dropping the reply tells the caller it never ran.
            return;
        }
        let BeamRequest {
            id,
            prompt,
            params,
            cancelled,
            reply,
        } = request;
        let started = Instant::now();
        let run = BeamRun::start(
            &mut self.engine,
            &mut self.kv,
            &prompt,
            &params,
            None,
            self.config.prefix_caching,
        );
        let mut run = match run {
            Ok(run) => run,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let cached = run.cached_prompt();
        let root = run.sequences().next().unwrap_or_default();
        self.timeline.step(
            started,
            started.elapsed().as_secs_f64(),
            std::iter::once(StepPart {
                request: id,
                seq: root,
                rows: prompt.len() - cached,
                decode: false,
            }),
        );
        self.timeline.event(
            id,
            LoopEventKind::Admitted {
                queue_seconds: 0.0,
                cached_tokens: cached,
            },
        );
        let reservation = self.next_seq;
        self.next_seq += 1;
        if let Err(e) = reserve_growth(&mut self.kv, &run, reservation) {
            run.abort(&mut self.kv);
            self.timeline.event(id, LoopEventKind::Failed);
            let _ = reply.send(Err(BeamError::Kv(e)));
            return;
        }
        self.beams.push(BeamTask {
            id,
            run,
            prompt_len: prompt.len(),
            reservation,
            cancelled,
            reply,
        });
    }

    /// One step of every search; finished ones deliver their output and leave.
    pub(super) fn step_beams(&mut self) {
        let mut i = 0;
        while i < self.beams.len() {
            let task = &mut self.beams[i];
            if task.cancelled.load(Ordering::Relaxed) || task.reply.is_closed() {
                let task = self.beams.swap_remove(i);
                self.end_beam(task, None);
                continue;
            }
            let _ = self.kv.remove_sequence(task.reservation);
            let started = Instant::now();
            let stepped = task.run.step(&mut self.engine, &mut self.kv, &mut |_| true);
            let seconds = started.elapsed().as_secs_f64();
            match stepped {
                Ok(None) => {
                    let id = task.id;
                    self.timeline.step(
                        started,
                        seconds,
                        task.run.sequences().map(|seq| StepPart {
                            request: id,
                            seq,
                            rows: 1,
                            decode: true,
                        }),
                    );
                    if let Err(e) = reserve_growth(&mut self.kv, &task.run, task.reservation) {
                        let task = self.beams.swap_remove(i);
                        self.end_beam(task, Some(Err(BeamError::Kv(e))));
                        continue;
                    }
                    i += 1;
                }
                Ok(Some(output)) => {
                    let task = self.beams.swap_remove(i);
                    self.end_beam(task, Some(Ok(output)));
                }
                Err(e) => {
                    let task = self.beams.swap_remove(i);
                    self.end_beam(task, Some(Err(e)));
                }
            }
        }
    }

    /// Takes a search's blocks back and delivers its result (None: cancelled, nothing sent).
    pub(super) fn end_beam(
        &mut self,
        mut task: BeamTask,
        result: Option<Result<BeamOutput, BeamError>>,
    ) {
        task.run.abort(&mut self.kv);
        if self.kv.has_sequence(task.reservation) {
            let _ = self.kv.remove_sequence(task.reservation);
        }
        let kind = match &result {
            None => LoopEventKind::Cancelled,
            Some(Ok(_)) => LoopEventKind::Finished,
            Some(Err(_)) => LoopEventKind::Failed,
        };
        self.timeline.event(task.id, kind);
        if let Some(result) = result {
            let _ = task.reply.send(result);
        }
    }

    /// The searches' beams and reservations, for the server's view.
    pub(super) fn beam_views(&self) -> impl Iterator<Item = SeqView> + '_ {
        self.beams.iter().flat_map(|t| {
            let generated = t.run.steps();
            let beam = move |(choice, seq)| SeqView {
                seq,
                request: t.id,
                choice,
                state: SeqState::Beam,
                tokens: t.prompt_len + generated,
                computed: t.prompt_len + generated,
                prompt_tokens: t.prompt_len,
                cached_prompt: t.run.cached_prompt(),
            };
            let reserved = SeqView {
                seq: t.reservation,
                request: t.id,
                choice: 0,
                state: SeqState::Reserved,
                tokens: 0,
                computed: 0,
                prompt_tokens: t.prompt_len,
                cached_prompt: t.run.cached_prompt(),
            };
            t.run
                .sequences()
                .enumerate()
                .map(beam)
                .chain(std::iter::once(reserved))
        })
    }
}
