//! The KV cache.

use super::*;

#[test]
fn fork_then_diverge_equals_fresh_sequences() {
    for spec in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        let mut model = model_of(&spec);
        // Prefixes ending inside a block, on a block boundary, and past one.
        for prefix_len in [5, 16, 20] {
            let prefix = tokens(prefix_len, 9);
            let x = tokens(7, 10);
            let y = tokens(4, 11);
            let mut kv = model.new_kv_cache(96, Precision::Exact).unwrap();
            kv.add_sequence(1).unwrap();
            extend(&mut model, &mut kv, 1, &prefix, 0);
            kv.fork(1, 2).unwrap();
            // Interleave the continuations, one row of each per call at first.
            let mut lx = extend(&mut model, &mut kv, 2, &y[..1], prefix_len);
            let mut l1 = extend(&mut model, &mut kv, 1, &x[..1], prefix_len);
            l1.extend(extend(&mut model, &mut kv, 1, &x[1..], prefix_len + 1));
            lx.extend(extend(&mut model, &mut kv, 2, &y[1..], prefix_len + 1));
            let fresh_x = prefill(
                &mut model,
                &[prefix.clone(), x.clone()].concat(),
                Precision::Exact,
            );
            let fresh_y = prefill(
                &mut model,
                &[prefix.clone(), y.clone()].concat(),
                Precision::Exact,
            );
            let what = format!("{} prefix {prefix_len}", spec.architecture);
            assert_same(
                &l1,
                tail(&fresh_x, prefix_len),
                &format!("{what}: original after fork"),
            );
            assert_same(&lx, tail(&fresh_y, prefix_len), &format!("{what}: fork"));
            // A second fork of the original, continued with y, also equals the fresh run.
            kv.fork(1, 3).unwrap();
            kv.truncate(3, prefix_len).unwrap();
            let l3 = extend(&mut model, &mut kv, 3, &y, prefix_len);
            assert_same(
                &l3,
                tail(&fresh_y, prefix_len),
                &format!("{what}: fork of a longer sequence, truncated"),
            );
            // And the original is still intact.
            let more = tokens(3, 12);
            let l1b = extend(&mut model, &mut kv, 1, &more, prefix_len + x.len());
            let fresh = prefill(
                &mut model,
                &[prefix.clone(), x.clone(), more].concat(),
                Precision::Exact,
            );
            assert_same(
                &l1b,
                tail(&fresh, prefix_len + x.len()),
                &format!("{what}: original after its forks"),
            );
        }
    }
}

#[test]
fn truncate_and_recompute() {
    for spec in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        let mut model = model_of(&spec);
        let toks = tokens(22, 13);
        let full = prefill(&mut model, &toks, Precision::Exact);
        let mut kv = model.new_kv_cache(32, Precision::Exact).unwrap();
        kv.add_sequence(0).unwrap();
        extend(&mut model, &mut kv, 0, &toks, 0);
        for keep in [17, 16, 9, 0] {
            kv.truncate(0, keep).unwrap();
            assert_eq!(kv.seq_len(0).unwrap(), keep);
            // The same tokens again: the same logits.
            let again = extend(&mut model, &mut kv, 0, &toks[keep..], keep);
            assert_same(
                &again,
                tail(&full, keep),
                &format!("{} keep {keep}", spec.architecture),
            );
            // Different tokens: the logits of a fresh run of the edited sequence.
            kv.truncate(0, keep).unwrap();
            let other = tokens(22 - keep, 14);
            let edited = extend(&mut model, &mut kv, 0, &other, keep);
            let fresh = prefill(
                &mut model,
                &[&toks[..keep], &other[..]].concat(),
                Precision::Exact,
            );
            assert_same(
                &edited,
                tail(&fresh, keep),
                &format!("{} keep {keep}, edited", spec.architecture),
            );
            kv.truncate(0, keep).unwrap();
            extend(&mut model, &mut kv, 0, &toks[keep..], keep);
        }
        // Every block comes back when the sequence goes.
        kv.remove_sequence(0).unwrap();
        assert_eq!(kv.free_blocks(), kv.total_blocks());
    }
}
