//! Beam search on tiny synthetic models with a six-token vocabulary, checked against searches
//! recomputed here from independent forward passes: one fresh cache and one pass per prefix,
//! no forks, no batching. Batch invariance makes a row's logits independent of its batch and of
//! how its cache was built, so scores are compared for exact equality.

use std::collections::HashMap;
use std::path::PathBuf;

use rill_engine::{
    beam_score, beam_search, BeamError, BeamFinish, BeamOutput, BeamParams, BeamStop,
    EarlyStopping, Engine, NodeStatus, Precision,
};
use rill_gguf::{GgmlType, Value};
use rill_model::synthetic::{SyntheticModel, SyntheticSpec};
use rill_model::{Batch, KvCache, KvDtype, ModelError};

/// Vocabulary: `a` to `e`, then the end-of-generation token.
const V: usize = 6;
const EOS: u32 = 5;

/// A llama_tiny with F32 weights and its vocabulary cut to [`V`] tokens, its output head scaled
/// by `head_scale` (below 1: flatter next-token distributions).
fn small_vocab(seed: u64, head_scale: f32) -> SyntheticModel {
    let mut spec = SyntheticSpec::llama_tiny();
    spec.weight_type = GgmlType::F32;
    spec.seed = seed;
    let mut m = spec.build().unwrap();
    for name in ["token_embd.weight", "output.weight"] {
        let t = m.tensor_mut(name).unwrap();
        let row_bytes = t.data.len() / t.dims[1] as usize;
        t.data.truncate(V * row_bytes);
        t.dims[1] = V as u64;
    }
    let head = m.tensor_mut("output.weight").unwrap();
    for w in head.data.chunks_exact_mut(4) {
        let v = f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * head_scale;
        w.copy_from_slice(&v.to_le_bytes());
    }
    m.set_metadata("llama.vocab_size", Value::U32(V as u32));
    let mut tokens: Vec<Value> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|s| Value::String(s.to_string()))
        .collect();
    tokens.push(Value::String("<|im_end|>".into()));
    let mut types = vec![Value::I32(1); V - 1];
    types.push(Value::I32(3));
    m.set_metadata("tokenizer.ggml.tokens", Value::Array(tokens));
    m.set_metadata("tokenizer.ggml.token_type", Value::Array(types));
    m.set_metadata("tokenizer.ggml.eos_token_id", Value::U32(EOS));
    m
}

fn engine_of(model: &SyntheticModel) -> Engine {
    engine_with(model, Precision::Exact)
}

fn engine_with(model: &SyntheticModel, precision: Precision) -> Engine {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path: PathBuf =
        std::env::temp_dir().join(format!("rill-beam-{}-{n}.gguf", std::process::id()));
    model.write_to_path(&path).unwrap();
    let engine = Engine::load(&path, 2, precision).unwrap();
    std::fs::remove_file(path).unwrap();
    assert_eq!(engine.model.config().vocab_size, V);
    assert!(engine.tokenizer.is_end_of_generation(EOS));
    assert!((0..EOS).all(|t| !engine.tokenizer.is_end_of_generation(t)));
    engine
}

fn engine(seed: u64) -> Engine {
    engine_of(&small_vocab(seed, 1.0))
}

fn params(width: usize, max_tokens: usize, length_penalty: f64) -> BeamParams {
    BeamParams {
        width,
        max_tokens,
        length_penalty,
        ..BeamParams::default()
    }
}

/// A cache for `engine` with `blocks` blocks of 16 positions.
fn cache(engine: &Engine, blocks: usize) -> KvCache {
    engine
        .model
        .new_kv_cache(blocks * 16, engine.precision)
        .unwrap()
}

fn run(engine: &mut Engine, prompt: &[u32], p: &BeamParams) -> BeamOutput {
    let context = engine.model.config().context_length;
    let mut kv = cache(engine, p.kv_blocks_needed(prompt.len(), context, 16).max(8));
    let out = beam_search(engine, &mut kv, prompt, p, |_| true).unwrap();
    assert_eq!(
        kv.free_blocks(),
        kv.total_blocks(),
        "the search leaked blocks"
    );
    out
}

// ---------------------------------------------------------------------------------------------
// Independent forward passes.

/// Log-probabilities of the next token after `prompt + generated`, each prefix computed alone
/// in a fresh cache (memoized).
struct Oracle<'a> {
    engine: &'a mut Engine,
    prompt: Vec<u32>,
    memo: HashMap<Vec<u32>, Vec<f32>>,
}

impl<'a> Oracle<'a> {
    fn new(engine: &'a mut Engine, prompt: &[u32]) -> Oracle<'a> {
        Oracle {
            engine,
            prompt: prompt.to_vec(),
            memo: HashMap::new(),
        }
    }

    fn logprobs(&mut self, generated: &[u32]) -> Vec<f32> {
        if let Some(lp) = self.memo.get(generated) {
            return lp.clone();
        }
        let seq = [self.prompt.as_slice(), generated].concat();
        let e = &mut *self.engine;
        let mut kv = e.model.new_kv_cache(seq.len(), e.precision).unwrap();
        kv.add_sequence(7).unwrap();
        let mut logits = Vec::new();
        e.model
            .forward(
                &Batch::prompt(7, &seq, 0, false),
                &mut kv,
                e.precision,
                &mut logits,
            )
            .unwrap();
        let norm = rill_kernels::ops::log_normalizer(&logits);
        let lp: Vec<f32> = logits.iter().map(|&l| l - norm).collect();
        self.memo.insert(generated.to_vec(), lp.clone());
        lp
    }
}

/// A hypothesis as the tests compare them.
#[derive(Debug, Clone, PartialEq)]
struct Hyp {
    tokens: Vec<u32>,
    cumulative: f64,
    score: f64,
    finish: BeamFinish,
}

fn hyps(out: &BeamOutput) -> Vec<Hyp> {
    out.hypotheses
        .iter()
        .map(|h| Hyp {
            tokens: h.tokens.clone(),
            cumulative: h.cumulative_logprob,
            score: h.score,
            finish: h.finish_reason,
        })
        .collect()
}

/// Every sequence of at most `max_tokens` tokens (ending at the first EOS), scored.
fn exhaustive(o: &mut Oracle, max_tokens: usize, alpha: f64) -> Vec<Hyp> {
    let mut all = Vec::new();
    let mut frontier = vec![(Vec::<u32>::new(), 0.0f64)];
    while let Some((prefix, cum)) = frontier.pop() {
        let lp = o.logprobs(&prefix);
        for t in 0..V as u32 {
            let mut tokens = prefix.clone();
            tokens.push(t);
            let cumulative = cum + f64::from(lp[t as usize]);
            let score = cumulative / (tokens.len() as f64).powf(alpha);
            if t == EOS || tokens.len() == max_tokens {
                let finish = if t == EOS {
                    BeamFinish::Stop
                } else {
                    BeamFinish::Length
                };
                all.push(Hyp {
                    tokens,
                    cumulative,
                    score,
                    finish,
                });
            } else {
                frontier.push((tokens, cumulative));
            }
        }
    }
    all.sort_by(|a, b| b.score.partial_cmp(&a.score).unwrap());
    for w in all.windows(2) {
        assert_ne!(
            w[0].score, w[1].score,
            "a tie would make the order ambiguous"
        );
    }
    all
}

/// What the reference expects of a search: hypotheses best first, every node's (parent, token,
/// cumulative log-prob, score, status) in id order, and why it stopped.
struct Expected {
    hyps: Vec<Hyp>,
    nodes: Vec<(Option<usize>, u32, f64, f64, NodeStatus)>,
    stop: BeamStop,
}

/// Beam search done by hand, step by step, from the oracle's log-probabilities, following the
/// rules as documented (transformers' `BeamSearchScorer`).
fn reference_search(o: &mut Oracle, p: &BeamParams) -> Expected {
    let (w, alpha) = (p.width, p.length_penalty);
    // (tokens, cumulative, node)
    let mut running: Vec<(Vec<u32>, f64, Option<usize>)> = vec![(vec![], 0.0, None)];
    // (hyp, node)
    let mut finished: Vec<(Hyp, usize)> = Vec::new();
    let mut nodes = Vec::new();
    // Enters if the set has room or it beats the worst (equal scores: the earlier node stays).
    fn offer(finished: &mut Vec<(Hyp, usize)>, w: usize, h: Hyp, node: usize) -> bool {
        if finished.len() == w {
            let worst = (0..w)
                .min_by(|&i, &j| {
                    let (a, b) = (&finished[i], &finished[j]);
                    a.0.score
                        .partial_cmp(&b.0.score)
                        .unwrap()
                        .then(b.1.cmp(&a.1))
                })
                .unwrap();
            if h.score <= finished[worst].0.score {
                return false;
            }
            finished.remove(worst);
        }
        finished.push((h, node));
        true
    }
    let mut step = 0;
    let stop = loop {
        let len = step + 1;
        // (cumulative, token, beam, token logprob)
        let mut cands: Vec<(f64, u32, usize)> = Vec::new();
        for (b, (tokens, cum, _)) in running.iter().enumerate() {
            let lp = o.logprobs(tokens);
            let mut ids: Vec<u32> = (0..V as u32).collect();
            ids.sort_by(|&x, &y| {
                lp[y as usize]
                    .partial_cmp(&lp[x as usize])
                    .unwrap()
                    .then(x.cmp(&y))
            });
            for &t in ids.iter().take(2 * w) {
                cands.push((cum + f64::from(lp[t as usize]), t, b));
            }
        }
        cands.sort_by(|x, y| {
            y.0.partial_cmp(&x.0)
                .unwrap()
                .then(x.1.cmp(&y.1))
                .then(x.2.cmp(&y.2))
        });
        let mut next: Vec<(Vec<u32>, f64, Option<usize>)> = Vec::new();
        for (rank, &(cum, t, b)) in cands.iter().enumerate() {
            let id = nodes.len();
            let score = cum / (len as f64).powf(alpha);
            let mut tokens = running[b].0.clone();
            tokens.push(t);
            let status = if next.len() == w {
                NodeStatus::Pruned
            } else if t == EOS {
                let h = Hyp {
                    tokens,
                    cumulative: cum,
                    score,
                    finish: BeamFinish::Stop,
                };
                if rank < w && offer(&mut finished, w, h, id) {
                    NodeStatus::Finished
                } else {
                    NodeStatus::Pruned
                }
            } else {
                next.push((tokens, cum, Some(id)));
                NodeStatus::Kept
            };
            nodes.push((running[b].2, t, cum, score, status));
        }
        let best_now = next.first().map(|b| b.1 / (len as f64).powf(alpha));
        let best_ever = next.first().map(|b| {
            let longest = if alpha > 0.0 { p.max_tokens } else { len };
            b.1 / (longest as f64).powf(alpha)
        });
        let worst = finished
            .iter()
            .map(|f| f.0.score)
            .fold(f64::INFINITY, f64::min);
        let done = finished.len() == w
            && match p.early_stopping {
                EarlyStopping::Finished => true,
                EarlyStopping::Heuristic => best_now.is_none_or(|b| worst >= b),
                EarlyStopping::Never => best_ever.is_none_or(|b| worst >= b),
            };
        step += 1;
        if done {
            break BeamStop::Done;
        }
        if next.is_empty() {
            break BeamStop::Exhausted;
        }
        if len == p.max_tokens {
            for (tokens, cum, node) in next {
                let score = cum / (len as f64).powf(alpha);
                let h = Hyp {
                    tokens,
                    cumulative: cum,
                    score,
                    finish: BeamFinish::Length,
                };
                offer(&mut finished, w, h, node.unwrap());
            }
            break BeamStop::Length;
        }
        running = next;
    };
    finished.sort_by(|a, b| {
        b.0.score
            .partial_cmp(&a.0.score)
            .unwrap()
            .then(a.1.cmp(&b.1))
    });
    Expected {
        hyps: finished.into_iter().map(|f| f.0).collect(),
        nodes,
        stop,
    }
}

fn assert_matches_reference(out: &BeamOutput, want: &Expected, what: &str) {
    assert_eq!(hyps(out), want.hyps, "{what}: hypotheses");
    let got: Vec<_> = out
        .trace
        .nodes
        .iter()
        .map(|n| (n.parent, n.token, n.cumulative_logprob, n.score, n.status))
        .collect();
    assert_eq!(got, want.nodes, "{what}: trace");
    assert_eq!(out.stop, want.stop, "{what}: stop");
}

const PROMPTS: [&[u32]; 4] = [&[0, 1, 2], &[3], &[4, 4, 0, 1, 3, 2, 2], &[1, 0]];

// ---------------------------------------------------------------------------------------------
// Tests.

#[test]
fn a_width_covering_every_sequence_equals_exhaustive_search() {
    let mut e = engine(11);
    for prompt in PROMPTS {
        for alpha in [1.0, 0.0, 2.0, -0.5] {
            let all = exhaustive(&mut Oracle::new(&mut e, prompt), 3, alpha);
            // 1 + 5 + 25 sequences ending in EOS, 125 of three tokens.
            assert_eq!(all.len(), 156);
            // Wide enough that nothing is ever pruned: every sequence comes back, in order.
            let out = run(&mut e, prompt, &params(216, 3, alpha));
            let what = format!("prompt {prompt:?}, alpha {alpha}");
            assert_eq!(hyps(&out), all, "{what}");
            assert_eq!(out.stop, BeamStop::Length);
            assert_eq!(out.trace.nodes.len(), 6 + 30 + 150);
            // V^2 beams prune, yet no prefix of a best sequence is lost: the top 36 agree.
            let out = run(&mut e, prompt, &params(36, 3, alpha));
            assert_eq!(hyps(&out), all[..36], "{what}, width 36");
        }
    }
}

#[test]
fn width_two_follows_the_hand_computed_search() {
    let mut coverage = HashMap::<&str, usize>::new();
    for (seed, head, precision) in [
        (11, 1.0, Precision::Exact),
        (12, 1.0, Precision::Exact),
        (13, 0.3, Precision::Exact),
        (14, 0.5, Precision::Fast),
    ] {
        let mut e = engine_with(&small_vocab(seed, head), precision);
        for prompt in PROMPTS {
            for alpha in [1.0, 0.0, 1.5] {
                for es in [
                    EarlyStopping::Heuristic,
                    EarlyStopping::Finished,
                    EarlyStopping::Never,
                ] {
                    let p = BeamParams {
                        early_stopping: es,
                        ..params(2, 6, alpha)
                    };
                    let want = reference_search(&mut Oracle::new(&mut e, prompt), &p);
                    let out = run(&mut e, prompt, &p);
                    let what = format!("seed {seed}, prompt {prompt:?}, alpha {alpha}, {es:?}");
                    assert_matches_reference(&out, &want, &what);
                    // What the cases exercised.
                    let n = &out.trace.nodes;
                    for (key, hit) in [
                        (
                            "eos finished",
                            n.iter().any(|n| n.status == NodeStatus::Finished),
                        ),
                        (
                            "eos pruned",
                            n.iter()
                                .any(|n| n.token == EOS && n.status == NodeStatus::Pruned),
                        ),
                        ("early stop", out.stop == BeamStop::Done),
                        ("length", out.stop == BeamStop::Length),
                        (
                            "mixed result",
                            out.hypotheses
                                .iter()
                                .any(|h| h.finish_reason == BeamFinish::Stop)
                                && out
                                    .hypotheses
                                    .iter()
                                    .any(|h| h.finish_reason == BeamFinish::Length),
                        ),
                    ] {
                        *coverage.entry(key).or_default() += usize::from(hit);
                    }
                }
            }
        }
    }
    eprintln!("coverage: {coverage:?}");
    for key in [
        "eos finished",
        "eos pruned",
        "early stop",
        "length",
        "mixed result",
    ] {
        assert!(
            coverage.get(key).copied().unwrap_or(0) > 0,
            "no case with {key}"
        );
    }
}

#[test]
fn width_one_is_greedy_decoding() {
    let mut reasons = Vec::new();
    for (seed, head) in [(11, 1.0), (12, 1.0), (13, 0.3), (14, 0.3)] {
        let mut e = engine_of(&small_vocab(seed, head));
        for prompt in PROMPTS {
            // Greedy, one independent pass per token: argmax (lowest id on ties) until EOS.
            let mut o = Oracle::new(&mut e, prompt);
            let (mut tokens, mut cum) = (Vec::new(), 0.0f64);
            let finish = loop {
                let lp = o.logprobs(&tokens);
                let best = (0..V).fold(0, |b, t| if lp[t] > lp[b] { t } else { b });
                tokens.push(best as u32);
                cum += f64::from(lp[best]);
                if best as u32 == EOS {
                    break BeamFinish::Stop;
                }
                if tokens.len() == 8 {
                    break BeamFinish::Length;
                }
            };
            for alpha in [1.0, 0.0, -1.0] {
                let out = run(&mut e, prompt, &params(1, 8, alpha));
                assert_eq!(out.hypotheses.len(), 1);
                let h = &out.hypotheses[0];
                let what = format!("seed {seed}, prompt {prompt:?}, alpha {alpha}");
                assert_eq!(h.tokens, tokens, "{what}");
                assert_eq!(h.cumulative_logprob, cum, "{what}");
                assert_eq!(h.score, beam_score(cum, tokens.len(), alpha), "{what}");
                assert_eq!(h.finish_reason, finish, "{what}");
            }
            reasons.push(finish);
        }
    }
    assert!(reasons.contains(&BeamFinish::Stop) && reasons.contains(&BeamFinish::Length));
}

#[test]
fn the_cache_is_shared_batched_and_left_empty() {
    let mut e = engine(12);
    // A 40-token prompt: two full blocks and a partial one, shared by every beam.
    let prompt: Vec<u32> = (0..40).map(|i| (i * 3 % 5) as u32).collect();
    let p = BeamParams {
        ignore_eos: true,
        ..params(4, 5, 1.0)
    };
    let mut kv = cache(&e, 64);
    // Someone else's sequence in the same cache is left alone.
    kv.add_sequence(3).unwrap();
    let mut logits = Vec::new();
    e.model
        .forward(
            &Batch::prompt(3, &[1, 2, 3], 0, false),
            &mut kv,
            e.precision,
            &mut logits,
        )
        .unwrap();
    let free = kv.free_blocks();
    let mut held = Vec::new();
    let out = beam_search(&mut e, &mut kv, &prompt, &p, |s| {
        held.push(s.kv_blocks);
        assert!(s.running.len() <= 4);
        true
    })
    .unwrap();
    assert_eq!(kv.free_blocks(), free);
    assert_eq!(kv.seq_len(3).unwrap(), 3);
    assert!(kv.has_sequence(3));
    assert_eq!(out.stop, BeamStop::Length);
    assert_eq!(out.steps, 5);
    // One pass for the prompt, one batched pass per step but the last.
    assert_eq!(out.forward_passes, 5);
    // The prompt's three blocks are held once: four beams of 44 positions without sharing
    // would need 12 blocks; shared, at most 2 + 4 copies of the partial block.
    assert!(out.peak_kv_blocks <= 6, "peak {}", out.peak_kv_blocks);
    assert!(out.peak_kv_blocks <= p.kv_blocks_needed(40, 256, 16));
    assert_eq!(held[0], 3);
    // Every hypothesis equals its sequence computed alone.
    let mut o = Oracle::new(&mut e, &prompt);
    for h in &out.hypotheses {
        let mut cum = 0.0;
        for i in 0..h.tokens.len() {
            cum += f64::from(o.logprobs(&h.tokens[..i])[h.tokens[i] as usize]);
        }
        assert_eq!(h.cumulative_logprob, cum);
        assert_eq!(h.score, beam_score(cum, h.tokens.len(), 1.0));
    }
    // The convenience method sizes a cache of its own and gives the same result.
    let again = e.beam_search(&prompt, &p, |_| true).unwrap();
    assert_eq!(hyps(&again), hyps(&out));
}

#[test]
fn early_stopping_modes_stop_in_order_and_never_do_worse() {
    let mut checked = 0;
    for seed in [11, 12, 13] {
        let mut e = engine(seed);
        for prompt in PROMPTS {
            let mut outs = Vec::new();
            for es in [
                EarlyStopping::Finished,
                EarlyStopping::Heuristic,
                EarlyStopping::Never,
            ] {
                let p = BeamParams {
                    early_stopping: es,
                    ..params(2, 10, 1.0)
                };
                // The last step, seen through the callback: the finished count and the best
                // running beam's (cumulative log-prob, score).
                let mut last = None;
                let mut kv = cache(&e, 64);
                let out = beam_search(&mut e, &mut kv, prompt, &p, |s| {
                    let best = s.running.first().map(|b| (b.cumulative_logprob, b.score));
                    last = Some((s.finished, best));
                    true
                })
                .unwrap();
                let (finished, best_running) = last.unwrap();
                let worst = out
                    .hypotheses
                    .iter()
                    .map(|h| h.score)
                    .fold(f64::MAX, f64::min);
                if out.stop == BeamStop::Done {
                    assert_eq!(finished, 2);
                    assert!(out
                        .hypotheses
                        .iter()
                        .all(|h| h.finish_reason == BeamFinish::Stop));
                    // The rule that fired holds for the best running beam.
                    let ok = best_running.is_none_or(|(cum, now)| match es {
                        EarlyStopping::Finished => true,
                        EarlyStopping::Heuristic => worst >= now,
                        EarlyStopping::Never => worst >= beam_score(cum, 10, 1.0),
                    });
                    assert!(ok, "{es:?}: {worst} vs {best_running:?}");
                } else {
                    assert_eq!(out.stop, BeamStop::Length);
                }
                outs.push(out);
            }
            // Each rule runs at least as long as the previous one, along the same trace...
            for pair in outs.windows(2) {
                let (a, b) = (&pair[0], &pair[1]);
                assert!(a.steps <= b.steps);
                assert_eq!(a.trace.nodes[..], b.trace.nodes[..a.trace.nodes.len()]);
                // ...and its k-th best score is at least as good.
                if a.stop == BeamStop::Done {
                    checked += 1;
                    for (x, y) in a.hypotheses.iter().zip(&b.hypotheses) {
                        assert!(y.score >= x.score);
                    }
                }
            }
        }
    }
    assert!(checked > 0, "no early stop happened");
}

#[test]
fn the_length_penalty_moves_the_best_length() {
    // A flatter head, so that stopping at once (EOS first) is a contender.
    let mut e = engine_of(&small_vocab(13, 0.3));
    for prompt in PROMPTS {
        let mut best_lengths = Vec::new();
        let mut orders = Vec::new();
        for alpha in [-3.0, -1.0, 0.0, 1.0, 2.0, 4.0] {
            let out = run(&mut e, prompt, &params(216, 3, alpha));
            // The ranking is by cumulative log-probability / length^alpha...
            for h in &out.hypotheses {
                assert_eq!(
                    h.score,
                    beam_score(h.cumulative_logprob, h.tokens.len(), alpha)
                );
            }
            for w in out.hypotheses.windows(2) {
                assert!(w[0].score >= w[1].score);
            }
            best_lengths.push(out.hypotheses[0].tokens.len());
            orders.push(
                out.hypotheses
                    .iter()
                    .map(|h| h.tokens.clone())
                    .collect::<Vec<_>>(),
            );
        }
        // ...so a larger alpha never prefers a shorter best sequence, and the extremes differ.
        assert!(
            best_lengths.windows(2).all(|w| w[0] <= w[1]),
            "{prompt:?}: {best_lengths:?}"
        );
        assert!(
            best_lengths[0] < best_lengths[5],
            "{prompt:?}: {best_lengths:?}"
        );
        // With alpha 0 the order is the cumulative log-probability's.
        assert_ne!(orders[2], orders[3]);
    }
}

#[test]
fn cancelling_keeps_the_running_beams_and_frees_the_cache() {
    let mut e = engine(11);
    let p = BeamParams {
        ignore_eos: true,
        ..params(3, 20, 1.0)
    };
    let mut kv = cache(&e, 64);
    let out = beam_search(&mut e, &mut kv, &[0, 1], &p, |s| s.step < 2).unwrap();
    assert_eq!(kv.free_blocks(), kv.total_blocks());
    assert_eq!(out.stop, BeamStop::Cancelled);
    assert_eq!(out.steps, 3);
    assert_eq!(out.hypotheses.len(), 3);
    for h in &out.hypotheses {
        assert_eq!(h.finish_reason, BeamFinish::Cancelled);
        assert_eq!(h.tokens.len(), 3);
        assert_eq!(out.trace.nodes[h.node].status, NodeStatus::Kept);
    }
}

#[test]
fn the_trace_is_a_tree_of_every_proposal() {
    let mut e = engine(12);
    let out = run(&mut e, &[2, 3], &params(3, 6, 1.0));
    let nodes = &out.trace.nodes;
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n.id, i);
        match n.parent {
            None => assert_eq!(n.step, 0),
            Some(p) => {
                assert!(p < i);
                assert_eq!(nodes[p].step + 1, n.step);
                assert_eq!(nodes[p].status, NodeStatus::Kept);
                assert_eq!(
                    n.cumulative_logprob,
                    nodes[p].cumulative_logprob + f64::from(n.token_logprob)
                );
            }
        }
        assert_eq!(n.score, beam_score(n.cumulative_logprob, n.step + 1, 1.0));
        assert_eq!(n.text, e.tokenizer.decode_with(&[n.token], true));
    }
    // Each step: at most 2·width proposals per beam, at most width kept.
    for step in 0..out.steps {
        let at: Vec<_> = nodes.iter().filter(|n| n.step == step).collect();
        assert!(at.iter().filter(|n| n.status == NodeStatus::Kept).count() <= 3);
        assert!(at.windows(2).all(|w| w[0].rank + 1 == w[1].rank));
    }
    // A hypothesis is the path to its node.
    for h in &out.hypotheses {
        let mut path = Vec::new();
        let mut at = Some(h.node);
        while let Some(i) = at {
            path.push(nodes[i].token);
            at = nodes[i].parent;
        }
        path.reverse();
        assert_eq!(path, h.tokens);
        let letters: String = h
            .tokens
            .iter()
            .filter(|&&t| t != EOS)
            .map(|&t| (b'a' + t as u8) as char)
            .collect();
        assert_eq!(h.text, letters);
    }
    // Without a trace the result is the same.
    let quiet = run(
        &mut e,
        &[2, 3],
        &BeamParams {
            trace: false,
            ..params(3, 6, 1.0)
        },
    );
    assert!(quiet.trace.nodes.is_empty());
    assert_eq!(hyps(&quiet), hyps(&out));
    fn serializable<T: serde::Serialize>(_: &T) {}
    serializable(&out);
}

#[test]
fn bad_requests_are_typed_errors_that_change_nothing() {
    let mut e = engine(11);
    let mut kv = cache(&e, 8);
    fn go(e: &mut Engine, kv: &mut KvCache, prompt: &[u32], p: BeamParams) -> BeamError {
        let r = beam_search(e, kv, prompt, &p, |_| true);
        assert_eq!(kv.free_blocks(), kv.total_blocks());
        r.unwrap_err()
    }
    let ok = params(2, 4, 1.0);
    assert!(matches!(
        go(
            &mut e,
            &mut kv,
            &[1],
            BeamParams {
                width: 0,
                ..ok.clone()
            }
        ),
        BeamError::BadWidth { width: 0, .. }
    ));
    assert!(matches!(
        go(
            &mut e,
            &mut kv,
            &[1],
            BeamParams {
                width: 100_000,
                ..ok.clone()
            }
        ),
        BeamError::BadWidth { .. }
    ));
    for alpha in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert!(matches!(
            go(
                &mut e,
                &mut kv,
                &[1],
                BeamParams {
                    length_penalty: alpha,
                    ..ok.clone()
                }
            ),
            BeamError::BadLengthPenalty(_)
        ));
    }
    assert!(matches!(
        go(
            &mut e,
            &mut kv,
            &[1],
            BeamParams {
                max_tokens: 0,
                ..ok.clone()
            }
        ),
        BeamError::NoTokens
    ));
    assert!(matches!(
        go(&mut e, &mut kv, &[], ok.clone()),
        BeamError::EmptyPrompt
    ));
    assert!(matches!(
        go(&mut e, &mut kv, &[1, 6], ok.clone()),
        BeamError::TokenOutOfRange {
            token: 6,
            index: 1,
            vocab_size: V
        }
    ));
    let long = vec![1u32; 257];
    assert!(matches!(
        go(&mut e, &mut kv, &long, ok.clone()),
        BeamError::PromptTooLong {
            prompt: 257,
            context: 256
        }
    ));
    // Eight blocks of 16: a 100-token prompt shares six full blocks, and each of four beams may
    // need one of its own: ten.
    let prompt = vec![2u32; 100];
    let wide = BeamParams {
        width: 4,
        ..ok.clone()
    };
    assert!(matches!(
        go(&mut e, &mut kv, &prompt, wide),
        BeamError::CacheTooSmall {
            width: 4,
            needed: 10,
            free: 8,
            total: 8
        }
    ));
    // A cache of another shape.
    let mut other = KvCache::new(1, 1, 8, 64, 16, KvDtype::F32).unwrap();
    assert!(matches!(
        go(&mut e, &mut other, &[1], ok.clone()),
        BeamError::Model(ModelError::KvShape { .. })
    ));
    // The errors convert into the engine's.
    let engine_error: rill_engine::EngineError = BeamError::EmptyPrompt.into();
    assert!(matches!(
        engine_error,
        rill_engine::EngineError::EmptyPrompt
    ));
    // The same cache then serves a search.
    let out = beam_search(&mut e, &mut kv, &[1], &ok, |_| true).unwrap();
    assert!(!out.hypotheses.is_empty());
    assert_eq!(kv.free_blocks(), kv.total_blocks());
}

#[test]
fn a_full_context_ends_the_search_with_length() {
    let mut spec_model = small_vocab(11, 1.0);
    spec_model.set_metadata("llama.context_length", Value::U32(6));
    let mut e = engine_of(&spec_model);
    let p = BeamParams {
        ignore_eos: true,
        ..params(2, 50, 1.0)
    };
    // Four prompt tokens in a context of six: three tokens (the last is not cached).
    let out = run(&mut e, &[0, 1, 2, 3], &p);
    assert_eq!(out.stop, BeamStop::Length);
    assert!(out.hypotheses.iter().all(|h| h.tokens.len() == 3));
    assert_eq!(p.token_limit(4, 6), 3);
}

/// On hybrid models (a recurrent state each beam forks and drops) and Gemma 4 (a KV cache laid
/// out per layer, with layers reading others' keys and values): every hypothesis's
/// log-probability is the sum of its tokens' log-probabilities computed from scratch, width 1 is
/// greedy decoding, and the search leaves the state arena as full as it found it.
#[test]
fn beams_on_hybrid_models_score_what_independent_passes_score() {
    for name in [
        "qwen35-tiny",
        "lfm2-tiny",
        "granitehybrid-tiny",
        "gemma4-tiny",
    ] {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/tiny")
            .join(name)
            .join("model.gguf");
        let mut e = Engine::load(&path, 2, Precision::Exact).unwrap();
        let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 500).collect();
        let mut kv = cache(&e, 32);
        let (states, blocks) = (kv.free_states(), kv.free_blocks());
        let out = beam_search(&mut e, &mut kv, &prompt, &params(4, 6, 1.0), |_| true).unwrap();
        assert_eq!(kv.free_states(), states, "{name}: the search leaked states");
        assert_eq!(kv.free_blocks(), blocks, "{name}");
        assert_eq!(out.hypotheses.len(), 4);
        let mut oracle = Oracle::new(&mut e, &prompt);
        for h in &out.hypotheses {
            let mut sum = 0.0f64;
            for i in 0..h.tokens.len() {
                let lp = oracle.logprobs(&h.tokens[..i]);
                sum += f64::from(lp[h.tokens[i] as usize]);
            }
            assert!(
                (sum - h.cumulative_logprob).abs() < 1e-4,
                "{name}: {:?} scored {} against {sum}",
                h.tokens,
                h.cumulative_logprob
            );
        }
        // Width 1: each token the argmax of its prefix's distribution.
        let mut kv = cache(&e, 32);
        let one = beam_search(&mut e, &mut kv, &prompt, &params(1, 6, 1.0), |_| true).unwrap();
        let mut oracle = Oracle::new(&mut e, &prompt);
        let tokens = &one.hypotheses[0].tokens;
        for i in 0..tokens.len() {
            let lp = oracle.logprobs(&tokens[..i]);
            assert_eq!(tokens[i], rill_engine::argmax(&lp), "{name}: token {i}");
        }
    }
}
