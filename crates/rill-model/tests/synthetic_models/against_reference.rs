//! Against the reference.

use super::*;

fn check_against_reference(spec: &SyntheticSpec) {
    let file = file_of(spec);
    let reference = Reference::new(spec, &file);
    let mut model = Model::from_file(file, 2).unwrap();
    let toks = tokens(SEQ_LEN, 1);
    let want = reference.forward(&toks);
    let tol = tolerance(&want);
    assert!(tol > 1e-4, "logits are degenerate");
    let got = prefill(&mut model, &toks, Precision::Exact);
    assert_close(
        &format!(
            "{} {} tied={}",
            spec.architecture, spec.weight_type, spec.tied_output
        ),
        &got,
        &want,
        tol,
    );
}

#[test]
fn llama_matches_the_reference() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        for tied in [false, true] {
            check_against_reference(&spec_with(SyntheticSpec::llama_tiny(), ty, tied));
        }
    }
}

#[test]
fn gemma3_matches_the_reference() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        for tied in [false, true] {
            check_against_reference(&spec_with(SyntheticSpec::gemma3_tiny(), ty, tied));
        }
    }
}

#[test]
fn gemma3_with_an_explicit_local_rope_base_and_other_window_matches_the_reference() {
    let spec = SyntheticSpec {
        rope_freq_base_swa: Some(500.0),
        sliding_window: Some(5),
        sliding_window_pattern: 2,
        n_layers: 4,
        ..SyntheticSpec::gemma3_tiny()
    };
    check_against_reference(&spec);
}

#[test]
fn a_window_at_least_the_sequence_changes_nothing() {
    // With the window covering the whole sequence, sliding layers equal global ones except
    // for their RoPE base: set that equal too, and the result equals a model without windows.
    let spec = SyntheticSpec {
        sliding_window: Some(SEQ_LEN),
        rope_freq_base_swa: Some(1_000_000.0),
        ..SyntheticSpec::gemma3_tiny()
    };
    let no_window = SyntheticSpec {
        sliding_window: None,
        ..spec.clone()
    };
    let toks = tokens(SEQ_LEN, 2);
    let a = prefill(&mut model_of(&spec), &toks, Precision::Exact);
    let b = prefill(&mut model_of(&no_window), &toks, Precision::Exact);
    assert_same(&a, &b, "logits");
}

/// Each feature, switched off in the reference, makes it disagree with rill by far more than
/// the tolerance: the synthetic models really exercise all of them.
#[test]
fn every_feature_matters() {
    type Tweak = fn(&mut RefConfig);
    let gemma: [(&str, Tweak); 8] = [
        ("adjacent rope", |c| c.rope_neox = false),
        ("no sliding window", |c| c.window = None),
        ("one rope base", |c| c.rope_base_local = c.rope_base),
        ("silu", |c| c.gelu = false),
        ("no embedding scale", |c| c.embed_scale = false),
        ("no qk norm", |c| c.qk_norm = false),
        ("no post norms", |c| c.post_norms = false),
        ("window pattern off by one", |c| c.pattern += 1),
    ];
    let llama: [(&str, Tweak); 2] = [
        ("neox rope", |c| c.rope_neox = true),
        ("gelu", |c| c.gelu = true),
    ];
    for (spec, tweaks) in [
        (SyntheticSpec::gemma3_tiny(), &gemma[..]),
        (SyntheticSpec::llama_tiny(), &llama[..]),
    ] {
        let file = file_of(&spec);
        let mut reference = Reference::new(&spec, &file);
        let mut model = Model::from_file(file, 2).unwrap();
        let toks = tokens(SEQ_LEN, 3);
        let got = prefill(&mut model, &toks, Precision::Exact);
        let tol = tolerance(&reference.forward(&toks));
        let original = reference.cfg.clone();
        for (what, tweak) in tweaks {
            tweak(&mut reference.cfg);
            let want: Vec<f64> = reference.forward(&toks).into_iter().flatten().collect();
            let diff = max_diff(&got, &want);
            assert!(
                diff > 100.0 * tol,
                "{}: reference with {what} still agrees (diff {diff:e}, tol {tol:e})",
                spec.architecture
            );
            reference.cfg = original.clone();
        }
        // The GQA mapping: query head h reads KV head h / group, not h % n_kv.
        if spec.n_kv_heads > 1 {
            let mut swapped = Reference::new(&spec, &file_of(&spec));
            for l in &mut swapped.layers {
                // Swap the two KV heads of K: equivalent to a different head mapping.
                let hd = spec.head_dim;
                let cols = l.wk.cols;
                let (a, b) = l.wk.w.split_at_mut(hd * cols);
                a.swap_with_slice(&mut b[..hd * cols]);
            }
            let want: Vec<f64> = swapped.forward(&toks).into_iter().flatten().collect();
            assert!(
                max_diff(&got, &want) > 100.0 * tol,
                "KV head mapping does not matter"
            );
        }
    }
}
