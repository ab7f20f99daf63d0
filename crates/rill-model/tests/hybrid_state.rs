//! The recurrent layers' state (Qwen3.5's Gated DeltaNet, LFM2's short convolutions) under
//! everything the engine does to a sequence, on the tiny random models, at lengths several times
//! a block: bits that do not depend on how a prompt is split into passes or on what shares the
//! batch, rollbacks to a snapshot or checkpoint, forks, the prefix cache's stored snapshots, and
//! slots given back when sequences go.

use std::path::PathBuf;

use rill_model::{Batch, KvCache, Model, Precision, SeqId};

const MODELS: [&str; 5] = [
    "qwen35-tiny",
    "lfm2-tiny",
    "qwen35moe-tiny",
    "granitehybrid-tiny",
    "lfm2moe-tiny",
];
const PRECISIONS: [Precision; 2] = [Precision::Exact, Precision::Fast];

fn load(name: &str) -> Model {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/tiny")
        .join(name)
        .join("model.gguf");
    Model::load(&path, 2).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `n` token ids from a fixed pseudo-random walk over the vocabulary.
fn tokens(n: usize, seed: u64, vocab: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// Runs `toks` for `seq` from its current length in passes of the given sizes, every row's
/// logits returned in order.
fn run(
    model: &mut Model,
    kv: &mut KvCache,
    seq: SeqId,
    toks: &[u32],
    passes: &[usize],
    precision: Precision,
) -> Vec<f32> {
    let mut all = Vec::new();
    let mut at = 0;
    let mut logits = Vec::new();
    for &n in passes {
        let start = kv.seq_len(seq).unwrap();
        let batch = Batch::prompt(seq, &toks[at..at + n], start, true);
        model.forward(&batch, kv, precision, &mut logits).unwrap();
        all.extend_from_slice(&logits);
        at += n;
    }
    assert_eq!(at, toks.len());
    all
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn fresh(model: &Model, precision: Precision, seqs: &[SeqId]) -> KvCache {
    let mut kv = model.new_kv_cache(512, precision).unwrap();
    for &s in seqs {
        kv.add_sequence(s).unwrap();
    }
    kv
}

/// A 100-token prompt (six blocks and a bit) gives the same bits however it is cut into passes:
/// whole, after one token, at a block boundary, mid-block, in fives, token by token.
#[test]
fn a_prompt_split_into_passes_any_way_gives_the_same_bits() {
    for name in MODELS {
        let mut model = load(name);
        let vocab = model.config().vocab_size;
        let toks = tokens(100, 1, vocab);
        for precision in PRECISIONS {
            let mut kv = fresh(&model, precision, &[0]);
            let whole = run(&mut model, &mut kv, 0, &toks, &[100], precision);
            for passes in [
                vec![1, 99],
                vec![16, 84],
                vec![37, 63],
                vec![5; 20],
                vec![1; 100],
            ] {
                let mut kv = fresh(&model, precision, &[0]);
                let split = run(&mut model, &mut kv, 0, &toks, &passes, precision);
                assert!(
                    bits(&split) == bits(&whole),
                    "{name} {precision:?}: passes {:?} changed the logits",
                    &passes[..passes.len().min(3)]
                );
            }
        }
    }
}

/// A sequence's rows give the same bits alone and interleaved with another sequence's rows in
/// the same passes.
#[test]
fn a_sequence_does_not_depend_on_what_shares_its_batch() {
    for name in MODELS {
        let mut model = load(name);
        let vocab = model.config().vocab_size;
        let (a, b) = (tokens(50, 2, vocab), tokens(50, 3, vocab));
        for precision in PRECISIONS {
            let mut kv = fresh(&model, precision, &[0]);
            let alone = run(&mut model, &mut kv, 0, &a, &[20, 30], precision);
            let mut kv = fresh(&model, precision, &[0, 1]);
            let mut got = Vec::new();
            let mut logits = Vec::new();
            for (start, n) in [(0, 20), (20, 30)] {
                let mut batch = Batch::new();
                // Interleaved: a row of each in turn.
                for i in start..start + n {
                    batch.push(0, a[i], i, true);
                    batch.push(1, b[i], i, true);
                }
                model
                    .forward(&batch, &mut kv, precision, &mut logits)
                    .unwrap();
                for (r, row) in logits.chunks_exact(vocab).enumerate() {
                    if r % 2 == 0 {
                        got.extend_from_slice(row);
                    }
                }
            }
            assert!(
                bits(&got) == bits(&alone),
                "{name} {precision:?}: batching changed a sequence"
            );
        }
    }
}

/// A rollback goes back to the deepest snapshot (the last block boundary crossed) or checkpoint
/// (the state after the first row of a pass of several rows) at or before the length asked for,
/// and the positions recomputed from there give the bits they had.
#[test]
fn a_rollback_resumes_from_a_snapshot_or_a_checkpoint() {
    for name in MODELS {
        let mut model = load(name);
        let vocab = model.config().vocab_size;
        let toks = tokens(70, 4, vocab);
        for precision in PRECISIONS {
            let mut kv = fresh(&model, precision, &[0]);
            let whole = run(&mut model, &mut kv, 0, &toks, &[40, 30], precision);
            // The second pass crossed 48 and 64; its first row was position 40.
            assert_eq!(kv.state_snapshots(0).unwrap(), (Some(64), Some(41)));
            // Back to 50: the checkpoint at 41 is the deepest at or before it.
            assert_eq!(kv.truncate(0, 50).unwrap(), 41);
            let again = run(&mut model, &mut kv, 0, &toks[41..], &[29], precision);
            assert!(
                bits(&again) == bits(&whole[41 * vocab..]),
                "{name}: from 41"
            );
            // Back to 66: the snapshot at 64 is the deepest.
            assert_eq!(kv.truncate(0, 66).unwrap(), 64);
            let again = run(&mut model, &mut kv, 0, &toks[64..], &[6], precision);
            assert!(
                bits(&again) == bits(&whole[64 * vocab..]),
                "{name}: from 64"
            );
            // Back to 30: nothing at or before it is kept (the first pass started at 0).
            assert_eq!(kv.truncate(0, 30).unwrap(), 0);
            let again = run(&mut model, &mut kv, 0, &toks, &[70], precision);
            assert!(bits(&again) == bits(&whole), "{name}: from 0");
        }
    }
}

/// Forks copy the state: each branch decodes what the same tokens give alone.
#[test]
fn forks_copy_the_state() {
    for name in MODELS {
        let mut model = load(name);
        let vocab = model.config().vocab_size;
        let prompt = tokens(40, 5, vocab);
        let (x, y) = (tokens(20, 6, vocab), tokens(20, 7, vocab));
        for precision in PRECISIONS {
            let mut kv = fresh(&model, precision, &[0]);
            run(&mut model, &mut kv, 0, &prompt, &[40], precision);
            kv.fork(0, 1).unwrap();
            let branch_x = run(&mut model, &mut kv, 0, &x, &[1; 20], precision);
            let branch_y = run(&mut model, &mut kv, 1, &y, &[1; 20], precision);
            for (cont, got) in [(&x, branch_x), (&y, branch_y)] {
                let mut kv = fresh(&model, precision, &[9]);
                let all: Vec<u32> = prompt.iter().chain(cont.iter()).copied().collect();
                let alone = run(&mut model, &mut kv, 9, &all, &[60], precision);
                assert!(
                    bits(&got) == bits(&alone[40 * vocab..]),
                    "{name} {precision:?}: a fork differs from the sequence alone"
                );
            }
        }
    }
}

/// A published prompt keeps its state at its last block boundary: a later prompt sharing it
/// resumes from there (and from no further), with the bits of computing it whole; a prompt that
/// shares less than that block starts from nothing.
#[test]
fn the_prefix_cache_resumes_from_a_stored_snapshot() {
    for name in MODELS {
        let mut model = load(name);
        let vocab = model.config().vocab_size;
        let first = tokens(100, 8, vocab);
        let mut second = first.clone();
        second.extend(tokens(20, 9, vocab));
        for precision in PRECISIONS {
            let mut kv = fresh(&model, precision, &[0]);
            run(&mut model, &mut kv, 0, &first, &[100], precision);
            kv.publish_prefix(0, &first).unwrap();
            kv.remove_sequence(0).unwrap();
            assert_eq!(kv.stored_snapshots(), 1);

            kv.add_sequence(1).unwrap();
            let hit = kv.attach_prefix(1, &second[..119]).unwrap();
            assert_eq!(hit, 96, "{name}: the snapshot after block 6");
            let resumed = run(&mut model, &mut kv, 1, &second[96..], &[24], precision);
            let mut whole_kv = fresh(&model, precision, &[2]);
            let whole = run(&mut model, &mut whole_kv, 2, &second, &[120], precision);
            assert!(
                bits(&resumed) == bits(&whole[96 * vocab..]),
                "{name} {precision:?}: resuming from the snapshot changed the logits"
            );

            // Shares 50 positions: three blocks are cached, but no state after any of them.
            let mut other = first[..50].to_vec();
            other.extend(tokens(30, 10, vocab));
            kv.add_sequence(3).unwrap();
            assert_eq!(kv.attach_prefix(3, &other).unwrap(), 0);
        }
    }
}

/// Sequences that go give their slots back; a full arena is an error, not an overwrite.
#[test]
fn state_slots_come_back_and_run_out_cleanly() {
    let model = load("qwen35-tiny");
    let mut kv = model.new_kv_cache(256, Precision::Exact).unwrap();
    let shape = kv.recurrent().expect("a hybrid model").clone();
    assert_eq!(shape.n_recurrent(), 3);
    let free = kv.free_states();
    assert_eq!(free, KvCache::DEFAULT_STATE_SEQUENCES);
    for round in 0..3 {
        for s in 0..free as SeqId {
            kv.add_sequence(s).unwrap();
        }
        assert_eq!(kv.free_states(), 0);
        let err = kv.add_sequence(1000).unwrap_err();
        assert!(
            err.to_string().contains("recurrent-state arena is full"),
            "{err}"
        );
        assert!(kv.fork(0, 1001).is_err());
        for s in 0..free as SeqId {
            kv.remove_sequence(s).unwrap();
        }
        assert_eq!(kv.free_states(), free, "round {round}");
    }
    // Only the attention layer keeps keys and values.
    let per_layer = kv.types().bytes_per_token(1, model.config().kv_dim());
    assert_eq!(kv.bytes_per_token(), per_layer);
    assert_eq!(kv.n_kv_layers(), 1);
    assert!(kv.state_bytes_per_sequence() >= 2 * shape.state_bytes());
}

/// A cache without the recurrent state (made by hand for the attention layers only) is refused
/// before anything is computed or written, and so is one made for another model.
#[test]
fn a_cache_without_the_models_state_is_refused_before_anything_is_written() {
    let mut model = load("qwen35-tiny");
    let c = model.config().clone();
    let mut kv = KvCache::new(
        c.n_layers,
        c.n_kv_heads,
        c.head_dim,
        64,
        16,
        rill_model::KvDtype::F32,
    )
    .unwrap();
    kv.add_sequence(0).unwrap();
    let mut logits = Vec::new();
    let err = model
        .forward(
            &Batch::prompt(0, &[1, 2, 3], 0, true),
            &mut kv,
            Precision::Exact,
            &mut logits,
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("the cache keeps no state"),
        "{err}"
    );
    assert_eq!(kv.seq_len(0).unwrap(), 0);
    // LFM2's cache (other layers recurrent, other sizes) for Qwen3.5.
    let lfm2 = load("lfm2-tiny");
    let mut other = lfm2.new_kv_cache(64, Precision::Exact).unwrap();
    other.add_sequence(0).unwrap();
    assert!(model
        .forward(
            &Batch::prompt(0, &[1, 2, 3], 0, true),
            &mut other,
            Precision::Exact,
            &mut logits
        )
        .is_err());
}
