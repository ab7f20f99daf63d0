//! The serving loop's scheduling policy, apart from everything else the loop does: which
//! sequences get rows in the next forward pass, which waiting ones are admitted, which running
//! one is preempted when the KV cache runs out of blocks, and which requests fail for good.
//! [`Scheduler::plan`] decides one step and makes the KV cache calls that decision needs
//! (reservations, prefix attachment, freeing what is preempted or failed), in a fixed order;
//! it knows no model, no metrics, no channels, so it is tested on a tiny KV cache alone. The
//! loop runs the plan's batch through the model, then commits the results and tells the world
//! (see [`crate::serve`]'s module documentation for the policy in words).

mod prompt_rows;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use rill_model::{Batch, KvCache, KvError, SeqId};

use prompt_rows::share_prompt_rows;

/// What the scheduler needs of a sequence.
pub(crate) trait Scheduled {
    fn id(&self) -> SeqId;
    /// The request it is a choice of.
    fn request(&self) -> u64;
    /// Prompt and generated tokens; all but the last are (or, waiting, will be) in the cache.
    fn tokens(&self) -> &[u32];
    /// Tokens whose keys and values are in the cache (0 while waiting).
    fn computed(&self) -> usize;
    /// Preempted: its blocks are gone, everything is computed again when it is readmitted.
    fn preempted(&mut self);
    /// Admitted with `hit` prompt tokens from the prefix cache (they count as computed).
    fn admitted(&mut self, hit: usize);
    /// Choices still to fork from it once its prompt is computed: they are admitted with it.
    fn forks_pending(&self) -> usize;
    /// What its next token's sampling reads of the logits (every logit unless it says less).
    fn head_cut(&self) -> rill_model::HeadCut {
        rill_model::HeadCut::Full
    }
    /// Tokens drafted to follow its next one, to verify in the same step (decoding only).
    fn draft(&self) -> &[u32] {
        &[]
    }
    /// Keeps only the first `keep` drafted tokens (no room for the rest this step).
    fn cut_draft(&mut self, keep: usize) {
        let _ = keep;
    }

    /// Positions still to compute before its next token can be sampled.
    fn left(&self) -> usize {
        self.tokens().len() - self.computed()
    }
}

/// The limits the policy works within.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// Most rows in one forward pass.
    pub(crate) max_batch_tokens: usize,
    /// Most prompt rows in a step that also decodes (0: no bound beyond the batch's).
    pub(crate) max_prefill_rows_while_decoding: usize,
    /// Most sequences running at once.
    pub(crate) max_running: usize,
    /// Positions a sequence may grow to.
    pub(crate) context: usize,
    pub(crate) prefix_caching: bool,
}

/// One sequence's part of a step's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Planned {
    /// Index in [`Scheduler::running`].
    pub(crate) idx: usize,
    pub(crate) rows: usize,
    /// Its row in the step's logits, when the batch computes its next token's logits (and
    /// after it, one more row for each drafted token).
    pub(crate) logits: Option<usize>,
    pub(crate) decode: bool,
    /// Drafted tokens in its rows after the first (decoding only): each row's logits verify
    /// the token drafted after it.
    pub(crate) drafted: usize,
}

/// What happened to requests while a step was planned, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PlanEvent {
    /// A running sequence lost its blocks and waits, at the front of the queue.
    Preempted { request: u64, seq: SeqId },
    /// The request cannot go on: its sequences are gone (their blocks freed).
    Failed { request: u64, message: String },
    /// A sequence left the queue for the running set with `hit` prompt tokens cached.
    Admitted { request: u64, hit: usize },
}

/// One step's decision (buffers reused from step to step).
#[derive(Debug, Default)]
pub(crate) struct StepPlan {
    /// The forward pass's rows: decode rows first, then prompt rows.
    pub(crate) batch: Batch,
    /// Each sequence's rows in `batch`, in the same order.
    pub(crate) parts: Vec<Planned>,
    pub(crate) events: Vec<PlanEvent>,
}

impl StepPlan {
    /// Prompt rows and decode rows in the batch.
    pub(crate) fn prefill_and_decode_rows(&self) -> (usize, usize) {
        self.parts.iter().fold((0, 0), |(p, d), part| {
            if part.decode {
                (p, d + part.rows)
            } else {
                (p + part.rows, d)
            }
        })
    }
}

/// The running and waiting sequences and the policy that moves them (see the module docs).
pub(crate) struct Scheduler<S> {
    policy: Policy,
    /// Front first; sequences here hold no KV blocks.
    pub(crate) waiting: VecDeque<S>,
    /// In admission order (preemption takes from the end).
    pub(crate) running: Vec<S>,
    prefilling: Vec<usize>,
    prompt_left: Vec<usize>,
    shares: Vec<(usize, usize)>,
}

/// Takes a sequence's blocks back, publishing its computed positions first (with prefix
/// caching), the partly filled last block included: a context that ended mid-block is shared
/// up to its last computed position by whatever continues it (a lens, the next turn).
pub(crate) fn retire(kv: &mut KvCache, s: &impl Scheduled, prefix_caching: bool) {
    if prefix_caching {
        let _ = kv.publish_tail(s.id(), &s.tokens()[..s.computed()]);
    }
    let _ = kv.remove_sequence(s.id());
}

impl<S: Scheduled> Scheduler<S> {
    pub(crate) fn new(policy: Policy) -> Scheduler<S> {
        Scheduler {
            policy,
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefilling: Vec::new(),
            prompt_left: Vec::new(),
            shares: Vec::new(),
        }
    }

    pub(crate) fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Removes every sequence of `request`, running ones retired from the cache.
    pub(crate) fn remove_request(&mut self, kv: &mut KvCache, request: u64) {
        let caching = self.policy.prefix_caching;
        self.running.retain(|s| {
            if s.request() == request {
                retire(kv, s, caching);
                false
            } else {
                true
            }
        });
        self.waiting.retain(|s| s.request() != request);
    }

    /// Decides the next step into `plan`: room in the cache for every running sequence's next
    /// rows (preempting the newest when blocks run out), then one batch within the token
    /// budget: a decode row for every sequence with a token to compute, sequences admitted
    /// from the queue (not in a step that had to preempt, nor while `closing`), then the
    /// prompts' rows, shortest prompt left first. An empty batch: nothing to run.
    pub(crate) fn plan(&mut self, kv: &mut KvCache, closing: bool, plan: &mut StepPlan) {
        plan.events.clear();
        plan.batch.rows.clear();
        plan.parts.clear();
        self.cut_drafts_to_spare_rows(closing);
        let preempted = self.make_room(kv, plan);

        // Decode rows first, each decoding sequence's drafted tokens after its row.
        let max_batch = self.policy.max_batch_tokens;
        let mut budget = max_batch;
        let mut n_logits = 0;
        for (idx, s) in self.running.iter_mut().enumerate() {
            if s.left() == 1 && budget > 0 {
                let drafted = s.draft().len();
                let (at, cut) = (s.computed(), s.head_cut());
                plan.batch.push_cut(s.id(), s.tokens()[at], at, cut);
                for (j, &token) in s.draft().iter().enumerate() {
                    plan.batch.push_cut(s.id(), token, at + 1 + j, cut);
                }
                plan.parts.push(Planned {
                    idx,
                    rows: 1 + drafted,
                    logits: Some(n_logits),
                    decode: true,
                    drafted,
                });
                n_logits += 1 + drafted;
                budget -= 1 + drafted;
            }
        }
        // Prompt rows: fewer when others decode in this step (they wait for all of it).
        let cap = self.policy.max_prefill_rows_while_decoding;
        if n_logits > 0 && cap > 0 {
            budget = budget.min(cap);
        }
        let first_admitted = self.running.len();
        if !preempted && !closing {
            self.admit(kv, budget, plan);
        }
        // The prompt rows, shortest prompt left first (the oldest sure of a share); a
        // sequence just admitted reads its prompt here even when the prefix cache left it one
        // token.
        self.prefilling.clear();
        self.prompt_left.clear();
        let reading = |(idx, s): &(usize, &S)| s.left() > 1 || *idx >= first_admitted;
        for (idx, s) in self.running.iter().enumerate().filter(reading) {
            self.prefilling.push(idx);
            self.prompt_left.push(s.left());
        }
        share_prompt_rows(&self.prompt_left, budget, &mut self.shares);
        for &(k, take) in &self.shares {
            let idx = self.prefilling[k];
            let s = &self.running[idx];
            let end = s.computed() + take;
            for pos in s.computed()..end {
                // The last row asks for logits when it is the sequence's last token.
                let last = pos + 1 == s.tokens().len();
                if last {
                    plan.batch
                        .push_cut(s.id(), s.tokens()[pos], pos, s.head_cut());
                } else {
                    plan.batch.push(s.id(), s.tokens()[pos], pos, false);
                }
            }
            let logits = (take == s.left()).then(|| {
                n_logits += 1;
                n_logits - 1
            });
            plan.parts.push(Planned {
                idx,
                rows: take,
                logits,
                decode: false,
                drafted: 0,
            });
        }
    }

    /// Cuts the decoding sequences' drafts (oldest first) to the rows the step has to spare:
    /// the budget beyond one row for every decoding sequence and the rows prompts would take
    /// (those being read, and the queue's unless `closing`), at most the cap on prompt rows
    /// beside decoding. Drafts never take a prompt's rows.
    fn cut_drafts_to_spare_rows(&mut self, closing: bool) {
        let decoding = self.running.iter().filter(|s| s.left() == 1).count();
        let queued = if closing {
            0
        } else {
            self.waiting.iter().map(|s| s.left()).sum()
        };
        let prompts: usize = self
            .running
            .iter()
            .filter(|s| s.left() > 1)
            .map(|s| s.left())
            .sum::<usize>()
            + queued;
        let cap = self.policy.max_prefill_rows_while_decoding;
        let held = if cap > 0 { prompts.min(cap) } else { prompts };
        let mut spare = self
            .policy
            .max_batch_tokens
            .saturating_sub(decoding)
            .saturating_sub(held);
        for s in self.running.iter_mut().filter(|s| s.left() == 1) {
            let keep = s.draft().len().min(spare);
            s.cut_draft(keep);
            spare -= keep;
        }
    }

    /// Reserves room for what every running sequence computes next, oldest first,
    /// preempting from the newest end when blocks run out; then, once every sequence has its
    /// room, for the drafted tokens where blocks are still to be had (a draft without room is
    /// dropped: a draft never costs another sequence its place). Returns whether it
    /// preempted.
    fn make_room(&mut self, kv: &mut KvCache, plan: &mut StepPlan) -> bool {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            let ahead = s.left().min(self.policy.max_batch_tokens);
            let (id, len, request) = (s.id(), s.tokens().len(), s.request());
            // The window layers: only what this step may write.
            match kv.reserve_within(id, len, ahead) {
                Ok(()) => i += 1,
                Err(KvError::OutOfBlocks { .. }) if self.running.len() > 1 => {
                    self.preempt_last(kv, plan);
                    preempted = true;
                }
                Err(e) => {
                    self.fail(kv, plan, request, format!("KV cache: {e}"));
                    i = 0;
                }
            }
        }
        for s in &mut self.running {
            let drafted = s.draft().len();
            if drafted > 0 {
                let (id, len) = (s.id(), s.tokens().len());
                if kv.reserve_within(id, len + drafted, 1 + drafted).is_err() {
                    s.cut_draft(0);
                }
            }
        }
        preempted
    }

    /// Frees the most recently admitted running sequence's blocks and puts it back at the
    /// front of the queue, to be recomputed when admitted again.
    fn preempt_last(&mut self, kv: &mut KvCache, plan: &mut StepPlan) {
        if let Some(mut s) = self.running.pop() {
            retire(kv, &s, self.policy.prefix_caching);
            plan.events.push(PlanEvent::Preempted {
                request: s.request(),
                seq: s.id(),
            });
            s.preempted();
            self.waiting.push_front(s);
        }
    }

    fn fail(&mut self, kv: &mut KvCache, plan: &mut StepPlan, request: u64, message: String) {
        self.remove_request(kv, request);
        plan.events.push(PlanEvent::Failed { request, message });
    }

    /// Admits sequences from the front of the queue while this step has prompt rows for them
    /// (counted as if they took theirs first): blocks for the whole prompt (after what the
    /// prefix cache holds) reserved, with a block to spare for every running sequence.
    fn admit(&mut self, kv: &mut KvCache, budget: usize, plan: &mut StepPlan) {
        let mut room = budget;
        while room > 0 {
            let Some(front) = self.waiting.front() else {
                break;
            };
            let group = 1 + front.forks_pending();
            if !self.running.is_empty() && self.running.len() + group > self.policy.max_running {
                break;
            }
            let (id, request, len) = (front.id(), front.request(), front.tokens().len());
            if kv.free_states() < group {
                // A hybrid model's recurrent state: every sequence of the group needs its own.
                if self.running.is_empty() {
                    let message = format!(
                        "KV cache: the recurrent-state arena has room for {} more sequences, the request needs {group}",
                        kv.free_states()
                    );
                    self.fail(kv, plan, request, message);
                    continue;
                }
                break;
            }
            if let Err(e) = kv.add_sequence_for(id, self.policy.context) {
                self.fail(kv, plan, request, format!("KV cache: {e}"));
                continue;
            }
            let hit = if self.policy.prefix_caching {
                // The last token is always computed: its logits are needed.
                kv.attach_prefix(id, &front.tokens()[..len - 1])
                    .unwrap_or(0)
            } else {
                0
            };
            // Headroom: a block for every running sequence's next step, so admitting does
            // not force a preemption right away.
            let ahead = (len - hit).min(self.policy.max_batch_tokens);
            let crowded = !self.running.is_empty() && !kv.fits(id, len, ahead, self.running.len());
            if crowded {
                let _ = kv.remove_sequence(id);
                break;
            }
            if let Err(e) = kv.reserve_within(id, len, ahead) {
                let _ = kv.remove_sequence(id);
                if self.running.is_empty() {
                    // Alone it does not fit: it never will.
                    self.fail(kv, plan, request, format!("KV cache: {e}"));
                    continue;
                }
                break;
            }
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            s.admitted(hit);
            plan.events.push(PlanEvent::Admitted { request, hit });
            room -= s.left().min(room);
            self.running.push(s);
        }
    }
}
