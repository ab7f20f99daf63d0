//! Batch invariance.

use super::*;

/// Runs sequences 0 (`a`), 1 (`b`) and 2 (`c`) interleaved: a first batch with every prompt's
/// rows alternating, then decode steps with one row per sequence. Returns sequence 0's logits.
fn interleaved(
    model: &mut Model,
    a: &[u32],
    b: &[u32],
    c: &[u32],
    split: usize,
    precision: Precision,
) -> Vec<f32> {
    let mut kv = model.new_kv_cache(64, precision).unwrap();
    let seqs = [a, b, c];
    for s in 0..3 {
        kv.add_sequence(s).unwrap();
    }
    let mut out = Vec::new();
    let mut logits = Vec::new();
    // Prefill: the first `split` tokens of each, rows interleaved.
    let mut batch = Batch::new();
    for i in 0..split {
        for (s, toks) in seqs.iter().enumerate() {
            if i < toks.len() {
                batch.push(s as u64, toks[i], i, true);
            }
        }
    }
    model
        .forward(&batch, &mut kv, precision, &mut logits)
        .unwrap();
    for (k, row) in batch.rows.iter().enumerate() {
        if row.seq == 0 {
            out.extend_from_slice(&logits[k * VOCAB_SIZE..(k + 1) * VOCAB_SIZE]);
        }
    }
    // Decode: one row per sequence per step, sequence 0 in the middle.
    for i in split..a.len() {
        let mut batch = Batch::new();
        for s in [1usize, 0, 2] {
            if let Some(&t) = seqs[s].get(i) {
                batch.push(s as u64, t, i, true);
            }
        }
        model
            .forward(&batch, &mut kv, precision, &mut logits)
            .unwrap();
        let at = batch.rows.iter().position(|r| r.seq == 0).unwrap();
        out.extend_from_slice(&logits[at * VOCAB_SIZE..(at + 1) * VOCAB_SIZE]);
    }
    out
}

/// Sequence 0's logits alone equal those computed beside other sequences, in prefill batches
/// split anywhere and in decode steps, bit for bit.
fn assert_batch_invariant(model: &mut Model, precision: Precision, what: &str) {
    let a = tokens(14, 6);
    let b = tokens(17, 7);
    let c = tokens(9, 8);
    let alone = prefill(model, &a, precision);
    for split in [1, 6, 14] {
        let mixed = interleaved(model, &a, &b, &c, split, precision);
        assert_eq!(alone.len(), mixed.len());
        let first = alone
            .iter()
            .zip(&mixed)
            .position(|(x, y)| x.to_bits() != y.to_bits());
        assert!(
            first.is_none(),
            "{what}, split {split}: differs at logit {first:?}"
        );
    }
}

#[test]
fn batch_invariance() {
    for base in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        for (ty, precision) in [
            (GgmlType::F32, Precision::Exact),
            (GgmlType::Q8_0, Precision::Exact),
            (GgmlType::Q8_0, Precision::Fast),
            (GgmlType::Q4_0, Precision::Fast),
            (GgmlType::Q4_1, Precision::Fast),
        ] {
            let spec = spec_with(base.clone(), ty, base.tied_output);
            let mut model = model_of(&spec);
            let what = format!("{} {ty} {precision:?}", spec.architecture);
            assert_batch_invariant(&mut model, precision, &what);
        }
    }
}

/// Logits of every position of `toks`, computed in passes of the given sizes (a size of 1
/// is a decode step), sequence 0 sharing each pass with rows of sequence 1.
fn in_passes(model: &mut Model, toks: &[u32], passes: &[usize], precision: Precision) -> Vec<f32> {
    let other = tokens(toks.len(), 99);
    let mut kv = model.new_kv_cache(2 * toks.len() + 32, precision).unwrap();
    kv.add_sequence(0).unwrap();
    kv.add_sequence(1).unwrap();
    let (mut out, mut logits, mut at) = (Vec::new(), Vec::new(), 0);
    for &n in passes.iter().cycle() {
        if at == toks.len() {
            break;
        }
        let n = n.min(toks.len() - at);
        let mut batch = Batch::new();
        for i in at..at + n {
            batch.push(1, other[i], i, false);
            batch.push(0, toks[i], i, true);
        }
        model
            .forward(&batch, &mut kv, precision, &mut logits)
            .unwrap();
        out.extend_from_slice(&logits);
        at += n;
    }
    out
}

/// Past one block of keys (the fast path's tiled attention takes 64 at a time, with an online
/// softmax) a row still gets the same bits however its prompt is split into passes, whatever
/// shares them, and in decode steps; sliding windows (Gemma 3's) skip whole blocks.
/// Past one chunk of keys too (600 positions: a decoding row's chunks of 256 are reduced on
/// different threads and merged after, a prompt's in turn within its tile).
#[test]
fn batch_invariance_across_key_blocks() {
    let toks = tokens(600, 21);
    for (spec, kv_types) in [
        (SyntheticSpec::llama_tiny(), None),
        (SyntheticSpec::gemma3_tiny(), None),
        (SyntheticSpec::gemma3_tiny(), Some(KvDtype::Q8_0.into())),
    ] {
        let spec = SyntheticSpec {
            sliding_window: spec.sliding_window.map(|_| 300),
            context_length: 1024,
            ..spec_with(spec, GgmlType::Q8_0, true)
        };
        let mut model = model_of(&spec);
        model.set_kv_types(kv_types).unwrap();
        for precision in [Precision::Fast, Precision::Exact] {
            let whole = in_passes(&mut model, &toks, &[600], precision);
            for passes in [&[70, 61, 69][..], &[430, 1], &[1], &[17, 3, 64]] {
                let split = in_passes(&mut model, &toks, passes, precision);
                let first = whole
                    .iter()
                    .zip(&split)
                    .position(|(x, y)| x.to_bits() != y.to_bits());
                assert!(
                    first.is_none(),
                    "{} {kv_types:?} {precision:?} passes {passes:?}: differs at logit {first:?}",
                    spec.architecture
                );
            }
        }
    }
}

/// A quantized KV cache keeps batch invariance: keys and values are quantized per position
/// and read back the same whatever shares the batch.
#[test]
fn batch_invariance_with_quantized_kv() {
    let spec = spec_with(SyntheticSpec::gemma3_tiny(), GgmlType::Q8_0, true);
    let mut model = model_of(&spec);
    for types in [
        KvTypes::from(KvDtype::Q8_0),
        KvTypes::from(KvDtype::Q4_0),
        KvTypes {
            keys: KvDtype::Q8_0,
            values: KvDtype::F16,
        },
        KvTypes {
            keys: KvDtype::F16,
            values: KvDtype::Q4_0,
        },
    ] {
        model.set_kv_types(Some(types)).unwrap();
        for precision in [Precision::Fast, Precision::Exact] {
            assert_batch_invariant(&mut model, precision, &format!("KV {types} {precision:?}"));
        }
    }
}

/// A quantized KV cache changes the logits a little, not wholesale: against the f32 cache on
/// the same (exact) path, the relative error stays near the types' resolution.
#[test]
fn quantized_kv_is_close_to_f32() {
    let spec = spec_with(SyntheticSpec::gemma3_tiny(), GgmlType::F32, true);
    let mut model = model_of(&spec);
    let toks = tokens(20, 3);
    let exact = prefill(&mut model, &toks, Precision::Exact);
    let norm = exact.iter().map(|x| x * x).sum::<f32>().sqrt();
    let mut errors = Vec::new();
    for dtype in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        model.set_kv_types(Some(dtype.into())).unwrap();
        let got = prefill(&mut model, &toks, Precision::Exact);
        let diff = exact
            .iter()
            .zip(&got)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f32>()
            .sqrt();
        errors.push(diff / norm);
    }
    eprintln!("relative logit error f16, q8_0, q4_0: {errors:?}");
    // Each coarser type errs more, and each stays under its rounding step relative to what it
    // stores (f16: 2^-11; Q8_0: 1/127 of a block's largest value; Q4_0: 1/8 of it).
    assert!(errors[0] < errors[1] && errors[1] < errors[2], "{errors:?}");
    assert!(
        errors[0] < 2f32.powi(-11) && errors[1] < 1.0 / 127.0 && errors[2] < 1.0 / 8.0,
        "{errors:?}"
    );
}

/// Block types need heads that are whole blocks of 32: a model with heads of 16 refuses them
/// with an error that names the type, and keeps working.
#[test]
fn quantized_kv_needs_heads_of_whole_blocks() {
    let mut model = model_of(&SyntheticSpec::llama_tiny());
    let err = model
        .set_kv_types(Some(KvDtype::Q8_0.into()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("q8_0") && err.contains("16"), "{err}");
    assert_eq!(model.kv_types(Precision::Fast), KvDtype::F16.into());
    prefill(&mut model, &tokens(5, 1), Precision::Fast);
}
