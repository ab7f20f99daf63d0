//! The sliding-window cache: layers with a window keep only the blocks their next query can
//! read, in an arena of their own, while the global layers keep everything. At lengths many
//! times the window, every logit must be the same bits as with a cache that keeps every
//! position in every layer, through chunked prompts, decode steps, forks, rollbacks and the
//! prefix cache; and the window arena must stay at about one window per sequence.

#[allow(dead_code)]
mod common;

use common::{assert_bits, tokens, BS};
use rill_gguf::GgufFile;
use rill_model::synthetic::{SyntheticSpec, VOCAB_SIZE};
use rill_model::{
    Batch, KvCache, KvDtype, KvError, Model, ModelError, Precision, SlidingWindow, WindowMap,
};

const WINDOW: usize = 24;

/// Gemma 3's shape in miniature: two windowed layers, then a global one.
fn windowed_model() -> Model {
    let mut spec = SyntheticSpec::gemma3_tiny();
    spec.context_length = 2048;
    spec.sliding_window = Some(WINDOW);
    let bytes = spec.to_bytes().unwrap();
    Model::from_file(GgufFile::from_bytes(bytes).unwrap(), 2).unwrap()
}

/// Every position in every layer: the reference.
fn full_cache(model: &Model, blocks: usize, dtype: KvDtype) -> KvCache {
    let c = model.config();
    KvCache::new(c.n_layers, c.n_kv_heads, c.head_dim, blocks * BS, BS, dtype).unwrap()
}

fn windowed_cache(model: &Model, blocks: usize, window_blocks: usize, dtype: KvDtype) -> KvCache {
    let c = model.config();
    let window = SlidingWindow::of(c).unwrap();
    assert_eq!(window.layers, vec![true, true, false]);
    let shape = (c.n_layers, c.n_kv_heads, c.head_dim);
    KvCache::with_window(shape, blocks * BS, BS, dtype, window, window_blocks * BS).unwrap()
}

fn run(
    model: &mut Model,
    kv: &mut KvCache,
    seq: u64,
    toks: &[u32],
    start: usize,
    precision: Precision,
) -> Result<Vec<f32>, ModelError> {
    let mut logits = Vec::new();
    let batch = Batch::prompt(seq, toks, start, true);
    model.forward(&batch, kv, precision, &mut logits)?;
    Ok(logits)
}

/// Most window blocks one sequence holds between passes: its window, the rollback slack, the
/// block being filled and one pass of `chunk` positions.
fn window_bound(chunk: usize) -> usize {
    (WINDOW + SlidingWindow::DEFAULT_ROLLBACK_SLACK).div_ceil(BS) + 2 + chunk.div_ceil(BS)
}

fn window_map(kv: &KvCache) -> WindowMap {
    kv.block_map().window.expect("a window")
}

#[test]
fn a_long_sequence_holds_one_window_and_matches_a_full_cache() {
    let mut m = windowed_model();
    let toks = tokens(480, 3);
    for (dtype, precision) in [
        (KvDtype::F32, Precision::Exact),
        (KvDtype::F16, Precision::Fast),
        (KvDtype::Q8_0, Precision::Fast),
    ] {
        let blocks = toks.len().div_ceil(BS) + 1;
        let mut full = full_cache(&m, blocks, dtype);
        let mut windowed = windowed_cache(&m, blocks, window_bound(32), dtype);
        full.add_sequence(0).unwrap();
        windowed.add_sequence(0).unwrap();
        // A prompt in chunks of 32, then one position at a time.
        let mut at = 0;
        while at < toks.len() {
            let n = if at < 400 { 32 } else { 1 };
            let part = &toks[at..at + n];
            let want = run(&mut m, &mut full, 0, part, at, precision).unwrap();
            let got = run(&mut m, &mut windowed, 0, part, at, precision).unwrap();
            assert_bits(&got, &want, &format!("{dtype} positions {at}.."));
            at += n;
            let map = window_map(&windowed);
            let held = map.sequences[0]
                .1
                .iter()
                .filter(|&&w| w != u32::MAX)
                .count();
            assert!(
                held <= window_bound(32),
                "{dtype}: {held} window blocks at {at}"
            );
            assert_eq!(windowed.used_window_blocks(), held);
            // The sequence holds what its next query reads, and has let go of the rest.
            assert!(map.sequences[0].0 <= (at + 1).saturating_sub(WINDOW));
            let before = (at - n + 1).saturating_sub(WINDOW);
            let slack = SlidingWindow::DEFAULT_ROLLBACK_SLACK;
            assert!(map.sequences[0].0 + slack + BS > before, "{dtype} at {at}");
        }
        // The global layer keeps all of it.
        assert_eq!(windowed.used_blocks(), toks.len().div_ceil(BS));
        windowed.remove_sequence(0).unwrap();
        assert_eq!(
            windowed.free_window_blocks(),
            windowed.total_window_blocks()
        );
        assert_eq!(windowed.free_blocks(), windowed.total_blocks());
    }
}

#[test]
fn forks_and_rollbacks_across_the_window() {
    let mut m = windowed_model();
    let p = Precision::Exact;
    let mut kv = windowed_cache(&m, 400, 120, KvDtype::F32);
    let base = tokens(150, 5);
    kv.add_sequence(0).unwrap();
    for (i, chunk) in base.chunks(50).enumerate() {
        run(&mut m, &mut kv, 0, chunk, i * 50, p).unwrap();
    }
    kv.fork(0, 1).unwrap();
    let (tail0, tail1) = (tokens(100, 6), tokens(100, 7));
    // Both grow one position at a time, past several windows, writing into copies of the
    // shared partly filled block and sharing the window blocks before it.
    let mut last = (Vec::new(), Vec::new());
    for i in 0..100 {
        last.0 = run(&mut m, &mut kv, 0, &tail0[i..=i], 150 + i, p).unwrap();
        last.1 = run(&mut m, &mut kv, 1, &tail1[i..=i], 150 + i, p).unwrap();
    }
    let whole = |tail: &[u32]| [base.as_slice(), tail].concat();
    let fresh = |m: &mut Model, toks: &[u32]| {
        let mut kv = full_cache(m, toks.len().div_ceil(BS), KvDtype::F32);
        kv.add_sequence(0).unwrap();
        run(m, &mut kv, 0, toks, 0, p).unwrap()
    };
    let want0 = fresh(&mut m, &whole(&tail0));
    let want1 = fresh(&mut m, &whole(&tail1));
    assert_bits(&last.0, &want0[249 * VOCAB_SIZE..], "parent after the fork");
    assert_bits(&last.1, &want1[249 * VOCAB_SIZE..], "fork");

    // A rollback of a few positions (a rejected draft) keeps them, and continues exactly.
    assert_eq!(kv.truncate(1, 245).unwrap(), 245);
    let redo = run(&mut m, &mut kv, 1, &tail1[95..100], 245, p).unwrap();
    assert_bits(&redo, &want1[245 * VOCAB_SIZE..], "after a rollback");

    // A rollback to where the window layers no longer hold what the next query reads empties
    // the sequence (the caller computes it again), and says so.
    assert_eq!(kv.truncate(0, 40).unwrap(), 0);
    assert_eq!(kv.seq_len(0).unwrap(), 0);
    let again = run(&mut m, &mut kv, 0, &whole(&tail0), 0, p).unwrap();
    assert_bits(&again, &want0, "computed again after the deep rollback");

    for seq in [0, 1] {
        kv.remove_sequence(seq).unwrap();
    }
    assert_eq!(kv.free_window_blocks(), kv.total_window_blocks());
    assert_eq!(kv.free_blocks(), kv.total_blocks());
}

/// A finished conversation's last window stays with its published blocks, so the next turn
/// starts from all of it; a prefix that ends where the window data was let go (or reclaimed)
/// is cut back to where it is complete, and always continues exactly.
#[test]
fn the_prefix_cache_keeps_the_window_a_continuation_reads() {
    let mut m = windowed_model();
    let p = Precision::Exact;
    let history = tokens(200, 9);
    let fresh = |m: &mut Model, toks: &[u32]| {
        let mut kv = full_cache(m, toks.len().div_ceil(BS), KvDtype::F32);
        kv.add_sequence(0).unwrap();
        run(m, &mut kv, 0, toks, 0, p).unwrap()
    };
    // Roomy: every companion fits. Tight: companions are reclaimed as the first turn grows.
    for (window_blocks, roomy) in [(200, true), (window_bound(40), false)] {
        let mut kv = windowed_cache(&m, 200, window_blocks, KvDtype::F32);
        kv.add_sequence(0).unwrap();
        for (i, chunk) in history.chunks(40).enumerate() {
            run(&mut m, &mut kv, 0, chunk, i * 40, p).unwrap();
            kv.publish_prefix(0, &history[..(i + 1) * 40]).unwrap();
        }
        kv.publish_tail(0, &history).unwrap();
        kv.remove_sequence(0).unwrap();
        assert_eq!(kv.used_window_blocks(), 0);

        // The next turn: the whole history is there.
        let next = [history.as_slice(), &tokens(30, 10)].concat();
        assert_eq!(kv.lookup_prefix(&next).tokens, 200);
        kv.add_sequence(1).unwrap();
        assert_eq!(kv.attach_prefix(1, &next).unwrap(), 200);
        let got = run(&mut m, &mut kv, 1, &next[200..], 200, p).unwrap();
        let want = fresh(&mut m, &next);
        assert_bits(&got, &want[200 * VOCAB_SIZE..], "the next turn");
        kv.remove_sequence(1).unwrap();

        // An edit at position 30: the window data before it was let go as the first turn
        // grew; the cache kept it as companions while there was room (the oldest ones go
        // first when there is not).
        let edited = [&history[..30], &tokens(20, 11)[..]].concat();
        let hit = kv.lookup_prefix(&edited);
        if roomy {
            assert_eq!(hit.tokens, 30);
        } else {
            assert!(window_map(&kv).reclaims > 0);
            assert!(hit.tokens < 30, "{hit:?}");
        }
        kv.add_sequence(2).unwrap();
        let from = kv.attach_prefix(2, &edited).unwrap();
        assert_eq!(from, hit.tokens);
        let got = run(&mut m, &mut kv, 2, &edited[from..], from, p).unwrap();
        let want = fresh(&mut m, &edited);
        assert_bits(&got, &want[from * VOCAB_SIZE..], "after the edit");
        kv.remove_sequence(2).unwrap();
    }
}

#[test]
fn running_out_of_window_blocks_is_a_clear_error() {
    let m = windowed_model();
    let mut kv = windowed_cache(&m, 100, 12, KvDtype::F32);
    kv.set_rollback_slack(0);
    kv.add_sequence(0).unwrap();
    // A pass of 100 positions needs all 25 of its window blocks at once.
    assert!(!kv.fits(0, 100, usize::MAX, 0));
    let e = kv.reserve(0, 100).unwrap_err();
    assert!(
        matches!(
            e,
            KvError::OutOfBlocks {
                needed: 25,
                free: 12,
                window: true,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("sliding-window"), "{e}");
    // Room for all 100 in the global layer, and for the next pass of 16 in the window ones.
    assert!(kv.fits(0, 100, 16, 0));
    kv.reserve_within(0, 100, 16).unwrap();
    assert_eq!(kv.used_window_blocks(), 4);
    assert_eq!(kv.used_blocks(), 25);
    // A pass past what was reserved in the window layers is refused, and changes nothing.
    let mut m = m;
    let mut logits = Vec::new();
    let toks = tokens(100, 1);
    let e = m
        .forward(
            &Batch::prompt(0, &toks, 0, false),
            &mut kv,
            Precision::Exact,
            &mut logits,
        )
        .unwrap_err();
    assert!(
        matches!(e, ModelError::Kv(KvError::OutOfBlocks { window: true, .. })),
        "{e:?}"
    );
    assert_eq!(kv.seq_len(0).unwrap(), 0);
    // Passes of 16 fit, again and again, as the window slides.
    for at in (0..96).step_by(16) {
        kv.reserve_within(0, 100, 16).unwrap();
        run(&mut m, &mut kv, 0, &toks[at..at + 16], at, Precision::Exact).unwrap();
    }
}
