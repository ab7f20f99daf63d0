//! What a sampler chain asks of the output head (`SamplerChain::head_cut`), and the contract the
//! two-pass head relies on: a chain reads nothing outside its cut.

use proptest::prelude::*;
use rill_engine::{SamplerChain, SamplingParams, Stage};

/// What each chain asks of the output head (`SamplerChain::head_cut`).
#[test]
fn a_chain_asks_the_head_for_what_its_first_cut_keeps() {
    use rill_model::HeadCut;
    let cut = |p: SamplingParams| SamplerChain::new(p).unwrap().head_cut(5);
    let base = SamplingParams::default();
    assert_eq!(cut(base.clone()), HeadCut::TopK(1), "greedy");
    let defaults = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        ..base.clone()
    };
    assert_eq!(cut(defaults.clone()), HeadCut::TopK(40), "top-k first");
    let band = |t: f32, min_p: f32| (1.0f32 / min_p).ln() * t * 1.001 + 1e-3;
    let within = |c: HeadCut| match c {
        HeadCut::Within(d) => d,
        other => panic!("{other:?} is not a band"),
    };
    let min_p = SamplingParams {
        temperature: 0.7,
        min_p: 0.1,
        ..base.clone()
    };
    // llama.cpp's order: min-p before temperature, on the unscaled logits.
    assert!((within(cut(min_p.clone())) - band(1.0, 0.1)).abs() < 1e-5);
    let scaled_first = SamplingParams {
        order: vec![Stage::Temperature, Stage::MinP],
        ..min_p.clone()
    };
    assert!((within(cut(scaled_first)) - band(0.7, 0.1)).abs() < 1e-5);
    // Anything that moves a token before the cut, or reads every token, takes every logit.
    for (what, p) in [
        (
            "temperature alone",
            SamplingParams {
                temperature: 1.0,
                ..base.clone()
            },
        ),
        (
            "top-p first",
            SamplingParams {
                temperature: 0.8,
                top_p: 0.9,
                min_p: 0.05,
                ..base.clone()
            },
        ),
        (
            "typical",
            SamplingParams {
                temperature: 0.8,
                typical_p: 0.9,
                top_k: 40,
                order: vec![Stage::Typical, Stage::TopK, Stage::Temperature],
                ..base.clone()
            },
        ),
        (
            "penalties",
            SamplingParams {
                repeat_penalty: 1.1,
                ..defaults.clone()
            },
        ),
        (
            "presence",
            SamplingParams {
                presence_penalty: -0.5,
                ..base.clone()
            },
        ),
        (
            "bias",
            SamplingParams {
                logit_bias: vec![(3, 5.0)],
                ..defaults.clone()
            },
        ),
        (
            "bans",
            SamplingParams {
                banned_tokens: vec![3],
                ..base.clone()
            },
        ),
    ] {
        assert_eq!(cut(p), HeadCut::Full, "{what}");
    }
    // A constraint's mask or the min_tokens suppression, for the step they apply to.
    let mut chain = SamplerChain::new(base.clone()).unwrap();
    chain.mask_next(&[u32::MAX]);
    assert_eq!(chain.head_cut(0), HeadCut::Full);
    let mut chain = SamplerChain::new(base).unwrap();
    chain.set_min_tokens(3, &[2]);
    assert_eq!(chain.head_cut(2), HeadCut::Full);
    assert_eq!(chain.head_cut(3), HeadCut::TopK(1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The contract the two-pass head relies on: when every token outside a chain's cut holds
    /// any value below the cut (the first pass's estimates), the chain's distribution and draw
    /// are those of the exact logits.
    #[test]
    fn the_chain_reads_only_its_cut(
        temperature in prop_oneof![Just(0.0f32), 0.3f32..1.5],
        top_k in prop_oneof![Just(0usize), 1usize..20],
        top_p in prop_oneof![Just(1.0f32), 0.5f32..0.99],
        min_p in prop_oneof![Just(0.0f32), 0.01f32..0.3],
        seed in 0u64..1000,
        logits in proptest::collection::vec(-8.0f32..8.0, 64),
        drops in proptest::collection::vec(0.0f32..20.0, 64),
    ) {
        use rill_model::HeadCut;
        let params = SamplingParams { temperature, top_k, top_p, min_p, seed, ..SamplingParams::default() };
        let mut exact = SamplerChain::new(params.clone()).unwrap();
        let cut = exact.head_cut(0);
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let floor = match cut {
            HeadCut::Full => return Ok(()),
            HeadCut::TopK(k) => sorted[(k as usize).min(64) - 1],
            HeadCut::Within(delta) => sorted[0] - delta,
        };
        // Below the cut: any lower value (strictly, as the certificate guarantees).
        let mixed: Vec<f32> = logits
            .iter()
            .zip(&drops)
            .map(|(&l, &d)| if l >= floor { l } else { floor - 1e-3 - d })
            .collect();
        let mut cut_chain = SamplerChain::new(params).unwrap();
        let want = exact.probabilities(&logits, &[], 0).to_vec();
        let got = cut_chain.probabilities(&mixed, &[], 0).to_vec();
        prop_assert_eq!(&got, &want);
        prop_assert_eq!(cut_chain.draw(), exact.draw());
    }
}
