//! Errors.

use super::*;

/// After a failed call, the cache holds what it held before: sequence 0 continues exactly as
/// a fresh run would.
fn assert_usable(model: &mut Model, kv: &mut KvCache, prefix: &[u32], what: &str) {
    assert_eq!(
        kv.seq_len(0).unwrap(),
        prefix.len(),
        "{what}: length changed"
    );
    let next = tokens(3, 15);
    let got = extend(model, kv, 0, &next, prefix.len());
    let fresh = prefill(model, &[prefix, &next[..]].concat(), Precision::Exact);
    assert_same(
        &got,
        tail(&fresh, prefix.len()),
        &format!("{what}: cache corrupted"),
    );
    kv.truncate(0, prefix.len()).unwrap();
}

#[test]
fn bad_batches_are_errors_and_leave_the_cache_usable() {
    let mut model = model_of(&SyntheticSpec::gemma3_tiny());
    let prefix = tokens(6, 16);
    let mut kv = model.new_kv_cache(32, Precision::Exact).unwrap();
    kv.add_sequence(0).unwrap();
    extend(&mut model, &mut kv, 0, &prefix, 0);
    let mut logits = vec![1.0; 5];

    // A token outside the vocabulary (after a valid row, which must not be applied either).
    let mut b = Batch::new();
    b.push(0, 1, 6, true);
    b.push(0, VOCAB_SIZE as u32, 7, true);
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::TokenOutOfRange { id, vocab_size } if id == VOCAB_SIZE as u32 && vocab_size == VOCAB_SIZE),
        "{e}"
    );
    assert!(
        logits.is_empty(),
        "logits of a failed call must not be left behind"
    );
    assert_usable(&mut model, &mut kv, &prefix, "token out of range");
    let e = model
        .forward(
            &Batch::prompt(0, &[u32::MAX], 6, true),
            &mut kv,
            Precision::Exact,
            &mut logits,
        )
        .unwrap_err();
    assert!(matches!(e, ModelError::TokenOutOfRange { .. }), "{e}");

    // A gap in positions: inside the batch, and between the cache and the batch.
    let mut b = Batch::new();
    b.push(0, 1, 6, false);
    b.push(0, 2, 8, true);
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(matches!(e, ModelError::BadBatch { row: 1, .. }), "{e}");
    assert_usable(&mut model, &mut kv, &prefix, "gap inside the batch");
    let e = model
        .forward(
            &Batch::prompt(0, &[1, 2], 9, true),
            &mut kv,
            Precision::Exact,
            &mut logits,
        )
        .unwrap_err();
    assert!(matches!(e, ModelError::BadBatch { row: 0, .. }), "{e}");
    // Rewriting an already cached position, or going backwards.
    let e = model
        .forward(
            &Batch::prompt(0, &[1], 3, true),
            &mut kv,
            Precision::Exact,
            &mut logits,
        )
        .unwrap_err();
    assert!(matches!(e, ModelError::BadBatch { .. }), "{e}");
    let mut b = Batch::new();
    b.push(0, 1, 6, false);
    b.push(0, 2, 6, true);
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(matches!(e, ModelError::BadBatch { row: 1, .. }), "{e}");
    assert_usable(&mut model, &mut kv, &prefix, "repeated position");

    // An unknown sequence (after a valid row of a known one).
    let mut b = Batch::new();
    b.push(0, 1, 6, true);
    b.push(42, 1, 0, true);
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::Kv(KvError::UnknownSequence(42))),
        "{e}"
    );
    assert_usable(&mut model, &mut kv, &prefix, "unknown sequence");

    // Cache operations on unknown sequences.
    assert_eq!(kv.fork(42, 43), Err(KvError::UnknownSequence(42)));
    assert_eq!(kv.fork(0, 0), Err(KvError::SequenceExists(0)));
    assert_eq!(kv.truncate(42, 0), Err(KvError::UnknownSequence(42)));
    assert_eq!(kv.add_sequence(0), Err(KvError::SequenceExists(0)));

    // An empty batch is fine and changes nothing.
    model
        .forward(&Batch::new(), &mut kv, Precision::Exact, &mut logits)
        .unwrap();
    assert!(logits.is_empty());
    assert_usable(&mut model, &mut kv, &prefix, "empty batch");
}

#[test]
fn a_full_cache_is_an_error_and_leaves_the_cache_usable() {
    for spec in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        let mut model = model_of(&spec);
        // Two blocks of 16 positions.
        let mut kv = model.new_kv_cache(32, Precision::Exact).unwrap();
        assert_eq!(kv.total_blocks(), 2);
        kv.add_sequence(0).unwrap();
        let prefix = tokens(20, 17);
        extend(&mut model, &mut kv, 0, &prefix, 0);
        let mut logits = Vec::new();
        let e = model
            .forward(
                &Batch::prompt(0, &tokens(13, 18), 20, true),
                &mut kv,
                Precision::Exact,
                &mut logits,
            )
            .unwrap_err();
        assert!(
            matches!(
                e,
                ModelError::Kv(KvError::OutOfBlocks {
                    needed: 1,
                    free: 0,
                    ..
                })
            ),
            "{e}"
        );
        assert_usable(&mut model, &mut kv, &prefix, "full cache");
        // Filling it exactly works.
        let rest = tokens(12, 19);
        let got = extend(&mut model, &mut kv, 0, &rest, 20);
        let fresh = prefill(
            &mut model,
            &[prefix.clone(), rest].concat(),
            Precision::Exact,
        );
        assert_same(&got, tail(&fresh, 20), "logits");
        // A fork that writes into its shared last block needs a copy: no room.
        kv.truncate(0, 20).unwrap();
        kv.fork(0, 1).unwrap();
        let e = model
            .forward(
                &Batch::prompt(1, &[5], 20, true),
                &mut kv,
                Precision::Exact,
                &mut logits,
            )
            .unwrap_err();
        assert!(
            matches!(e, ModelError::Kv(KvError::OutOfBlocks { .. })),
            "{e}"
        );
        assert_eq!(kv.seq_len(1).unwrap(), 20);
        kv.remove_sequence(1).unwrap();
        assert_usable(&mut model, &mut kv, &prefix, "fork without room");
    }
}

/// A batch in which one sequence's reservation succeeds and a later one's fails must not leave
/// the cache in a state where a fork and two continuations share a block they both write.
#[test]
fn a_failed_multi_sequence_batch_then_fork_keeps_sequences_apart() {
    let spec = SyntheticSpec::llama_tiny();
    let mut model = model_of(&spec);
    // Three blocks: sequence 0 fills one exactly, sequence 1 one, one block free.
    let mut kv = model.new_kv_cache(48, Precision::Exact).unwrap();
    kv.add_sequence(0).unwrap();
    kv.add_sequence(1).unwrap();
    let p0 = tokens(16, 20);
    let p1 = tokens(16, 21);
    extend(&mut model, &mut kv, 0, &p0, 0);
    extend(&mut model, &mut kv, 1, &p1, 0);
    // Sequence 0 needs the free block, sequence 1 needs two: out of blocks.
    let mut b = Batch::new();
    b.push(0, 7, 16, true);
    for (i, &t) in tokens(17, 22).iter().enumerate() {
        b.push(1, t, 16 + i, true);
    }
    let mut logits = Vec::new();
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::Kv(KvError::OutOfBlocks { .. })),
        "{e}"
    );
    assert_eq!(kv.seq_len(0).unwrap(), 16);
    // Free sequence 1 to make room, fork 0, and continue both with different tokens.
    kv.remove_sequence(1).unwrap();
    kv.fork(0, 2).unwrap();
    let x = tokens(3, 23);
    let y = tokens(3, 24);
    let lx = extend(&mut model, &mut kv, 0, &x, 16);
    let ly = extend(&mut model, &mut kv, 2, &y, 16);
    let lx2 = extend(&mut model, &mut kv, 0, &[9], 19);
    let fresh_x = prefill(
        &mut model,
        &[p0.clone(), x.clone(), vec![9]].concat(),
        Precision::Exact,
    );
    let fresh_y = prefill(&mut model, &[p0.clone(), y].concat(), Precision::Exact);
    assert_same(&ly, tail(&fresh_y, 16), "fork");
    assert_same(
        &[lx, lx2].concat(),
        tail(&fresh_x, 16),
        "original: the fork overwrote its keys",
    );
}

/// A row's logits do not depend on the number of threads: one pass, token by token, and any
/// thread count give the same bits.
#[test]
fn thread_count_does_not_change_logits() {
    let toks = tokens(19, 6);
    for base in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        for (ty, precision) in [
            (GgmlType::Q8_0, Precision::Fast),
            (GgmlType::Q4_1, Precision::Fast),
            (GgmlType::Q4_0, Precision::Exact),
        ] {
            let spec = spec_with(base.clone(), ty, base.tied_output);
            let what = format!("{} {ty} {precision:?}", spec.architecture);
            let mut one = Model::from_file(file_of(&spec), 1).unwrap();
            let reference = prefill(&mut one, &toks, precision);
            for threads in [2, 3] {
                let mut many = Model::from_file(file_of(&spec), threads).unwrap();
                assert_same(
                    &prefill(&mut many, &toks, precision),
                    &reference,
                    &format!("{what}: prefill on {threads} threads vs 1"),
                );
                assert_same(
                    &decode_one_by_one(&mut many, &toks, precision),
                    &reference,
                    &format!("{what}: decode on {threads} threads vs prefill on 1"),
                );
            }
        }
    }
}

/// Profiling times every stage without changing a bit of the output, and counts the passes,
/// rows and arithmetic it covered.
#[test]
fn profiling_reports_every_stage_and_changes_nothing() {
    use rill_model::Stage;
    for spec in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        let mut model = model_of(&spec);
        let toks = tokens(SEQ_LEN, 3);
        let plain = prefill(&mut model, &toks, Precision::Fast);
        assert!(model.stage_times().is_none());
        model.set_profiling(true);
        let profiled = prefill(&mut model, &toks, Precision::Fast);
        assert_same(&profiled, &plain, "logits with profiling on");
        let p = model.stage_times().expect("profiling is on").clone();
        assert_eq!((p.passes, p.rows), (1, SEQ_LEN as u64));
        let cfg = model.config();
        let (d, layers) = (cfg.d_model as u64, cfg.n_layers as u64);
        assert_eq!(
            p.flops(Stage::Down),
            2 * SEQ_LEN as u64 * layers * cfg.ffn_dim as u64 * d
        );
        assert_eq!(
            p.flops(Stage::Head),
            2 * SEQ_LEN as u64 * d * cfg.vocab_size as u64
        );
        assert!(p.flops(Stage::Attention) > 0);
        for stage in [Stage::Qkv, Stage::Attention, Stage::GateUp, Stage::Down] {
            assert!(p.time(stage).as_nanos() > 0, "{} untimed", stage.name());
        }
        model.reset_stage_times();
        assert_eq!(model.stage_times().unwrap().passes, 0);
        model.set_profiling(false);
        assert!(model.stage_times().is_none());
    }
}
