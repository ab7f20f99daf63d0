//! The policy on a tiny KV cache, with no model: steps are planned, then "committed" the way
//! the loop commits them (computed positions advance and are published; a sequence whose
//! logits were computed gets a next token), so admission, chunking, prefix hits, preemption
//! and failures are checked step by step.

use rill_model::{KvCache, KvDtype, SeqId};

use super::{PlanEvent, Planned, Policy, Scheduled, Scheduler, StepPlan};

/// Positions per block in these tests.
const BLOCK: usize = 4;

#[derive(Debug, Clone)]
struct TestSeq {
    id: SeqId,
    request: u64,
    tokens: Vec<u32>,
    computed: usize,
    forks: usize,
    cached: usize,
    preemptions: usize,
    draft: Vec<u32>,
}

impl Scheduled for TestSeq {
    fn id(&self) -> SeqId {
        self.id
    }
    fn request(&self) -> u64 {
        self.request
    }
    fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    fn computed(&self) -> usize {
        self.computed
    }
    fn preempted(&mut self) {
        self.computed = 0;
        self.preemptions += 1;
    }
    fn admitted(&mut self, hit: usize) {
        self.computed = hit;
        self.cached = hit;
    }
    fn forks_pending(&self) -> usize {
        self.forks
    }
    fn draft(&self) -> &[u32] {
        &self.draft
    }
    fn cut_draft(&mut self, keep: usize) {
        self.draft.truncate(keep);
    }
}

fn seq(id: SeqId, prompt: Vec<u32>) -> TestSeq {
    TestSeq {
        id,
        request: id,
        tokens: prompt,
        computed: 0,
        forks: 0,
        cached: 0,
        preemptions: 0,
        draft: Vec::new(),
    }
}

/// `n` tokens, different for each `salt`.
fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| salt * 1000 + i).collect()
}

fn policy(max_batch_tokens: usize) -> Policy {
    Policy {
        max_batch_tokens,
        max_prefill_rows_while_decoding: 0,
        max_running: 8,
        context: 256,
        prefix_caching: true,
    }
}

/// A cache of `blocks` blocks of [`BLOCK`] positions (one layer, one tiny head).
fn cache(blocks: usize) -> KvCache {
    KvCache::new(1, 1, 4, blocks * BLOCK, BLOCK, KvDtype::F16).unwrap()
}

/// What the loop does after the forward pass, minus the model: positions computed and
/// published, a next token for every sequence that got logits.
fn commit(s: &mut Scheduler<TestSeq>, kv: &mut KvCache, plan: &StepPlan) {
    for &Planned {
        idx, rows, logits, ..
    } in &plan.parts
    {
        let q = &mut s.running[idx];
        q.computed += rows;
        kv.assume_written(q.id, q.computed).unwrap();
        kv.publish_prefix(q.id, &q.tokens[..q.computed]).unwrap();
        if logits.is_some() {
            let next = 9_000_000 + q.tokens.len() as u32;
            q.tokens.push(next);
        }
    }
}

/// (sequence, rows, decode) of each part of a plan.
fn parts(s: &Scheduler<TestSeq>, plan: &StepPlan) -> Vec<(SeqId, usize, bool)> {
    plan.parts
        .iter()
        .map(|p| (s.running[p.idx].id, p.rows, p.decode))
        .collect()
}

#[test]
fn a_long_prompt_is_read_in_chunks_then_decoded_one_row_a_step() {
    let mut kv = cache(16);
    let mut s = Scheduler::new(policy(8));
    s.waiting.push_back(seq(1, tokens(20, 1)));
    let mut plan = StepPlan::default();
    let mut reads = Vec::new();
    for _ in 0..3 {
        s.plan(&mut kv, false, &mut plan);
        reads.push(parts(&s, &plan));
        commit(&mut s, &mut kv, &plan);
    }
    assert_eq!(
        reads,
        [
            vec![(1, 8, false)],
            vec![(1, 8, false)],
            vec![(1, 4, false)]
        ]
    );
    // Only the prompt's last row asked for logits; then one decode row per step.
    assert_eq!(plan.batch.rows.iter().filter(|r| r.logits).count(), 1);
    s.plan(&mut kv, false, &mut plan);
    assert_eq!(parts(&s, &plan), [(1, 1, true)]);
    assert_eq!(plan.batch.rows[0].pos, 20);
    assert_eq!(plan.events, []);
}

#[test]
fn decode_rows_come_first_and_bound_the_prompt_rows_beside_them() {
    let mut kv = cache(32);
    let mut s = Scheduler::new(Policy {
        max_prefill_rows_while_decoding: 3,
        ..policy(16)
    });
    s.waiting.push_back(seq(1, tokens(5, 1)));
    let mut plan = StepPlan::default();
    s.plan(&mut kv, false, &mut plan);
    commit(&mut s, &mut kv, &plan);
    s.waiting.push_back(seq(2, tokens(10, 2)));
    s.plan(&mut kv, false, &mut plan);
    // Sequence 1 decodes; sequence 2 is admitted and reads only 3 rows beside it.
    assert_eq!(parts(&s, &plan), [(1, 1, true), (2, 3, false)]);
    assert_eq!(plan.events, [PlanEvent::Admitted { request: 2, hit: 0 }]);
    assert_eq!(plan.prefill_and_decode_rows(), (3, 1));
}

#[test]
fn a_prompt_sharing_published_blocks_starts_from_them() {
    let mut kv = cache(16);
    let mut s = Scheduler::new(policy(32));
    s.waiting.push_back(seq(1, tokens(10, 1)));
    let mut plan = StepPlan::default();
    s.plan(&mut kv, false, &mut plan);
    commit(&mut s, &mut kv, &plan);
    // The same first 8 tokens (two full blocks), then others.
    let mut p = tokens(8, 1);
    p.extend(tokens(5, 7));
    s.waiting.push_back(seq(2, p));
    s.plan(&mut kv, false, &mut plan);
    assert_eq!(plan.events, [PlanEvent::Admitted { request: 2, hit: 8 }]);
    assert_eq!(parts(&s, &plan), [(1, 1, true), (2, 5, false)]);
    assert_eq!(s.running[1].cached, 8);
    // A prompt found whole in the cache still computes its last token (for its logits).
    commit(&mut s, &mut kv, &plan);
    s.waiting.push_back(seq(3, tokens(8, 1)));
    s.plan(&mut kv, false, &mut plan);
    assert!(plan
        .events
        .contains(&PlanEvent::Admitted { request: 3, hit: 7 }));
    assert!(parts(&s, &plan).contains(&(3, 1, false)));
}

#[test]
fn admission_waits_for_room_and_for_the_running_limit() {
    let mut kv = cache(6);
    let mut s = Scheduler::new(Policy {
        max_running: 2,
        ..policy(64)
    });
    // 12 positions: three blocks each.
    for id in 1..=3 {
        s.waiting.push_back(seq(id, tokens(12, id as u32)));
    }
    let mut plan = StepPlan::default();
    s.plan(&mut kv, false, &mut plan);
    // The second does not fit beside the first with a block to spare for it.
    assert_eq!(parts(&s, &plan), [(1, 12, false)]);
    assert_eq!(s.waiting.len(), 2);
    // A group of choices is admitted together or not at all.
    let mut kv = cache(64);
    let mut s = Scheduler::new(Policy {
        max_running: 3,
        ..policy(64)
    });
    s.waiting.push_back(seq(1, tokens(4, 1)));
    let mut forked = seq(2, tokens(4, 2));
    forked.forks = 2;
    s.waiting.push_back(forked);
    s.plan(&mut kv, false, &mut plan);
    assert_eq!(parts(&s, &plan), [(1, 4, false)]);
    assert_eq!(s.waiting.front().map(|q| q.id), Some(2));
    // Nothing is admitted while closing.
    let mut s = Scheduler::new(policy(64));
    s.waiting.push_back(seq(1, tokens(4, 1)));
    s.plan(&mut kv, true, &mut plan);
    assert!(plan.batch.is_empty());
    assert_eq!(s.waiting.len(), 1);
}

#[test]
fn running_out_of_blocks_preempts_the_newest_which_resumes_later() {
    // Two sequences of 7 prompt tokens in 4 blocks: they grow into each other's room.
    let mut kv = cache(4);
    let mut s = Scheduler::new(policy(64));
    s.waiting.push_back(seq(1, tokens(3, 1)));
    s.waiting.push_back(seq(2, tokens(3, 2)));
    let mut plan = StepPlan::default();
    let mut preempted_at = None;
    for step in 0..12 {
        s.plan(&mut kv, false, &mut plan);
        if plan
            .events
            .iter()
            .any(|e| matches!(e, PlanEvent::Preempted { .. }))
        {
            assert_eq!(plan.events[0], PlanEvent::Preempted { request: 2, seq: 2 });
            // No admission in a step that had to preempt.
            assert!(!plan
                .events
                .iter()
                .any(|e| matches!(e, PlanEvent::Admitted { .. })));
            assert_eq!(s.running.len(), 1);
            let waiting = &s.waiting[0];
            assert_eq!((waiting.id, waiting.computed), (2, 0));
            assert!(!kv.has_sequence(2), "a preempted sequence holds no blocks");
            preempted_at = Some(step);
            break;
        }
        commit(&mut s, &mut kv, &plan);
    }
    assert!(preempted_at.is_some(), "nobody was preempted");
    // The survivor finishes (it leaves), and the preempted one is admitted again with its
    // published blocks as a prefix hit.
    commit(&mut s, &mut kv, &plan);
    let survivor = s.running.remove(0);
    super::retire(&mut kv, &survivor, true);
    s.plan(&mut kv, false, &mut plan);
    let readmitted = plan.events.iter().find_map(|e| match e {
        PlanEvent::Admitted { request: 2, hit } => Some(*hit),
        _ => None,
    });
    assert!(readmitted.is_some_and(|hit| hit >= BLOCK), "{plan:?}");
    assert_eq!(s.running[0].preemptions, 1);
}

#[test]
fn a_sequence_that_can_never_fit_fails_alone_and_takes_its_request_with_it() {
    let mut kv = cache(2);
    let mut s = Scheduler::new(policy(64));
    let mut big = seq(1, tokens(12, 1));
    big.request = 5;
    s.waiting.push_back(big);
    let mut sibling = seq(2, tokens(3, 1));
    sibling.request = 5;
    s.waiting.push_back(sibling);
    s.waiting.push_back(seq(3, tokens(3, 3)));
    let mut plan = StepPlan::default();
    s.plan(&mut kv, false, &mut plan);
    assert!(matches!(
        &plan.events[0],
        PlanEvent::Failed { request: 5, message } if message.starts_with("KV cache")
    ));
    // Both sequences of request 5 are gone; the next request runs.
    assert_eq!(parts(&s, &plan), [(3, 3, false)]);
    assert!(s.waiting.is_empty());
    assert_eq!(kv.used_blocks(), 1);
}

#[test]
fn removing_a_request_frees_its_running_blocks_and_forgets_its_waiting_ones() {
    let mut kv = cache(16);
    let mut s = Scheduler::new(policy(64));
    s.waiting.push_back(seq(1, tokens(6, 1)));
    let mut plan = StepPlan::default();
    s.plan(&mut kv, false, &mut plan);
    commit(&mut s, &mut kv, &plan);
    let mut other = seq(2, tokens(5, 2));
    other.request = 1;
    s.waiting.push_back(other);
    assert!(kv.used_blocks() > 0);
    s.remove_request(&mut kv, 1);
    assert!(s.is_idle());
    assert_eq!(kv.used_blocks(), 0);
    // Its computed blocks stay in the prefix cache.
    assert!(kv.idle_cached_blocks() >= 1);
}

/// A hybrid model's recurrent state: a request is admitted only when every sequence of it
/// (its choices included) has a state; others wait for one, and a request that could never
/// have them fails with a message saying so.
#[test]
fn admission_waits_for_recurrent_states_and_fails_what_never_fits() {
    let shape = rill_model::RecurrentShape {
        layers: vec![rill_model::LayerState { conv: 3, ssm: 8 }],
    };
    let mut kv = cache(64).with_recurrent_state(shape, 2, 0).unwrap();
    let mut s = Scheduler::new(policy(64));
    for id in 1..=3 {
        s.waiting.push_back(seq(id, tokens(6, id as u32)));
    }
    let mut plan = StepPlan::default();
    s.plan(&mut kv, false, &mut plan);
    // Two states: two admitted, the third waits.
    assert_eq!(s.running.len(), 2);
    assert_eq!(s.waiting.len(), 1);
    assert_eq!(kv.free_states(), 0);
    commit(&mut s, &mut kv, &plan);
    // One ends: the third gets its state.
    let done = s.running.remove(0);
    kv.remove_sequence(done.id).unwrap();
    s.plan(&mut kv, false, &mut plan);
    assert_eq!(s.running.len(), 2);
    assert!(s.waiting.is_empty());
    for q in s.running.drain(..) {
        kv.remove_sequence(q.id).unwrap();
    }
    // Three choices of one request, with nothing running: never room for them.
    let mut wide = seq(9, tokens(6, 9));
    wide.forks = 2;
    s.waiting.push_back(wide);
    s.plan(&mut kv, false, &mut plan);
    assert!(s.running.is_empty() && s.waiting.is_empty());
    assert!(
        plan.events.iter().any(|e| matches!(e, PlanEvent::Failed { request: 9, message }
            if message.contains("recurrent-state arena has room for 2 more sequences, the request needs 3"))),
        "{:?}",
        plan.events
    );
    assert_eq!(kv.free_states(), 2);
}

/// Prompts of `lens` read until every sequence decodes, on a cache of `blocks` blocks with a
/// step budget of `batch` rows.
fn decoding(blocks: usize, batch: usize, lens: &[usize]) -> (KvCache, Scheduler<TestSeq>) {
    let mut kv = cache(blocks);
    let mut s = Scheduler::new(policy(batch));
    for (i, &n) in lens.iter().enumerate() {
        s.waiting
            .push_back(seq(i as SeqId, tokens(n, i as u32 + 1)));
    }
    let mut plan = StepPlan::default();
    while s.running.len() < lens.len() || s.running.iter().any(|q| q.left() > 1) {
        s.plan(&mut kv, false, &mut plan);
        commit(&mut s, &mut kv, &plan);
    }
    (kv, s)
}

/// Two sequences decoding, each with a draft: the drafts take only the rows the budget has
/// beyond both decode rows (oldest first) and the rows a prompt would take, and a draft the
/// cache has no room for once every sequence has its own is dropped rather than another
/// sequence preempted.
#[test]
fn drafts_take_spare_rows_and_free_blocks_only() {
    let mut plan = StepPlan::default();
    let (mut kv, mut s) = decoding(6, 4, &[5, 5]);
    for q in &mut s.running {
        q.draft = vec![7, 8, 9];
    }
    s.plan(&mut kv, false, &mut plan);
    let drafted: Vec<usize> = plan.parts.iter().map(|p| p.drafted).collect();
    assert_eq!(drafted, [2, 0], "{:?}", plan.parts);
    assert_eq!(plan.batch.len(), 4);
    assert!(plan.events.is_empty(), "{:?}", plan.events);

    // A prompt in the queue: its rows are not spare; it is admitted and read beside the
    // decode rows, and no draft runs.
    let (mut kv, mut s) = decoding(8, 4, &[5, 5]);
    for q in &mut s.running {
        q.draft = vec![7, 8, 9];
    }
    s.waiting.push_back(seq(2, tokens(5, 3)));
    s.plan(&mut kv, false, &mut plan);
    let drafted: Vec<usize> = plan.parts.iter().map(|p| p.drafted).collect();
    assert_eq!(drafted, [0, 0, 0], "{:?}", plan.parts);
    assert_eq!(
        parts(&s, &plan),
        [(0, 1, true), (1, 1, true), (2, 2, false)]
    );

    // The older sequence's draft would take the last free block, which the newer one needs
    // for its own next row: the draft is dropped, nobody preempted.
    let (mut kv, mut s) = decoding(5, 16, &[6, 8]);
    assert_eq!(kv.free_blocks(), 1);
    s.running[0].draft = vec![7, 8];
    s.plan(&mut kv, false, &mut plan);
    assert!(plan.events.is_empty(), "{:?}", plan.events);
    assert_eq!(parts(&s, &plan), [(0, 1, true), (1, 1, true)]);
    assert_eq!(plan.parts[0].drafted, 0);
}
