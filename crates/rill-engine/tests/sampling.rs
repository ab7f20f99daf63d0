//! The sampler chain against analytically expected distributions: the processed distribution
//! exactly, and 20 000 seeded draws by a chi-square test; a naive reference chain (full sorts, f64)
//! on random logits; validation; reproducibility; the generator shared with a verifier.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;
use rill_engine::{draw_from, EngineError, Rng, SamplerChain, SamplingParams, Stage};

/// Counts this thread's allocations (tests run on several threads).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const-initialised thread local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const DRAWS: usize = 20_000;

/// Eight tokens, well separated.
const LOGITS: [f32; 8] = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0];

fn softmax(l: &[f64]) -> Vec<f64> {
    let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return vec![0.0; l.len()];
    }
    let e: Vec<f64> = l.iter().map(|&x| (x - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

fn f64s(l: &[f32]) -> Vec<f64> {
    l.iter().map(|&x| f64::from(x)).collect()
}

/// Upper critical value of chi-square with `df` degrees of freedom at alpha = 0.001 (table, then
/// Wilson-Hilferty).
fn critical(df: usize) -> f64 {
    const T: [f64; 10] = [
        10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588,
    ];
    if (1..=10).contains(&df) {
        return T[df - 1];
    }
    let k = df as f64;
    let z = 3.090;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

/// The chain's distribution equals `expected` (dense, by token id), and `DRAWS` seeded draws
/// pass a chi-square test against it; tokens with probability 0 are never drawn.
fn check(params: SamplingParams, logits: &[f32], history: &[u32], expected: &[f64]) {
    let mut chain = SamplerChain::new(params.clone()).unwrap();
    let dist = chain.probabilities(logits, history, 0).to_vec();
    let mut got = vec![0.0f64; logits.len()];
    for &(id, p) in &dist {
        assert_eq!(got[id as usize], 0.0, "token {id} twice in {dist:?}");
        got[id as usize] = f64::from(p);
    }
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (g - e).abs() < 2e-6,
            "{params:?}: token {i}: {g} vs expected {e}\n{got:?}\n{expected:?}"
        );
    }
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..DRAWS {
        let (t, p) = chain.sample(logits, history, 0);
        assert!((f64::from(p) - expected[t as usize]).abs() < 2e-6);
        counts[t as usize] += 1;
    }
    let mut chi2 = 0.0;
    let mut support = 0;
    for (i, (&c, &e)) in counts.iter().zip(expected).enumerate() {
        if e == 0.0 {
            assert_eq!(
                c, 0,
                "{params:?}: token {i} has probability 0 but was drawn"
            );
            continue;
        }
        support += 1;
        let want = e * DRAWS as f64;
        chi2 += (c as f64 - want).powi(2) / want;
    }
    if support > 1 {
        let crit = critical(support - 1);
        assert!(
            chi2 < crit,
            "{params:?}: chi-square {chi2:.2} >= {crit} ({} dof)\ncounts {counts:?}\nexpected {expected:?}",
            support - 1
        );
    } else {
        assert_eq!(counts.iter().filter(|&&c| c > 0).count(), 1);
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams::with_temperature(1.0, seed)
}

/// `probs` restricted to `keep` and renormalised.
fn restricted(probs: &[f64], keep: impl Fn(usize) -> bool) -> Vec<f64> {
    let kept: Vec<f64> = (0..probs.len())
        .map(|i| if keep(i) { probs[i] } else { 0.0 })
        .collect();
    let s: f64 = kept.iter().sum();
    kept.iter().map(|p| p / s).collect()
}

#[test]
fn temperature_scales_the_logits() {
    for t in [0.5f32, 1.0, 1.7] {
        let l: Vec<f64> = LOGITS
            .iter()
            .map(|&x| f64::from(x) / f64::from(t))
            .collect();
        check(
            SamplingParams::with_temperature(t, 11),
            &LOGITS,
            &[],
            &softmax(&l),
        );
    }
}

#[test]
fn greedy_is_the_most_likely_token_with_probability_one() {
    let mut want = vec![0.0; 8];
    want[0] = 1.0;
    check(SamplingParams::greedy(), &LOGITS, &[], &want);
    // Ties go to the lowest id.
    let mut chain = SamplerChain::new(SamplingParams::greedy()).unwrap();
    assert_eq!(chain.sample(&[0.0, 3.0, 3.0, 1.0], &[], 0), (1, 1.0));
    // Greedy takes no randomness.
    let before = chain.rng().clone().next_u64();
    chain.sample(&LOGITS, &[], 0);
    assert_eq!(chain.rng_mut().next_u64(), before);
}

#[test]
fn top_k_keeps_the_k_most_likely() {
    let p = softmax(&f64s(&LOGITS));
    for k in [1usize, 3, 5, 8, 100] {
        check(
            SamplingParams {
                top_k: k,
                ..sampled(12)
            },
            &LOGITS,
            &[],
            &restricted(&p, |i| i < k),
        );
    }
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    let p = softmax(&f64s(&LOGITS));
    // Cumulative: 0.4027, 0.6470, 0.7951, 0.8850, 0.9395, ...
    for (top_p, n) in [(0.3f32, 1usize), (0.5, 2), (0.7, 3), (0.8, 4), (0.9, 5)] {
        let cum: f64 = p[..n].iter().sum();
        let before: f64 = p[..n - 1].iter().sum();
        assert!(cum >= f64::from(top_p) + 1e-3 && before < f64::from(top_p) - 1e-3);
        check(
            SamplingParams {
                top_p,
                ..sampled(13)
            },
            &LOGITS,
            &[],
            &restricted(&p, |i| i < n),
        );
    }
}

#[test]
fn min_p_keeps_tokens_near_the_most_likely() {
    let p = softmax(&f64s(&LOGITS));
    for min_p in [0.05f32, 0.2, 0.5, 1.0] {
        let threshold = f64::from(min_p) * p[0];
        check(
            SamplingParams {
                min_p,
                ..sampled(14)
            },
            &LOGITS,
            &[],
            &restricted(&p, |i| p[i] >= threshold),
        );
    }
}

/// Typical sampling's expected distribution, from the definition.
fn typical_expected(logits: &[f32], typical_p: f32) -> Vec<f64> {
    let p = softmax(&f64s(logits));
    let h: f64 = -p.iter().map(|&x| x * x.ln()).sum::<f64>();
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| {
        let ka = (-p[a].ln() - h).abs();
        let kb = (-p[b].ln() - h).abs();
        ka.total_cmp(&kb).then(a.cmp(&b))
    });
    let mut keep = vec![false; p.len()];
    let mut acc = 0.0;
    for &i in &order {
        keep[i] = true;
        acc += p[i];
        if acc >= f64::from(typical_p) {
            break;
        }
    }
    restricted(&p, |i| keep[i])
}

#[test]
fn typical_keeps_tokens_whose_surprisal_is_near_the_entropy() {
    let peaked = [4.0f32, 2.0, 1.9, 1.8, 1.7, 0.0, -1.0, -3.0];
    for typical_p in [0.2f32, 0.7, 0.9] {
        for logits in [&LOGITS, &peaked] {
            check(
                SamplingParams {
                    typical_p,
                    ..sampled(15)
                },
                logits,
                &[],
                &typical_expected(logits, typical_p),
            );
        }
    }
    // One likely token among many unlikely ones: its surprisal is far below the entropy, so
    // the most likely token is not typical at all.
    let flat_tail: Vec<f32> = std::iter::once(2.5)
        .chain((0..15).map(|i| 0.3 - 0.04 * i as f32))
        .collect();
    let want = typical_expected(&flat_tail, 0.3);
    assert_eq!(want[0], 0.0);
    check(
        SamplingParams {
            typical_p: 0.3,
            ..sampled(21)
        },
        &flat_tail,
        &[],
        &want,
    );
}

#[test]
fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
    // Token 0 (logit 2) and token 5 (logit -0.5) were seen; token 6 too, but outside the window.
    let history = [6u32, 0, 5, 5];
    let mut l = f64s(&LOGITS);
    l[0] /= 1.5;
    l[5] *= 1.5;
    check(
        SamplingParams {
            repeat_penalty: 1.5,
            repeat_last_n: 3,
            ..sampled(16)
        },
        &LOGITS,
        &history,
        &softmax(&l),
    );
}

#[test]
fn presence_and_frequency_penalties_follow_openai() {
    let history = [1u32, 2, 2, 2, 7];
    let mut l = f64s(&LOGITS);
    for (t, count) in [(1usize, 1.0), (2, 3.0), (7, 1.0)] {
        l[t] -= 0.4 * count + 0.7;
    }
    check(
        SamplingParams {
            presence_penalty: 0.7,
            frequency_penalty: 0.4,
            ..sampled(17)
        },
        &LOGITS,
        &history,
        &softmax(&l),
    );
    // The whole history, and negative penalties that favour repetition.
    let mut l = f64s(&LOGITS);
    l[4] += 0.5 * 2.0;
    check(
        SamplingParams {
            frequency_penalty: -0.5,
            repeat_last_n: usize::MAX,
            ..sampled(18)
        },
        &LOGITS,
        &[4, 4],
        &softmax(&l),
    );
}

#[test]
fn logit_bias_adds_and_can_forbid_banned_tokens_never_appear() {
    let mut l = f64s(&LOGITS);
    l[7] += 3.0;
    l[1] += 0.25 + 0.5; // two entries for one token add up
    l[0] = f64::NEG_INFINITY;
    l[3] = f64::NEG_INFINITY;
    check(
        SamplingParams {
            logit_bias: vec![(7, 3.0), (1, 0.25), (0, f32::NEG_INFINITY), (1, 0.5)],
            banned_tokens: vec![3],
            ..sampled(19)
        },
        &LOGITS,
        &[],
        &softmax(&l),
    );
}

#[test]
fn the_default_order_runs_penalties_then_filters_then_temperature() {
    // top-k 5, then top-p 0.8 of those, then min-p 0.3, then temperature 0.5.
    let history = [0u32];
    let mut l = f64s(&LOGITS);
    l[0] /= 2.0; // repetition penalty 2: logit 1.0, now tied in value with token 2
    let p = softmax(&l);
    let mut order: Vec<usize> = (0..8).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let top5: Vec<usize> = order[..5].to_vec();
    let pk = restricted(&p, |i| top5.contains(&i));
    let mut nucleus = Vec::new();
    let mut acc = 0.0;
    for &i in &top5 {
        nucleus.push(i);
        acc += pk[i];
        if acc >= 0.8 {
            break;
        }
    }
    let pmax = pk[order[0]];
    let kept: Vec<usize> = nucleus
        .into_iter()
        .filter(|&i| pk[i] >= 0.3 * pmax)
        .collect();
    let tempered: Vec<f64> = (0..8)
        .map(|i| {
            if kept.contains(&i) {
                l[i] / 0.5
            } else {
                f64::NEG_INFINITY
            }
        })
        .collect();
    check(
        SamplingParams {
            temperature: 0.5,
            seed: 20,
            top_k: 5,
            top_p: 0.8,
            min_p: 0.3,
            repeat_penalty: 2.0,
            ..SamplingParams::default()
        },
        &LOGITS,
        &history,
        &softmax(&tempered),
    );
}

#[test]
fn the_order_is_configurable() {
    // Temperature first flattens the distribution before top-p: more tokens survive.
    let base = SamplingParams {
        temperature: 3.0,
        top_p: 0.6,
        ..sampled(1)
    };
    let count = |params: SamplingParams| {
        let mut c = SamplerChain::new(params).unwrap();
        c.probabilities(&LOGITS, &[], 0).len()
    };
    let late = count(base.clone());
    let early = count(SamplingParams {
        order: vec![Stage::Temperature, Stage::TopP],
        ..base.clone()
    });
    assert_eq!(late, 2);
    assert!(early > late, "{early} vs {late}");
    // Stage names parse.
    let parsed: Vec<Stage> = "penalties,logit_bias,TOP-K,typical-p,top_p,min-p,temp"
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(parsed, Stage::DEFAULT_ORDER.to_vec());
    assert!("top-q".parse::<Stage>().is_err());
}

#[test]
fn min_tokens_suppression_lifts_after_n_generated() {
    let mut chain = SamplerChain::new(SamplingParams::greedy()).unwrap();
    chain.set_min_tokens(2, &[0, 1]);
    assert_eq!(chain.sample(&LOGITS, &[], 0).0, 2);
    assert_eq!(chain.sample(&LOGITS, &[], 1).0, 2);
    assert_eq!(chain.sample(&LOGITS, &[], 2).0, 0);
    // If the chain removes everything, the raw argmax is the fallback, never a panic.
    let mut chain = SamplerChain::new(SamplingParams {
        banned_tokens: (0..8).collect(),
        ..sampled(3)
    })
    .unwrap();
    assert_eq!(chain.sample(&LOGITS, &[], 0), (0, 1.0));
    assert_eq!(chain.sample(&[], &[], 0), (0, 0.0));
    let nan = [f32::NAN, 1.0, f32::NAN];
    assert_eq!(chain.probabilities(&nan, &[], 0), &[(1, 1.0)]);
}

fn rejected(params: SamplingParams, needle: &str) {
    let err = SamplerChain::for_vocab(params.clone(), 8).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(needle), "{params:?}: {msg:?} lacks {needle:?}");
}

#[test]
fn every_parameter_is_validated() {
    let d = SamplingParams::default;
    rejected(SamplingParams { top_p: 0.0, ..d() }, "top_p");
    rejected(SamplingParams { top_p: 1.5, ..d() }, "top_p");
    rejected(
        SamplingParams {
            top_p: f32::NAN,
            ..d()
        },
        "NaN",
    );
    rejected(SamplingParams { min_p: -0.1, ..d() }, "min_p");
    rejected(SamplingParams { min_p: 1.1, ..d() }, "min_p");
    rejected(
        SamplingParams {
            typical_p: 0.0,
            ..d()
        },
        "typical_p",
    );
    rejected(
        SamplingParams {
            typical_p: f32::NAN,
            ..d()
        },
        "typical_p",
    );
    rejected(
        SamplingParams {
            repeat_penalty: 0.0,
            ..d()
        },
        "repeat_penalty",
    );
    rejected(
        SamplingParams {
            repeat_penalty: f32::INFINITY,
            ..d()
        },
        "repeat_penalty",
    );
    rejected(
        SamplingParams {
            presence_penalty: 2.5,
            ..d()
        },
        "presence_penalty",
    );
    rejected(
        SamplingParams {
            frequency_penalty: f32::NAN,
            ..d()
        },
        "frequency_penalty",
    );
    rejected(
        SamplingParams {
            temperature: -0.5,
            ..d()
        },
        "temperature",
    );
    rejected(
        SamplingParams {
            logit_bias: vec![(1, f32::NAN)],
            ..d()
        },
        "logit bias",
    );
    rejected(
        SamplingParams {
            logit_bias: vec![(1, f32::INFINITY)],
            ..d()
        },
        "logit bias",
    );
    rejected(
        SamplingParams {
            order: vec![Stage::TopK, Stage::TopK, Stage::Temperature],
            ..d()
        },
        "twice",
    );
    rejected(
        SamplingParams {
            top_k: 3,
            order: vec![Stage::Temperature],
            ..d()
        },
        "no top-k stage",
    );
    rejected(
        SamplingParams {
            order: vec![],
            ..d()
        },
        "temperature",
    );
    let err = SamplerChain::for_vocab(
        SamplingParams {
            logit_bias: vec![(8, 1.0)],
            ..d()
        },
        8,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        EngineError::TokenOutOfVocab {
            what: "logit_bias",
            token: 8,
            vocab_size: 8
        }
    ));
    rejected(
        SamplingParams {
            banned_tokens: vec![100],
            ..d()
        },
        "outside the vocabulary",
    );
    // Temperature 1 needs no temperature stage; neutral stages need none either.
    assert!(SamplerChain::new(SamplingParams {
        order: vec![],
        ..sampled(0)
    })
    .is_ok());
}

#[test]
fn same_seed_same_tokens_whatever_else_runs() {
    let params = SamplingParams {
        top_k: 6,
        temperature: 1.3,
        seed: 99,
        ..SamplingParams::default()
    };
    let alone: Vec<u32> = {
        let mut c = SamplerChain::new(params.clone()).unwrap();
        (0..500).map(|_| c.sample(&LOGITS, &[], 0).0).collect()
    };
    let mut a = SamplerChain::new(params.clone()).unwrap();
    let mut other = SamplerChain::new(SamplingParams { seed: 5, ..params }).unwrap();
    let mut interleaved = Vec::new();
    for _ in 0..500 {
        other.sample(&LOGITS, &[], 0);
        interleaved.push(a.sample(&LOGITS, &[], 0).0);
        other.sample(&LOGITS, &[1, 2], 0);
    }
    assert_eq!(alone, interleaved);
    let mut b = SamplerChain::new(SamplingParams::with_temperature(1.3, 100)).unwrap();
    let different: Vec<u32> = (0..500).map(|_| b.sample(&LOGITS, &[], 0).0).collect();
    assert_ne!(alone, different);
}

#[test]
fn draw_takes_one_uniform_from_the_chain_generator() {
    let params = SamplingParams::with_temperature(0.9, 1234);
    let mut a = SamplerChain::new(params.clone()).unwrap();
    let mut b = SamplerChain::new(params).unwrap();
    for step in 0..50 {
        let x = a.sample(&LOGITS, &[], step);
        // The verifier's way: the distribution, then a draw with the chain's generator.
        let dist = b.probabilities(&LOGITS, &[], step).to_vec();
        let y = draw_from(b.rng_mut(), &dist).unwrap();
        assert_eq!(x.0, y.0);
        assert!((x.1 - y.1).abs() < 1e-7);
        // A verifier's own uniform in between keeps both streams aligned.
        assert_eq!(a.rng_mut().next_f64(), b.rng_mut().next_f64());
    }
    assert_eq!(draw_from(&mut Rng::new(0), &[(3, 0.0)]), None);
    assert_eq!(
        draw_from(&mut Rng::new(0), &[(3, 2.0), (4, 0.0)]),
        Some((3, 1.0))
    );
}

/// The chain, done naively: dense f64 logits, full sorts.
fn reference(logits: &[f32], history: &[u32], p: &SamplingParams) -> Vec<f64> {
    let n = logits.len();
    let mut l = f64s(logits);
    for &t in &p.banned_tokens {
        l[t as usize] = f64::NEG_INFINITY;
    }
    let by_prob_desc = |probs: &[f64]| {
        let mut o: Vec<usize> = (0..n).filter(|&i| probs[i] > 0.0).collect();
        o.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        o
    };
    let cut = |l: &mut Vec<f64>, keep: &[usize]| {
        for (i, x) in l.iter_mut().enumerate() {
            if !keep.contains(&i) {
                *x = f64::NEG_INFINITY;
            }
        }
    };
    for &stage in &p.order {
        match stage {
            Stage::Penalties if p.has_penalties() => {
                let start = history.len().saturating_sub(p.repeat_last_n);
                let mut counts = vec![0u32; n];
                for &t in &history[start..] {
                    counts[t as usize] += 1;
                }
                for (i, &c) in counts.iter().enumerate() {
                    if c > 0 && l[i] > f64::NEG_INFINITY {
                        let rp = f64::from(p.repeat_penalty);
                        l[i] = if l[i] > 0.0 { l[i] / rp } else { l[i] * rp };
                        l[i] -= f64::from(c) * f64::from(p.frequency_penalty)
                            + f64::from(p.presence_penalty);
                    }
                }
            }
            Stage::LogitBias => {
                for &(t, b) in &p.logit_bias {
                    l[t as usize] += f64::from(b);
                }
            }
            Stage::TopK if p.top_k > 0 => {
                let o = by_prob_desc(&softmax(&l));
                let keep: Vec<usize> = o.into_iter().take(p.top_k).collect();
                cut(&mut l, &keep);
            }
            Stage::Typical if p.typical_p < 1.0 => {
                let probs = softmax(&l);
                let h: f64 = -probs
                    .iter()
                    .filter(|&&x| x > 0.0)
                    .map(|&x| x * x.ln())
                    .sum::<f64>();
                let mut o: Vec<usize> = (0..n).filter(|&i| probs[i] > 0.0).collect();
                let key = |i: usize| (-probs[i].ln() - h).abs();
                o.sort_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
                let mut keep = Vec::new();
                let mut acc = 0.0;
                for i in o {
                    keep.push(i);
                    acc += probs[i];
                    if acc >= f64::from(p.typical_p) {
                        break;
                    }
                }
                cut(&mut l, &keep);
            }
            Stage::TopP if p.top_p < 1.0 => {
                let probs = softmax(&l);
                let mut keep = Vec::new();
                let mut acc = 0.0;
                for i in by_prob_desc(&probs) {
                    keep.push(i);
                    acc += probs[i];
                    if acc >= f64::from(p.top_p) {
                        break;
                    }
                }
                cut(&mut l, &keep);
            }
            Stage::MinP if p.min_p > 0.0 => {
                let probs = softmax(&l);
                let max = probs.iter().copied().fold(0.0, f64::max);
                let keep: Vec<usize> = (0..n)
                    .filter(|&i| probs[i] > 0.0 && probs[i] >= f64::from(p.min_p) * max)
                    .collect();
                cut(&mut l, &keep);
            }
            Stage::Temperature if p.temperature == 0.0 => {
                let keep: Vec<usize> = by_prob_desc(&softmax(&l)).into_iter().take(1).collect();
                cut(&mut l, &keep);
            }
            Stage::Temperature => {
                for x in l.iter_mut() {
                    *x /= f64::from(p.temperature);
                }
            }
            _ => {}
        }
    }
    softmax(&l)
}

fn params_strategy() -> impl Strategy<Value = SamplingParams> {
    (
        prop_oneof![Just(0.0f32), 0.2f32..2.5],
        prop_oneof![Just(0usize), 1usize..12],
        prop_oneof![Just(1.0f32), 0.05f32..1.0],
        prop_oneof![Just(0.0f32), 0.0f32..0.6],
        prop_oneof![Just(1.0f32), 0.1f32..1.0],
        (
            prop_oneof![Just(1.0f32), 0.5f32..2.0],
            -1.0f32..1.0,
            -1.0f32..1.0,
            0usize..8,
        ),
        proptest::collection::vec((0u32..16, -3.0f32..3.0), 0..4),
        proptest::collection::vec(0u32..16, 0..3),
        any::<bool>(),
    )
        .prop_map(
            |(temperature, top_k, top_p, min_p, typical_p, pen, logit_bias, banned, rev)| {
                let mut order = Stage::DEFAULT_ORDER.to_vec();
                if rev {
                    order.reverse();
                }
                SamplingParams {
                    temperature,
                    seed: 7,
                    top_k,
                    top_p,
                    min_p,
                    typical_p,
                    repeat_penalty: pen.0,
                    presence_penalty: pen.1,
                    frequency_penalty: pen.2,
                    repeat_last_n: pen.3,
                    logit_bias,
                    banned_tokens: banned,
                    order,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_chain_matches_a_naive_reference(
        params in params_strategy(),
        logits in proptest::collection::vec(-6.0f32..6.0, 16),
        history in proptest::collection::vec(0u32..16, 0..12),
    ) {
        let want = reference(&logits, &history, &params);
        let mut chain = SamplerChain::for_vocab(params.clone(), 16).unwrap();
        let dist = chain.probabilities(&logits, &history, 0).to_vec();
        let total: f64 = dist.iter().map(|&(_, p)| f64::from(p)).sum();
        prop_assert!((total - 1.0).abs() < 1e-5, "{total}");
        if want.iter().all(|&p| p == 0.0) {
            // Everything removed: the raw argmax.
            prop_assert_eq!(dist.len(), 1);
            return Ok(());
        }
        let mut got = vec![0.0f64; 16];
        for &(id, p) in &dist {
            prop_assert!(p > 0.0);
            got[id as usize] += f64::from(p);
        }
        for i in 0..16 {
            prop_assert!((got[i] - want[i]).abs() < 1e-4, "token {}: {} vs {}\n{:?}\n{:?}", i, got[i], want[i], got, want);
        }
    }
}

#[test]
fn a_large_vocabulary_is_cut_without_full_sorts_and_exactly() {
    let n = 262_144;
    let mut rng = Rng::new(77);
    let logits: Vec<f32> = (0..n)
        .map(|_| ((rng.next_f64() * 2.0 - 1.0) * 12.0) as f32)
        .collect();
    let mut sorted: Vec<u32> = (0..n as u32).collect();
    sorted.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });

    let mut chain = SamplerChain::new(SamplingParams {
        top_k: 40,
        ..sampled(1)
    })
    .unwrap();
    let mut ids: Vec<u32> = chain
        .probabilities(&logits, &[], 0)
        .iter()
        .map(|d| d.0)
        .collect();
    ids.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    assert_eq!(ids, sorted[..40]);

    // Top-p alone: the nucleus by a full sort, in f64.
    let l = f64s(&logits);
    let probs = softmax(&l);
    let mut acc = 0.0;
    let nucleus = sorted
        .iter()
        .position(|&i| {
            acc += probs[i as usize];
            acc >= 0.5
        })
        .unwrap()
        + 1;
    let mut chain = SamplerChain::new(SamplingParams {
        top_p: 0.5,
        ..sampled(1)
    })
    .unwrap();
    let start = std::time::Instant::now();
    let steps = 20;
    for _ in 0..steps {
        chain.sample(&logits, &[], 0);
    }
    let per_step = start.elapsed() / steps;
    let dist = chain.probabilities(&logits, &[], 0);
    assert!(
        (dist.len() as isize - nucleus as isize).abs() <= 1,
        "{} vs {nucleus}",
        dist.len()
    );
    eprintln!("top-p over {n} tokens: {per_step:?} per step, nucleus {nucleus}");
}

#[test]
fn steady_state_steps_allocate_nothing() {
    let n = 49_152;
    let mut rng = Rng::new(8);
    let logits: Vec<f32> = (0..n)
        .map(|_| ((rng.next_f64() * 2.0 - 1.0) * 10.0) as f32)
        .collect();
    let history: Vec<u32> = (0..200).map(|i| (i * 977) % n as u32).collect();
    let configs = [
        SamplingParams::greedy(),
        SamplingParams::with_temperature(0.7, 1),
        SamplingParams {
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repeat_penalty: 1.1,
            presence_penalty: 0.2,
            frequency_penalty: 0.2,
            logit_bias: vec![(5, 1.0), (6, -2.0)],
            banned_tokens: vec![7],
            ..SamplingParams::with_temperature(0.8, 2)
        },
        SamplingParams {
            top_p: 0.95,
            typical_p: 0.9,
            ..SamplingParams::with_temperature(1.1, 3)
        },
        SamplingParams {
            min_p: 0.01,
            ..SamplingParams::with_temperature(0.5, 4)
        },
    ];
    for params in configs {
        let mut chain = SamplerChain::new(params.clone()).unwrap();
        chain.set_min_tokens(3, &[1, 2]);
        // Buffers grow to their size on the first steps.
        for step in 0..3 {
            chain.sample(&logits, &history, step);
        }
        let before = ALLOCATIONS.with(Cell::get);
        for step in 0..10 {
            chain.sample(&logits, &history, step % 5);
        }
        let allocations = ALLOCATIONS.with(Cell::get) - before;
        assert_eq!(allocations, 0, "{params:?}");
    }
}

#[test]
fn a_constraint_mask_removes_tokens_before_every_stage_for_one_step() {
    // Tokens 2, 5 and 7 allowed.
    let mask = [0b1010_0100u32];
    let mut greedy = SamplerChain::new(SamplingParams::greedy()).unwrap();
    greedy.mask_next(&mask);
    assert_eq!(greedy.sample(&LOGITS, &[], 0), (2, 1.0));
    // One step only.
    assert_eq!(greedy.sample(&LOGITS, &[], 0), (0, 1.0));
    // Sampling: the distribution is the softmax over the allowed tokens alone, top-k counted
    // among them.
    let mut chain = SamplerChain::new(SamplingParams {
        top_k: 2,
        ..SamplingParams::with_temperature(1.0, 3)
    })
    .unwrap();
    chain.mask_next(&mask);
    let mut dist = chain.probabilities(&LOGITS, &[], 0).to_vec();
    dist.sort_by_key(|&(t, _)| t);
    let want = softmax(&[1.0, -0.5]);
    assert_eq!(dist.len(), 2);
    assert_eq!((dist[0].0, dist[1].0), (2, 5));
    assert!((f64::from(dist[0].1) - want[0]).abs() < 1e-6);
    // Every allowed token banned: the best allowed raw logit, not the best overall.
    let mut banned = SamplerChain::new(SamplingParams {
        banned_tokens: vec![2, 5, 7],
        ..SamplingParams::greedy()
    })
    .unwrap();
    banned.mask_next(&mask);
    assert_eq!(banned.sample(&LOGITS, &[], 0), (2, 1.0));
}

#[test]
fn a_draw_reports_its_uniform_and_the_interval_it_fell_in() {
    let mut chain = SamplerChain::new(SamplingParams::with_temperature(1.0, 9)).unwrap();
    let mut twin = SamplerChain::new(SamplingParams::with_temperature(1.0, 9)).unwrap();
    for step in 0..50 {
        let (token, p) = chain.sample(&LOGITS, &[], step);
        let d = chain.last_draw().expect("a sampled token has a draw");
        assert!(d.from <= d.uniform && d.uniform < d.to, "{d:?}");
        assert!((d.to - d.from - f64::from(p)).abs() < 1e-6, "{d:?} {p}");
        // The uniform is the generator's next one.
        let u = twin.rng_mut().next_f64();
        assert_eq!(u, d.uniform);
        assert!(token < LOGITS.len() as u32);
    }
    let mut greedy = SamplerChain::new(SamplingParams::greedy()).unwrap();
    greedy.sample(&LOGITS, &[], 0);
    assert_eq!(greedy.last_draw(), None);
}
