//! Prefill, decode, chunks.

use super::*;

fn chunked(model: &mut Model, toks: &[u32], sizes: &[usize], precision: Precision) -> Vec<f32> {
    let mut kv = model.new_kv_cache(toks.len(), precision).unwrap();
    kv.add_sequence(0).unwrap();
    let mut all = Vec::new();
    let mut logits = Vec::new();
    let mut pos = 0;
    for &n in sizes {
        let b = Batch::prompt(0, &toks[pos..pos + n], pos, true);
        model.forward(&b, &mut kv, precision, &mut logits).unwrap();
        assert_eq!(logits.len(), n * VOCAB_SIZE);
        all.extend_from_slice(&logits);
        pos += n;
    }
    assert_eq!(pos, toks.len());
    all
}

#[test]
fn prefill_decode_and_chunks_agree() {
    // 21 tokens: more than a KV block (16), so chunks cross a block boundary.
    let toks = tokens(21, 4);
    for base in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        for (ty, precision) in [
            (GgmlType::F32, Precision::Exact),
            (GgmlType::Q4_0, Precision::Exact),
            (GgmlType::Q8_0, Precision::Fast),
            (GgmlType::Q4_0, Precision::Fast),
        ] {
            let spec = spec_with(base.clone(), ty, base.tied_output);
            let file = file_of(&spec);
            let reference = Reference::new(&spec, &file);
            let tol = tolerance(&reference.forward(&toks));
            let mut model = Model::from_file(file, 2).unwrap();
            let what = format!("{} {ty} {precision:?}", spec.architecture);
            let whole = prefill(&mut model, &toks, precision);
            let one_by_one = decode_one_by_one(&mut model, &toks, precision);
            let chunks = chunked(&mut model, &toks, &[5, 1, 9, 2, 4], precision);
            assert_close_f32(
                &format!("{what}: decode vs prefill"),
                &one_by_one,
                &whole,
                tol,
            );
            assert_close_f32(&format!("{what}: chunks vs prefill"), &chunks, &whole, tol);
            // Rows are independent of their batch, so these agree exactly.
            assert_same(
                &one_by_one,
                &whole,
                &format!("{what}: decode vs prefill not bit-identical"),
            );
            assert_same(
                &chunks,
                &whole,
                &format!("{what}: chunks vs prefill not bit-identical"),
            );
        }
    }
}

#[test]
fn logits_only_for_rows_that_ask() {
    let mut model = model_of(&SyntheticSpec::gemma3_tiny());
    let toks = tokens(8, 5);
    let all = prefill(&mut model, &toks, Precision::Exact);
    let mut kv = model.new_kv_cache(8, Precision::Exact).unwrap();
    kv.add_sequence(0).unwrap();
    let mut b = Batch::new();
    for (pos, &t) in toks.iter().enumerate() {
        b.push(0, t, pos, pos % 3 == 1);
    }
    let mut logits = Vec::new();
    model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap();
    let want: Vec<f32> = [1, 4, 7]
        .iter()
        .flat_map(|&p| all[p * VOCAB_SIZE..(p + 1) * VOCAB_SIZE].to_vec())
        .collect();
    assert_same(&logits, &want, "logits");
    // No logits at all: an empty output, but the cache advanced.
    let mut b = Batch::new();
    b.push(0, 3, 8, false);
    model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap();
    assert!(logits.is_empty());
    assert_eq!(kv.seq_len(0).unwrap(), 9);
}
