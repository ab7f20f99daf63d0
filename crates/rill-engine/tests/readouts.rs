//! The glass box's readings beyond the lens itself: per-head attribution, value-weighted
//! attention, the lens through a shared cache's prefix cache, and counterfactuals.

mod common;

use rill_engine::{CacheLease, Edit, Engine, Lens, LensOptions, Precision};
use rill_model::KvCache;

const PROMPT: &str = "The capital of France is Paris, and the capital of Italy is";

fn options() -> LensOptions {
    LensOptions::value_weighted(5)
}

fn arena(engine: &Engine) -> KvCache {
    engine.model.new_kv_cache(1024, engine.precision).unwrap()
}

fn lease(kv: &mut KvCache, seq: u64) -> CacheLease<'_> {
    CacheLease {
        kv,
        seq,
        prefix_caching: true,
    }
}

/// Every block's heads (and its output bias) add up to its attention's direct logit, and the
/// value-weighted attention bounds each head's write from above (the triangle inequality over
/// the positions it mixed); with one token the head's output is that token's value, so the
/// bound is met exactly: the Gram-matrix norms equal the direct ones.
fn check_readouts(builtin: &str) {
    let mut engine = common::engine(builtin, Precision::Exact);
    let tokens = engine.tokenizer.encode(PROMPT, true);
    let lens = engine.logit_lens_with(&tokens, options()).unwrap();
    let weighted = lens.value_weighted.as_ref().unwrap();
    assert_eq!(lens.windows.len(), lens.layers.len() - 1);
    for layer in &lens.layers[1..] {
        let w = layer.writes.unwrap();
        let sum: f64 = layer.head_logits.iter().map(|&x| f64::from(x)).sum::<f64>()
            + f64::from(w.attention_bias_logit);
        let scale: f64 = layer
            .head_logits
            .iter()
            .map(|&x| f64::from(x).abs())
            .sum::<f64>()
            + 1.0;
        assert!(
            (sum - f64::from(w.attention_logit)).abs() <= 1e-4 * scale,
            "{builtin} layer {}: heads sum to {sum}, the block wrote {}",
            layer.layer,
            w.attention_logit
        );
        let block = &weighted[layer.layer - 1];
        for (h, head) in block.iter().enumerate() {
            assert_eq!(head.len(), tokens.len());
            let raw = &lens.attention[layer.layer - 1][h];
            for (j, (&v, &a)) in head.iter().zip(raw).enumerate() {
                assert!(v >= 0.0, "layer {} head {h} position {j}", layer.layer);
                if a == 0.0 {
                    assert_eq!(v, 0.0, "a position outside the window writes nothing");
                }
            }
        }
    }

    // Past its work limit value weighting is left out, and the lens says so.
    let limited = LensOptions {
        value_work_limit: 1,
        ..options()
    };
    let skipped = engine.logit_lens_with(&tokens, limited).unwrap();
    assert!(skipped.value_weighted.is_none() && skipped.value_weighting_skipped);
    assert_eq!(skipped.attention, lens.attention);
    assert!(!lens.value_weighting_skipped);

    // One token: each head's output is that token's value, its write is exactly the value's.
    let one = engine.logit_lens_with(&tokens[..1], options()).unwrap();
    let weighted = one.value_weighted.as_ref().unwrap();
    let (d, hd) = {
        let c = engine.model.config();
        (c.d_model, c.head_dim)
    };
    let mut kv = engine.model.new_kv_cache(1, engine.precision).unwrap();
    kv.add_sequence(0).unwrap();
    engine.model.set_capture(true);
    let mut logits = Vec::new();
    engine
        .model
        .forward(
            &rill_model::Batch::prompt(0, &tokens[..1], 0, false),
            &mut kv,
            engine.precision,
            &mut logits,
        )
        .unwrap();
    let capture = engine.model.capture().cloned().unwrap();
    engine.model.set_capture(false);
    for (block, heads) in weighted.iter().enumerate() {
        let readout = engine
            .model
            .head_readout(&kv, 0, block, 1, &capture.head_outputs[block], false)
            .unwrap();
        for (h, head) in heads.iter().enumerate() {
            let direct = readout.head_writes[h]
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>()
                .sqrt();
            let got = f64::from(head[0]);
            assert!(
                (got - direct).abs() <= 1e-4 * direct.max(1e-3),
                "{builtin} block {block} head {h}: value norm {got}, the head wrote {direct} \
                 (d {d}, head dim {hd})"
            );
        }
    }
}

#[test]
fn smollm2_heads_add_up_and_value_norms_match() {
    check_readouts("smollm2-135m");
}

#[test]
fn gemma3_heads_add_up_and_value_norms_match() {
    check_readouts("gemma3-270m");
}

fn without_cache_count(mut lens: Lens) -> Lens {
    lens.cached_tokens = 0;
    lens
}

/// A lens through a shared cache reads the cached prefix, computes only the rest, and gives the
/// bits of a lens computed from scratch; it leaves no sequence behind.
#[test]
fn lens_through_the_prefix_cache_is_the_same_lens() {
    for precision in [Precision::Fast, Precision::Exact] {
        let mut engine = common::engine("smollm2-135m", precision);
        let tokens = engine
            .tokenizer
            .encode(&PROMPT.repeat(3), true)
            .into_iter()
            .collect::<Vec<_>>();
        let mut kv = arena(&engine);
        let short = &tokens[..tokens.len() - 1];
        let first = engine
            .logit_lens_in(lease(&mut kv, 7), short, options())
            .unwrap();
        assert_eq!(first.cached_tokens, 0);
        assert!(!kv.has_sequence(7));
        assert!(kv.cached_blocks() > 0, "the lens published its blocks");
        let second = engine
            .logit_lens_in(lease(&mut kv, 8), &tokens, options())
            .unwrap();
        // Every position of the first lens's context, its last partly filled block included.
        assert_eq!(second.cached_tokens, short.len());
        let fresh = engine.logit_lens_with(&tokens, options()).unwrap();
        assert_eq!(
            without_cache_count(second),
            fresh,
            "{precision:?}: the lens from the prefix cache differs"
        );
        assert_eq!(kv.used_blocks(), 0);
    }
}

/// Replacing a token by itself changes nothing; dropping one gives the distribution of the
/// shortened context computed from scratch, computing only from the change on.
#[test]
fn counterfactuals_recompute_from_the_change() {
    let mut engine = common::engine("smollm2-135m", Precision::Fast);
    let tokens = engine.tokenizer.encode(&PROMPT.repeat(3), true);
    let mut kv = arena(&engine);
    engine
        .logit_lens_in(lease(&mut kv, 1), &tokens, LensOptions::top(1))
        .unwrap();
    let n = tokens.len();
    let late = n - 3;
    let edits = [
        (late, Edit::Replace(tokens[late])),
        (late, Edit::Drop),
        (1, Edit::Drop),
    ];
    let cf = engine
        .counterfactuals(lease(&mut kv, 2), &tokens, &edits, None, 5)
        .unwrap();
    assert_eq!(cf.edits.len(), 3);
    let same = &cf.edits[0];
    assert_eq!((same.kl, same.tracked_logprob), (0.0, cf.tracked_logprob));
    assert_eq!(same.top, cf.top);
    // From the dropped position on, exactly (the cache shares a block part-way).
    assert_eq!(cf.edits[1].computed, n - 1 - late);
    assert!(cf.edits[2].computed >= n - 2);
    assert!(cf.edits[1].kl > 0.0 && cf.edits[2].kl > 0.0);

    let mut dropped = tokens.clone();
    dropped.remove(late);
    let fresh = engine.logit_lens(&dropped, 5).unwrap();
    let last = fresh.layers.last().unwrap();
    assert_eq!(
        cf.edits[1].top, last.top,
        "the dropped context's distribution"
    );
    assert!(!kv.has_sequence(2));
    assert_eq!(kv.used_blocks(), 0);

    // Bad edits are refused before anything runs.
    for bad in [vec![(n, Edit::Drop)], vec![(0, Edit::Replace(u32::MAX))]] {
        assert!(engine
            .counterfactuals(lease(&mut kv, 3), &tokens, &bad, None, 5)
            .is_err());
    }
    assert!(engine
        .counterfactuals(lease(&mut kv, 3), &tokens[..1], &[(0, Edit::Drop)], None, 5)
        .is_err());
}
