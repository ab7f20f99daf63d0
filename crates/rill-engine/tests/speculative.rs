//! Speculative decoding: greedy output token for token the same as plain decoding on SmolLM2 for
//! each draft (a draft model written from SmolLM2's first blocks, the model's own first layers,
//! prompt lookup); under sampling, the output distribution is the model's (chi-square against
//! the exact distribution on tiny synthetic models, with drafts that disagree with them); the
//! caches are consistent after a run; prompt lookup; refusals.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use rill_engine::{
    ngram_lookup, DraftKind, DraftSource, Engine, EngineError, FinishCause, GenerateParams,
    Generation, NgramParams, Precision, SamplerChain, SamplingParams, Session, SpeculativeParams,
    Speculator,
};
use rill_gguf::{GgufFile, GgufWriter, Value};
use rill_model::synthetic::{SyntheticModel, SyntheticSpec};
use rill_model::Model;
use rill_tokenizer::ChatMessage;

// ---------------------------------------------------------------------------------------------
// Fixtures.

fn temp_path(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "rill-speculative-{}-{n}-{name}.gguf",
        std::process::id()
    ))
}

/// A copy of the GGUF file at `path` with only its first `blocks` blocks (`block_count`
/// adjusted): a smaller model with the same vocabulary, embedding, norms and head.
fn truncated_model(path: &Path, blocks: usize) -> PathBuf {
    let file = GgufFile::open(path).unwrap();
    let arch = file
        .metadata()
        .get_str("general.architecture")
        .unwrap()
        .unwrap()
        .to_string();
    let count_key = format!("{arch}.block_count");
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata().iter() {
        let v = if k == count_key {
            Value::U32(blocks as u32)
        } else {
            v.clone()
        };
        w.add_metadata(k, v).unwrap();
    }
    for t in file.tensors() {
        let keep = match t.name.strip_prefix("blk.") {
            Some(rest) => rest.split('.').next().unwrap().parse::<usize>().unwrap() < blocks,
            None => true,
        };
        if keep {
            w.add_tensor(
                t.name.clone(),
                &t.dims,
                t.ggml_type,
                file.tensor_data(t).to_vec(),
            )
            .unwrap();
        }
    }
    let out = temp_path(&format!("first-{blocks}-blocks"));
    w.write_to_path(&out).unwrap();
    out
}

fn synthetic_engine(model: &SyntheticModel) -> Engine {
    let path = temp_path("synthetic");
    model.write_to_path(&path).unwrap();
    let engine = Engine::load(&path, 1, Precision::Fast).unwrap();
    std::fs::remove_file(path).unwrap();
    engine
}

fn synthetic_model(model: &SyntheticModel) -> Model {
    let path = temp_path("synthetic-draft");
    model.write_to_path(&path).unwrap();
    let m = Model::load(&path, 1).unwrap();
    std::fs::remove_file(path).unwrap();
    m
}

struct Real {
    engine: Engine,
    /// SmolLM2's first 8 blocks.
    draft: Option<Model>,
}

/// SmolLM2-135M-Instruct, loaded once for the whole test binary, with its 8-block draft.
fn smollm2() -> MutexGuard<'static, Real> {
    static R: OnceLock<Mutex<Real>> = OnceLock::new();
    R.get_or_init(|| {
        let path = common::model_path("smollm2-135m");
        let engine = Engine::load(&path, 2, Precision::Fast).unwrap();
        let draft_path = truncated_model(&path, 8);
        let draft = engine.load_draft_model(&draft_path, 2).unwrap();
        std::fs::remove_file(draft_path).unwrap();
        assert_eq!(draft.config().n_layers, 8);
        Mutex::new(Real {
            engine,
            draft: Some(draft),
        })
    })
    .lock()
    .unwrap_or_else(|e| e.into_inner())
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        ..Default::default()
    }
}

/// The parts of two generations that must agree.
fn assert_same(plain: &Generation, spec: &Generation, what: &str) {
    assert_eq!(plain.tokens, spec.tokens, "{what}: tokens");
    assert_eq!(plain.text, spec.text, "{what}: text");
    assert_eq!(plain.finish, spec.finish, "{what}: finish");
    assert_eq!(plain.logprobs, spec.logprobs, "{what}: logprobs");
}

/// Generates with `sp`, collecting the events' texts; checks they add up to the text and that
/// only the last event carries a finish reason.
fn run_speculative(
    s: &mut Session,
    e: &mut Engine,
    sp: &mut Speculator,
    prompt: &[u32],
    params: &GenerateParams,
) -> Generation {
    let mut streamed = String::new();
    let mut finishes = Vec::new();
    let g = s
        .generate_speculative(e, sp, prompt, params, |ev| {
            streamed.push_str(ev.text);
            finishes.push(ev.finish_reason);
            true
        })
        .unwrap();
    assert_eq!(streamed, g.text);
    assert_eq!(finishes.len(), g.tokens.len());
    assert!(finishes[..finishes.len() - 1].iter().all(Option::is_none));
    g
}

// ---------------------------------------------------------------------------------------------
// Greedy: the same tokens as plain decoding, on SmolLM2, for every draft.

const PASSAGE: &str = "The lighthouse keeper climbed the spiral stairs every evening at dusk, \
carrying a brass lantern and a notebook in which he recorded the color of the sky, the direction \
of the wind, and the number of ships that passed the rocky point. After forty years, the \
notebooks filled an entire wall of his small cottage.";

#[test]
fn greedy_output_is_identical_for_every_draft_on_smollm2() {
    let mut r = smollm2();
    let Real { engine, draft } = &mut *r;
    let copy = engine
        .chat_prompt(&[ChatMessage::new(
            "user",
            format!("Repeat the following text exactly:\n\n{PASSAGE}"),
        )])
        .unwrap();
    let story = engine
        .chat_prompt(&[ChatMessage::new(
            "user",
            "Write a short story about a robot who learns to paint.",
        )])
        .unwrap();
    let params = SpeculativeParams {
        draft_tokens: 5,
        adaptive: false,
        trace: true,
    };
    let mut speculators = vec![
        Speculator::new(engine, DraftSource::Ngram(NgramParams::default()), params).unwrap(),
        Speculator::new(engine, DraftSource::Layers(10), params).unwrap(),
        Speculator::new(
            engine,
            DraftSource::Model(Box::new(draft.take().unwrap())),
            params,
        )
        .unwrap(),
    ];
    let mut s = engine.new_session(512).unwrap();
    for (name, prompt, n) in [("copy", &copy, 64), ("story", &story, 40)] {
        let params = GenerateParams {
            top_logprobs: Some(2),
            ..greedy(n)
        };
        let plain = s.generate(engine, prompt, &params, |_| true).unwrap();
        assert!(plain.tokens.len() >= 20, "{name}: {:?}", plain.text);
        for sp in &mut speculators {
            let what = format!("{name}, {}", sp.kind());
            let g = run_speculative(&mut s, engine, sp, prompt, &params);
            assert_same(&plain, &g, &what);
            let st = g.speculative.as_ref().unwrap();
            assert!(st.drafted > 0 && st.rounds > 0, "{what}: {st:?}");
            assert_eq!(st.drafted, st.drafted_at.iter().sum::<usize>(), "{what}");
            assert_eq!(st.accepted, st.accepted_at.iter().sum::<usize>(), "{what}");
            // Every token is a kept draft or the one token a round adds.
            assert_eq!(
                st.accepted + st.rounds + 1,
                g.tokens.len(),
                "{what}: {st:?}"
            );
            // The trace retells the generation: the first token, then each round's kept
            // drafts and the token the model chose after them.
            assert_eq!(st.trace.len(), st.rounds, "{what}");
            let mut retold = vec![g.tokens[0]];
            for (i, round) in st.trace.iter().enumerate() {
                assert_eq!(
                    round.position,
                    prompt.len() + retold.len(),
                    "{what}: round {i}"
                );
                assert!(round.accepted <= round.drafted.len(), "{what}: round {i}");
                retold.extend_from_slice(&round.drafted[..round.accepted]);
                retold.extend(round.next);
                assert_eq!(
                    round.corrected,
                    round.accepted < round.drafted.len() && round.next.is_some(),
                    "{what}: round {i}: {round:?}"
                );
            }
            assert_eq!(retold, g.tokens, "{what}");
            if name == "copy" && sp.kind() == DraftKind::Ngram {
                assert!(
                    st.acceptance_rate() > 0.5,
                    "{what}: acceptance {:.2} ({st:?})",
                    st.acceptance_rate()
                );
            }
            eprintln!(
                "{what}: {} tokens in {} rounds, {}/{} drafts kept ({:.0}%)",
                g.tokens.len(),
                st.rounds,
                st.accepted,
                st.drafted,
                100.0 * st.acceptance_rate()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Under sampling: the exact distribution.

/// Upper critical value of chi-square with `df` degrees of freedom at alpha = 0.001
/// (Wilson-Hilferty; within 1% of the table from 3 degrees up).
fn critical(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.090;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// The exact distribution of the first `n` generated tokens after `prompt` (sequences of
/// probability below 1e-12 omitted), from direct forward passes and the sampler chain.
fn exact_sequences(
    e: &mut Engine,
    prompt: &[u32],
    sampling: &SamplingParams,
    n: usize,
) -> Vec<(Vec<u32>, f64)> {
    let mut chain = SamplerChain::new(sampling.clone()).unwrap();
    let mut s = e.new_session(prompt.len() + n + 1).unwrap();
    let mut out = Vec::new();
    let mut stack = vec![(Vec::<u32>::new(), 1.0f64)];
    while let Some((seq, p)) = stack.pop() {
        if seq.len() == n {
            out.push((seq, p));
            continue;
        }
        let history: Vec<u32> = prompt.iter().chain(&seq).copied().collect();
        s.set_prompt(&mut e.model, e.precision, &history).unwrap();
        let dist = chain
            .probabilities(s.last_logits(), &history, seq.len())
            .to_vec();
        for (t, q) in dist {
            let pq = p * f64::from(q);
            if pq > 1e-12 {
                let mut next = seq.clone();
                next.push(t);
                stack.push((next, pq));
            }
        }
    }
    out
}

/// `runs` seeded speculative generations of `n` tokens pass a chi-square test against the
/// exact distribution; returns the drafted tokens judged and kept at the first two positions.
fn check_distribution(
    e: &mut Engine,
    sp: &mut Speculator,
    prompt: &[u32],
    sampling: &SamplingParams,
    n: usize,
    runs: usize,
) -> [(usize, usize); 2] {
    let exact = exact_sequences(e, prompt, sampling, n);
    let total: f64 = exact.iter().map(|x| x.1).sum();
    assert!((total - 1.0).abs() < 1e-4, "{total}");
    let mut counts = vec![0usize; exact.len()];
    let mut s = e.new_session(prompt.len() + n + 8).unwrap();
    let mut at = [(0, 0); 2];
    for seed in 0..runs as u64 {
        let params = GenerateParams {
            max_tokens: n,
            ignore_eos: true,
            sampling: SamplingParams {
                seed,
                ..sampling.clone()
            },
            ..Default::default()
        };
        let g = s
            .generate_speculative(e, sp, prompt, &params, |_| true)
            .unwrap();
        let st = g.speculative.unwrap();
        for (i, x) in at.iter_mut().enumerate() {
            x.0 += st.drafted_at[i];
            x.1 += st.accepted_at[i];
        }
        let i = exact
            .iter()
            .position(|(seq, _)| *seq == g.tokens)
            .unwrap_or_else(|| panic!("{:?} has probability 0", g.tokens));
        counts[i] += 1;
    }
    // Cells expected below 5 times are pooled.
    let (mut chi2, mut df) = (0.0, 0usize);
    let (mut pooled_count, mut pooled_want) = (0usize, 0.0f64);
    for ((_, p), &c) in exact.iter().zip(&counts) {
        let want = p * runs as f64;
        if want < 5.0 {
            pooled_count += c;
            pooled_want += want;
        } else {
            chi2 += (c as f64 - want).powi(2) / want;
            df += 1;
        }
    }
    if pooled_want > 0.0 {
        chi2 += (pooled_count as f64 - pooled_want).powi(2) / pooled_want.max(1.0);
        df += 1;
    }
    let crit = critical(df - 1);
    assert!(
        chi2 < crit,
        "{}: chi-square {chi2:.1} >= {crit:.1} ({} dof)",
        sp.kind(),
        df - 1
    );
    at
}

#[test]
fn sampling_keeps_the_models_distribution_for_every_draft() {
    let mut spec = SyntheticSpec::llama_tiny();
    spec.weight_scale = 3.0;
    let mut e = synthetic_engine(&spec.build().unwrap());
    // A draft that disagrees: the same shape with other weights.
    let mut other = spec.clone();
    other.seed ^= 0x1234_5678;
    let draft = synthetic_model(&other.build().unwrap());
    // Over the last 3 tokens, penalties make the distribution depend on the history; the bias
    // and top-k keep only a, b, c and d, which keeps the tree of sequences small and makes
    // prompt lookup (which proposes them after the prompt's "abcdabcd...") right at times.
    let sampling = SamplingParams {
        temperature: 3.0,
        top_k: 4,
        repeat_penalty: 1.5,
        repeat_last_n: 3,
        logit_bias: b"abcd".iter().map(|&c| (u32::from(c), 40.0)).collect(),
        seed: 0,
        ..SamplingParams::default()
    };
    let prompt: Vec<u32> = "abcdabcdabc".bytes().map(u32::from).collect();
    // Four tokens: the first from the prompt's logits, then one round of two drafts (the
    // most that fit before max_tokens) and the token after them.
    let params = SpeculativeParams {
        draft_tokens: 3,
        adaptive: false,
        trace: false,
    };
    for source in [
        DraftSource::Model(Box::new(draft)),
        DraftSource::Layers(1),
        DraftSource::Ngram(NgramParams::default()),
    ] {
        let mut sp = Speculator::new(&e, source, params).unwrap();
        let at = check_distribution(&mut e, &mut sp, &prompt, &sampling, 4, 8000);
        // Both verdicts at both positions.
        assert!(
            at.iter().all(|&(d, a)| a > 20 && a + 20 < d),
            "{}: (judged, kept) by position {at:?}",
            sp.kind()
        );
    }
}

#[test]
fn a_seed_reproduces_a_sampled_speculative_run() {
    let spec = SyntheticSpec::llama_tiny();
    let mut e = synthetic_engine(&spec.build().unwrap());
    let mut sp = Speculator::new(&e, DraftSource::Layers(1), SpeculativeParams::default()).unwrap();
    let prompt: Vec<u32> = "once upon".bytes().map(u32::from).collect();
    let params = |seed| GenerateParams {
        max_tokens: 40,
        ignore_eos: true,
        sampling: SamplingParams::with_temperature(0.8, seed),
        ..Default::default()
    };
    let mut s = e.new_session(64).unwrap();
    let a = s
        .generate_speculative(&mut e, &mut sp, &prompt, &params(9), |_| true)
        .unwrap();
    let b = s
        .generate_speculative(&mut e, &mut sp, &prompt, &params(9), |_| true)
        .unwrap();
    let c = s
        .generate_speculative(&mut e, &mut sp, &prompt, &params(10), |_| true)
        .unwrap();
    assert_eq!(a.tokens, b.tokens);
    assert_ne!(a.tokens, c.tokens);
}

// ---------------------------------------------------------------------------------------------
// Stop conditions and rollback.

#[test]
fn stop_conditions_end_speculative_runs_like_plain_ones() {
    let spec = SyntheticSpec::llama_tiny();
    let mut e = synthetic_engine(&spec.build().unwrap());
    let prompt: Vec<u32> = "the cat sat on the mat; the cat"
        .bytes()
        .map(u32::from)
        .collect();
    let mut s = e.new_session(256).unwrap();
    let base = greedy(48);
    let plain = s.generate(&mut e, &prompt, &base, |_| true).unwrap();
    // A stop string and a stop token from the middle of the greedy text, min_tokens, a small
    // context, cancellation after a few tokens.
    let stop: String = plain.text.chars().skip(10).take(2).collect();
    let stop_token = plain.tokens[20];
    let cases: Vec<(GenerateParams, usize)> = vec![
        (base.clone(), 256),
        (greedy(7), 256),
        (
            GenerateParams {
                stop: vec![stop.clone()],
                ..base.clone()
            },
            256,
        ),
        (
            GenerateParams {
                stop_token_ids: vec![stop_token],
                min_tokens: 3,
                ..base.clone()
            },
            256,
        ),
        (base.clone(), prompt.len() + 9),
        (
            GenerateParams {
                top_logprobs: Some(3),
                prompt_logprobs: true,
                ..base.clone()
            },
            256,
        ),
    ];
    let mut other = spec.clone();
    other.seed ^= 77;
    let draft = synthetic_model(&other.build().unwrap());
    let sources = vec![
        DraftSource::Ngram(NgramParams::default()),
        DraftSource::Layers(1),
        DraftSource::Model(Box::new(draft)),
    ];
    for source in sources {
        let mut sp = Speculator::new(
            &e,
            source,
            SpeculativeParams {
                draft_tokens: 4,
                adaptive: true,
                trace: false,
            },
        )
        .unwrap();
        for (i, (params, ctx)) in cases.iter().enumerate() {
            let what = format!("{} case {i}", sp.kind());
            let mut a = e.new_session(*ctx).unwrap();
            let plain = a.generate(&mut e, &prompt, params, |_| true).unwrap();
            let mut b = e.new_session(*ctx).unwrap();
            let g = run_speculative(&mut b, &mut e, &mut sp, &prompt, params);
            assert_same(&plain, &g, &what);
            assert_eq!(plain.prompt_logprobs, g.prompt_logprobs, "{what}");
            // The session ends in the same state: same tokens, same last logits.
            assert_eq!(a.tokens(), b.tokens(), "{what}");
            assert_eq!(a.last_logits(), b.last_logits(), "{what}");
        }
        // Cancelling after 5 tokens.
        let mut b = e.new_session(256).unwrap();
        let mut seen = 0;
        let g = b
            .generate_speculative(&mut e, &mut sp, &prompt, &base, |_| {
                seen += 1;
                seen < 5
            })
            .unwrap();
        assert_eq!(g.finish, FinishCause::Cancelled);
        assert_eq!(g.tokens, plain.tokens[..5]);
    }
}

#[test]
fn rollback_leaves_both_caches_consistent() {
    let spec = SyntheticSpec::llama_tiny();
    let mut e = synthetic_engine(&spec.build().unwrap());
    let prompt: Vec<u32> = "to be or not to be, that is"
        .bytes()
        .map(u32::from)
        .collect();
    let mut other = spec.clone();
    other.seed ^= 5;
    let draft = synthetic_model(&other.build().unwrap());
    for source in [DraftSource::Model(Box::new(draft)), DraftSource::Layers(1)] {
        let mut sp = Speculator::new(&e, source, SpeculativeParams::default()).unwrap();
        let mut s = e.new_session(256).unwrap();
        let first = run_speculative(&mut s, &mut e, &mut sp, &prompt, &greedy(30));
        let st = first.speculative.as_ref().unwrap();
        assert!(st.accepted < st.drafted, "{}: no rejection", sp.kind());
        // The session holds the prompt and the tokens but the last; its logits are a fresh
        // computation's.
        let mut held = prompt.clone();
        held.extend_from_slice(&first.tokens[..first.tokens.len() - 1]);
        assert_eq!(s.tokens(), held);
        let mut fresh = e.new_session(256).unwrap();
        fresh.set_prompt(&mut e.model, e.precision, &held).unwrap();
        assert_eq!(s.last_logits(), fresh.last_logits());
        // Going on from there (plain, then speculative again: the draft's cache is reused
        // where it still matches and rolled back where not) matches a fresh plain run.
        let mut longer = prompt.clone();
        longer.extend_from_slice(&first.tokens);
        let want = fresh
            .generate(&mut e, &longer, &greedy(30), |_| true)
            .unwrap();
        let got = run_speculative(&mut s, &mut e, &mut sp, &longer, &greedy(30));
        assert_same(&want, &got, &format!("{} continued", sp.kind()));
        let plain_again = s.generate(&mut e, &longer, &greedy(30), |_| true).unwrap();
        assert_same(&want, &plain_again, "plain after speculative");
        // A shorter, diverging prompt: the draft's cache keeps only the common prefix.
        let other_prompt: Vec<u32> = "to be or not".bytes().map(u32::from).collect();
        let want = fresh
            .generate(&mut e, &other_prompt, &greedy(20), |_| true)
            .unwrap();
        let got = run_speculative(&mut s, &mut e, &mut sp, &other_prompt, &greedy(20));
        assert_same(&want, &got, &format!("{} diverging", sp.kind()));
    }
}

// ---------------------------------------------------------------------------------------------
// Prompt lookup.

#[test]
fn ngram_lookup_drafts_what_followed_the_last_ngram() {
    let p = NgramParams { max_n: 3, min_n: 1 };
    let mut out = Vec::new();
    // The trigram 1 2 3 occurred before, followed by 4 5 6.
    let h = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3];
    assert_eq!(ngram_lookup(&h, &p, 3, &mut out), 3);
    assert_eq!(out, [4, 5, 6]);
    // Fewer tokens than asked when the history ends first.
    assert_eq!(ngram_lookup(&h, &p, 100, &mut out), 3);
    assert_eq!(out, [4, 5, 6, 7, 9, 1, 2, 3]);
    // The latest occurrence with a full continuation wins over an earlier one.
    let h = [8, 8, 1, 2, 10, 11, 0, 1, 2, 20, 21, 5, 1, 2];
    assert_eq!(ngram_lookup(&h, &p, 2, &mut out), 2);
    assert_eq!(out, [20, 21]);
    assert_eq!(ngram_lookup(&h, &p, 5, &mut out), 2);
    assert_eq!(out, [20, 21, 5, 1, 2]);
    // ... but one too close to the end loses to the earliest (the longest continuation).
    assert_eq!(ngram_lookup(&h, &p, 6, &mut out), 2);
    assert_eq!(out, [10, 11, 0, 1, 2, 20]);
    // Shorter n-grams when the longer do not occur; min_n bounds them.
    let h = [5, 6, 7, 1, 9, 9, 7];
    assert_eq!(ngram_lookup(&h, &p, 2, &mut out), 1);
    assert_eq!(out, [1, 9]);
    let strict = NgramParams { max_n: 3, min_n: 2 };
    assert_eq!(ngram_lookup(&h, &strict, 2, &mut out), 0);
    assert!(out.is_empty());
    // A repeating token drafts more of itself.
    assert_eq!(ngram_lookup(&[4, 4, 4, 4], &p, 3, &mut out), 3);
    assert_eq!(out, [4]);
    // Nothing to draft.
    assert_eq!(ngram_lookup(&[1, 2, 3], &p, 4, &mut out), 0);
    assert_eq!(ngram_lookup(&h, &p, 0, &mut out), 0);
    assert!(out.is_empty());
    // Bad sizes are refused.
    for bad in [
        NgramParams { max_n: 2, min_n: 0 },
        NgramParams { max_n: 1, min_n: 2 },
        NgramParams {
            max_n: 1000,
            min_n: 1,
        },
    ] {
        assert!(matches!(bad.validate(), Err(EngineError::BadParameter(_))));
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals.

#[test]
fn mismatched_drafts_and_bad_parameters_are_refused() {
    let spec = SyntheticSpec::llama_tiny();
    let e = synthetic_engine(&spec.build().unwrap());
    let params = SpeculativeParams::default();
    // A token's text differs.
    let mut m = spec.build().unwrap();
    if let Some(Value::Array(tokens)) = m
        .metadata
        .iter_mut()
        .find_map(|(k, v)| (k == "tokenizer.ggml.tokens").then_some(v))
    {
        tokens[65] = Value::String("ZZ".into());
    } else {
        panic!("no token list");
    }
    let err = Speculator::new(
        &e,
        DraftSource::Model(Box::new(synthetic_model(&m))),
        params,
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, EngineError::DraftVocabulary(s) if s.contains("token 65")),
        "{err}"
    );
    // Another vocabulary size: SmolLM2's would do, but a bigger embedding is enough.
    let mut gemma = SyntheticSpec::gemma3_tiny();
    gemma.seed = 3;
    let g = synthetic_model(&gemma.build().unwrap());
    // Same synthetic vocabulary: accepted (the architecture may differ).
    assert!(Speculator::new(&e, DraftSource::Model(Box::new(g)), params).is_ok());
    for layers in [0, 2, 9] {
        let err = Speculator::new(&e, DraftSource::Layers(layers), params)
            .err()
            .unwrap();
        assert!(
            matches!(err, EngineError::DraftLayers { layers: l, model_layers: 2 } if l == layers),
            "{err}"
        );
        assert!(err.to_string().contains("1..=1"), "{err}");
    }
    for k in [0, 65] {
        let bad = SpeculativeParams {
            draft_tokens: k,
            adaptive: false,
            trace: false,
        };
        assert!(matches!(
            Speculator::new(&e, DraftSource::Layers(1), bad),
            Err(EngineError::BadParameter(_))
        ));
    }
    assert!(matches!(
        Speculator::new(
            &e,
            DraftSource::Ngram(NgramParams { max_n: 0, min_n: 0 }),
            params
        ),
        Err(EngineError::BadParameter(_))
    ));
    assert_eq!(
        Speculator::new(&e, DraftSource::Layers(1), params)
            .unwrap()
            .kind(),
        DraftKind::Layers(1)
    );
}

#[test]
fn a_draft_of_another_vocabulary_size_is_refused_on_smollm2() {
    let r = smollm2();
    let spec = SyntheticSpec::llama_tiny();
    let err = Speculator::new(
        &r.engine,
        DraftSource::Model(Box::new(synthetic_model(&spec.build().unwrap()))),
        SpeculativeParams::default(),
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, EngineError::DraftVocabulary(s) if s.contains("259") && s.contains("49152")),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Hybrid models: a rejected draft rolls a recurrent state back to the checkpoint before the
// verifying pass, and the kept rows are computed again. (Gemma 4 too: its KV-shared layers read
// other layers' keys and values, and a prompt's rows without logits skip them.)

#[test]
fn greedy_and_sampled_speculation_on_hybrid_models_match_plain_decoding() {
    for name in [
        "qwen35-tiny",
        "lfm2-tiny",
        "granitehybrid-tiny",
        "gemma4-tiny",
    ] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/tiny")
            .join(name)
            .join("model.gguf");
        let mut e = Engine::load(&path, 2, Precision::Fast).unwrap();
        // A repetitive prompt, so prompt lookup drafts (and is partly rejected).
        let prompt: Vec<u32> = (0..90u32).map(|i| (i % 23) * 7 + 3).collect();
        let mut sampled = greedy(48);
        sampled.sampling.temperature = 0.8;
        sampled.sampling.seed = 11;
        for params in [greedy(48), sampled] {
            let mut plain_session = e.new_session(256).unwrap();
            let want = plain_session
                .generate(&mut e, &prompt, &params, |_| true)
                .unwrap();
            for source in [
                DraftSource::Ngram(NgramParams::default()),
                DraftSource::Layers(2),
            ] {
                let mut sp = Speculator::new(&e, source, SpeculativeParams::default()).unwrap();
                let mut s = e.new_session(256).unwrap();
                let got = run_speculative(&mut s, &mut e, &mut sp, &prompt, &params);
                let st = got.speculative.as_ref().unwrap();
                if params.sampling.temperature == 0.0 {
                    assert_same(&want, &got, &format!("{name} {}", sp.kind()));
                    assert!(
                        st.drafted > st.accepted,
                        "{name} {}: no rejection",
                        sp.kind()
                    );
                }
                // The session holds what a fresh computation of its tokens holds.
                let mut fresh = e.new_session(256).unwrap();
                fresh
                    .set_prompt(&mut e.model, e.precision, s.tokens())
                    .unwrap();
                assert_eq!(s.last_logits(), fresh.last_logits(), "{name} {}", sp.kind());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Qwen3.5's MTP block as the draft.

fn tiny(name: &str, precision: Precision) -> Engine {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/tiny")
        .join(name)
        .join("model.gguf");
    Engine::load(&path, 2, precision).unwrap()
}

/// The MTP block's greedy draft after `seq` (the cached tokens and the pending one), computed
/// from nothing: the model's hidden states of `seq` but the last, every pair through the block.
fn oracle_mtp_draft(e: &mut Engine, seq: &[u32]) -> u32 {
    use rill_model::Batch;
    let (model, precision) = (&mut e.model, e.precision);
    let d = model.config().d_model;
    let n = seq.len() - 1;
    let mut kv = model.new_kv_cache(seq.len() + 1, precision).unwrap();
    kv.add_sequence(0).unwrap();
    model.set_hidden_log(true);
    let mut logits = Vec::new();
    model
        .forward(
            &Batch::prompt(0, &seq[..n], 0, false),
            &mut kv,
            precision,
            &mut logits,
        )
        .unwrap();
    let log = model.take_hidden_log();
    model.set_hidden_log(false);
    let mut mtp = model.new_mtp_kv_cache(seq.len() + 1, precision).unwrap();
    mtp.add_sequence(0).unwrap();
    let mut batch = Batch::new();
    for (p, &token) in seq.iter().enumerate().take(n + 1).skip(1) {
        batch.push(0, token, p - 1, p == n);
    }
    let mut out = Vec::new();
    model
        .forward_mtp(
            &batch,
            &log.data[..n * d],
            &mut mtp,
            precision,
            &mut logits,
            &mut out,
        )
        .unwrap();
    rill_engine::argmax(&logits)
}

/// `--speculative mtp`: greedy and sampled generations with the MTP block as the draft give
/// plain decoding's tokens (greedy) and a session holding what a fresh computation holds; each
/// round's first draft is the block's greedy choice computed from nothing (its cache, carried
/// across rounds, pairs the right states with the right tokens); a second generation on the
/// same session and speculator continues from what both hold.
#[test]
fn the_mtp_block_drafts_and_speculation_matches_plain_decoding() {
    let mut e = tiny("qwen35mtp-tiny", Precision::Exact);
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 500).collect();
    let mut sampled = greedy(32);
    sampled.sampling.temperature = 0.8;
    sampled.sampling.seed = 5;
    for params in [greedy(32), sampled] {
        let mut plain = e.new_session(256).unwrap();
        let want = plain.generate(&mut e, &prompt, &params, |_| true).unwrap();
        let sp_params = SpeculativeParams {
            draft_tokens: 3,
            adaptive: false,
            trace: true,
        };
        let mut sp = Speculator::new(&e, DraftSource::Mtp, sp_params).unwrap();
        assert_eq!(sp.kind(), DraftKind::Mtp);
        let mut s = e.new_session(256).unwrap();
        let got = run_speculative(&mut s, &mut e, &mut sp, &prompt, &params);
        let st = got.speculative.clone().unwrap();
        assert!(st.drafted > 0 && st.draft_passes > 0, "{st:?}");
        eprintln!(
            "temperature {}: {} drafted, {} kept ({:.0}%), {:.2} tokens per pass",
            params.sampling.temperature,
            st.drafted,
            st.accepted,
            100.0 * st.acceptance_rate(),
            st.tokens_per_round()
        );
        if params.sampling.temperature == 0.0 {
            assert_same(&want, &got, "mtp");
            // The sequence each round drafted after: the prompt and the tokens before it.
            let all = [prompt.as_slice(), &got.tokens].concat();
            for round in st.trace.iter().filter(|r| !r.drafted.is_empty()) {
                let seq = &all[..round.position];
                assert_eq!(
                    round.drafted[0],
                    oracle_mtp_draft(&mut e, seq),
                    "the first draft at {}",
                    round.position
                );
            }
        }
        let mut fresh = e.new_session(256).unwrap();
        fresh
            .set_prompt(&mut e.model, e.precision, s.tokens())
            .unwrap();
        assert_eq!(s.last_logits(), fresh.last_logits());
        // The conversation goes on: the session and the speculator carry over.
        let more = [s.tokens(), &[7, 8, 9]].concat();
        let next = run_speculative(&mut s, &mut e, &mut sp, &more, &greedy(8));
        let mut plain = e.new_session(256).unwrap();
        let want = plain.generate(&mut e, &more, &greedy(8), |_| true).unwrap();
        assert_same(&want, &next, "mtp, second turn");
    }
    // A model without the block says why.
    let plain_model = tiny("qwen35-tiny", Precision::Exact);
    match Speculator::new(&plain_model, DraftSource::Mtp, SpeculativeParams::default()) {
        Err(EngineError::NoMtp(why)) => assert!(why.contains("no multi-token-prediction")),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a model without an MTP block drafted with one"),
    }
}
