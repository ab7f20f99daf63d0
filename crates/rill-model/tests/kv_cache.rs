//! The paged KV cache against its description: one arena of fixed-size blocks, a block table per
//! sequence, reference-counted blocks; `fork` shares every block and a partly filled shared block
//! is copied only when a sequence writes into it; `truncate` drops a tail; removing sequences
//! returns every block. Block accounting is checked through the public counters, and contents
//! through the model: a sequence's logits depend on every key and value it reads, so "the parent's
//! cache is unchanged" is "the parent's logits equal a fresh run's, bit for bit".

mod common;

use common::{assert_bits, cache, extend, fresh, model, tokens};
use rill_model::synthetic::VOCAB_SIZE;
use rill_model::{Batch, KvError, ModelError, Precision};

#[test]
fn fork_shares_every_block_without_copying() {
    let mut m = model();
    let mut kv = cache(&m, 16);
    kv.add_sequence(0).unwrap();
    // 10 positions: two full blocks and a partly filled third.
    extend(&mut m, &mut kv, 0, &tokens(10, 1), 0);
    assert_eq!(kv.free_blocks(), 13);
    for child in 1..=5 {
        kv.fork(0, child).unwrap();
        assert_eq!(kv.seq_len(child).unwrap(), 10);
    }
    // Five forks of a three-block sequence take no block at all (a copy would take 15).
    assert_eq!(kv.free_blocks(), 13);
    // A fork of a fork shares too.
    kv.fork(3, 6).unwrap();
    assert_eq!(kv.free_blocks(), 13);
    // Forking an empty sequence is fine; errors for unknown and existing ids.
    kv.add_sequence(100).unwrap();
    kv.fork(100, 101).unwrap();
    assert_eq!(kv.seq_len(101).unwrap(), 0);
    assert_eq!(kv.fork(42, 43), Err(KvError::UnknownSequence(42)));
    assert_eq!(kv.fork(0, 1), Err(KvError::SequenceExists(1)));
    assert_eq!(kv.free_blocks(), 13);
}

#[test]
fn copy_on_write_copies_only_the_partly_filled_last_block() {
    let mut m = model();
    let mut kv = cache(&m, 16);
    kv.add_sequence(0).unwrap();
    extend(&mut m, &mut kv, 0, &tokens(10, 2), 0);
    kv.fork(0, 1).unwrap();
    let free = kv.free_blocks();
    // The child writes position 10 into the shared third block: one copy, not three blocks.
    assert_eq!(kv.blocks_needed(1, 11).unwrap(), 1);
    extend(&mut m, &mut kv, 1, &[5], 10);
    assert_eq!(kv.free_blocks(), free - 1);
    // Now the parent owns its third block alone: writing into it copies nothing.
    assert_eq!(kv.blocks_needed(0, 11).unwrap(), 0);
    extend(&mut m, &mut kv, 0, &[6], 10);
    assert_eq!(kv.free_blocks(), free - 1);
    // Filling the block and crossing into the next takes exactly one new block each.
    extend(&mut m, &mut kv, 1, &[7, 8], 11);
    assert_eq!(kv.free_blocks(), free - 2);
    extend(&mut m, &mut kv, 0, &[7, 8], 11);
    assert_eq!(kv.free_blocks(), free - 3);

    // A fork on a block boundary shares only full blocks: growing takes a new block, no copy.
    let mut kv = cache(&m, 16);
    kv.add_sequence(0).unwrap();
    extend(&mut m, &mut kv, 0, &tokens(8, 3), 0);
    kv.fork(0, 1).unwrap();
    assert_eq!(kv.free_blocks(), 14);
    assert_eq!(kv.blocks_needed(1, 9).unwrap(), 1);
    extend(&mut m, &mut kv, 1, &[1], 8);
    extend(&mut m, &mut kv, 0, &[2], 8);
    assert_eq!(kv.free_blocks(), 12);
}

#[test]
fn sharers_growing_in_one_batch_need_one_copy_fewer_than_their_count() {
    let mut m = model();
    let prompt = tokens(6, 4);
    // One block for the prompt's first four positions, one partly filled block shared by the
    // three sequences below; growing all three by one position needs exactly two copies (the
    // last to grow keeps the original). Four blocks in all: the cache is sized exactly.
    let mut kv = cache(&m, 4);
    kv.add_sequence(0).unwrap();
    extend(&mut m, &mut kv, 0, &prompt, 0);
    kv.fork(0, 1).unwrap();
    kv.fork(0, 2).unwrap();
    assert_eq!(kv.free_blocks(), 2);
    let mut batch = Batch::new();
    for (seq, token) in [(0u64, 10u32), (1, 11), (2, 12)] {
        batch.push(seq, token, 6, true);
    }
    let mut logits = Vec::new();
    m.forward(&batch, &mut kv, Precision::Exact, &mut logits)
        .unwrap();
    assert_eq!(kv.free_blocks(), 0);
    for (row, token) in [10u32, 11, 12].into_iter().enumerate() {
        let want = fresh(&mut m, &[prompt.clone(), vec![token]].concat(), 6);
        assert_bits(
            &logits[row * VOCAB_SIZE..(row + 1) * VOCAB_SIZE],
            &want,
            &format!("sharer {row}"),
        );
    }

    // One sequence fewer than the sharers of the block grows: every one of them copies.
    let mut kv = cache(&m, 4);
    kv.add_sequence(0).unwrap();
    extend(&mut m, &mut kv, 0, &prompt, 0);
    kv.fork(0, 1).unwrap();
    kv.fork(0, 2).unwrap();
    kv.reserve_all(&[(1, 7), (2, 7)]).unwrap();
    assert_eq!(kv.free_blocks(), 0);
    // The parent is now the block's only owner: it grows into it with no block left.
    assert_eq!(kv.blocks_needed(0, 7).unwrap(), 0);
    kv.reserve_all(&[(0, 7)]).unwrap();
    assert_eq!(kv.free_blocks(), 0);
    // Not enough room for every sharer: nothing is reserved.
    let mut kv = cache(&m, 3);
    kv.add_sequence(0).unwrap();
    extend(&mut m, &mut kv, 0, &prompt, 0);
    kv.fork(0, 1).unwrap();
    kv.fork(0, 2).unwrap();
    assert!(matches!(
        kv.reserve_all(&[(0, 7), (1, 7), (2, 7)]),
        Err(KvError::OutOfBlocks {
            needed: 2,
            free: 1,
            ..
        })
    ));
    assert_eq!(kv.free_blocks(), 1);
}

#[test]
fn blocks_reserved_past_the_end_do_not_hide_a_shared_block() {
    let mut m = model();
    let mut kv = cache(&m, 8);
    kv.add_sequence(0).unwrap();
    let prompt = tokens(6, 5);
    extend(&mut m, &mut kv, 0, &prompt, 0);
    // Room for positions up to 12 (one more block), then a fork of the 6 written positions.
    kv.reserve(0, 12).unwrap();
    kv.fork(0, 1).unwrap();
    // The block holding positions 4..8 is shared: the parent's next write must copy it, even
    // though the last block of its table (the reserved one) is its own.
    assert_eq!(kv.blocks_needed(0, 7).unwrap(), 1);
    let got = extend(&mut m, &mut kv, 0, &[9, 3], 6);
    let child = extend(&mut m, &mut kv, 1, &[4, 4], 6);
    assert_bits(
        &got,
        &fresh(&mut m, &[prompt.clone(), vec![9, 3]].concat(), 6),
        "parent",
    );
    assert_bits(
        &child,
        &fresh(&mut m, &[prompt.clone(), vec![4, 4]].concat(), 6),
        "child",
    );
    kv.remove_sequence(0).unwrap();
    kv.remove_sequence(1).unwrap();
    assert_eq!(kv.free_blocks(), kv.total_blocks());
}

#[test]
fn truncate_frees_tail_blocks_and_drops_references() {
    let mut m = model();
    let mut kv = cache(&m, 16);
    kv.add_sequence(0).unwrap();
    extend(&mut m, &mut kv, 0, &tokens(14, 6), 0);
    assert_eq!(kv.free_blocks(), 12);
    // Exclusive tail: truncating to 5 keeps two blocks and frees two.
    kv.truncate(0, 5).unwrap();
    assert_eq!(kv.seq_len(0).unwrap(), 5);
    assert_eq!(kv.free_blocks(), 14);
    // Truncating past the end changes nothing; to a block boundary frees the partial block.
    kv.truncate(0, 9).unwrap();
    assert_eq!(kv.seq_len(0).unwrap(), 5);
    assert_eq!(kv.free_blocks(), 14);
    kv.truncate(0, 4).unwrap();
    assert_eq!(kv.free_blocks(), 15);

    // Shared tail: the child's truncation only drops its references.
    extend(&mut m, &mut kv, 0, &tokens(10, 7), 4);
    assert_eq!(kv.free_blocks(), 12);
    kv.fork(0, 1).unwrap();
    kv.truncate(1, 3).unwrap();
    assert_eq!(kv.free_blocks(), 12);
    // The parent's tail blocks are now held by the parent alone: its truncation frees them.
    kv.truncate(0, 3).unwrap();
    assert_eq!(kv.free_blocks(), 15);
    // Both still read the first block; a rewrite after truncation equals a fresh run.
    let rest = tokens(6, 8);
    let got = extend(&mut m, &mut kv, 1, &rest, 3);
    let prefix: Vec<u32> = tokens(14, 6)[..3].to_vec();
    assert_bits(&got, &fresh(&mut m, &[prefix, rest].concat(), 3), "rewrite");
    // Truncating to 0 returns everything a sequence held alone.
    kv.truncate(1, 0).unwrap();
    kv.truncate(0, 0).unwrap();
    assert_eq!(kv.free_blocks(), 16);
    assert_eq!(kv.truncate(9, 0), Err(KvError::UnknownSequence(9)));
}

#[test]
fn removing_every_sequence_returns_every_block() {
    let mut m = model();
    let mut kv = cache(&m, 24);
    kv.add_sequence(0).unwrap();
    extend(&mut m, &mut kv, 0, &tokens(9, 9), 0);
    // A tree of forks with diverging writes, truncations, blocks reserved past the end and a
    // rejected pass.
    kv.fork(0, 1).unwrap();
    kv.fork(0, 2).unwrap();
    extend(&mut m, &mut kv, 1, &tokens(5, 10), 9);
    kv.fork(1, 3).unwrap();
    extend(&mut m, &mut kv, 3, &tokens(7, 11), 14);
    extend(&mut m, &mut kv, 2, &tokens(2, 12), 9);
    kv.truncate(1, 6).unwrap();
    extend(&mut m, &mut kv, 1, &tokens(3, 13), 6);
    kv.fork(3, 4).unwrap();
    kv.reserve(4, 40).unwrap();
    let mut logits = Vec::new();
    let bad = Batch::prompt(2, &[VOCAB_SIZE as u32], 11, true);
    assert!(matches!(
        m.forward(&bad, &mut kv, Precision::Exact, &mut logits),
        Err(ModelError::TokenOutOfRange { .. })
    ));
    assert!(kv.free_blocks() < kv.total_blocks());
    for seq in [3, 0, 4, 2, 1] {
        kv.remove_sequence(seq).unwrap();
    }
    assert_eq!(kv.free_blocks(), kv.total_blocks());
    assert_eq!(kv.remove_sequence(0), Err(KvError::UnknownSequence(0)));
}

#[test]
fn a_forks_writes_never_change_its_parent() {
    let mut m = model();
    // Prefixes ending inside a block and on a boundary.
    for prefix_len in [6, 8] {
        let prefix = tokens(prefix_len, 14);
        let mut kv = cache(&m, 32);
        kv.add_sequence(0).unwrap();
        extend(&mut m, &mut kv, 0, &prefix, 0);
        // Children write first, over several blocks, then get truncated and rewritten,
        // then one forks again and writes.
        kv.fork(0, 1).unwrap();
        kv.fork(0, 2).unwrap();
        extend(&mut m, &mut kv, 1, &tokens(11, 15), prefix_len);
        extend(&mut m, &mut kv, 2, &tokens(3, 16), prefix_len);
        kv.truncate(1, prefix_len - 1).unwrap();
        extend(&mut m, &mut kv, 1, &tokens(6, 17), prefix_len - 1);
        kv.fork(2, 3).unwrap();
        extend(&mut m, &mut kv, 3, &tokens(5, 18), prefix_len + 3);
        // The parent continues as if alone.
        let cont = tokens(9, 19);
        let got = extend(&mut m, &mut kv, 0, &cont, prefix_len);
        let want = fresh(&mut m, &[prefix.clone(), cont.clone()].concat(), prefix_len);
        assert_bits(&got, &want, &format!("parent, prefix {prefix_len}"));
        // So do the children, whatever the parent wrote after them.
        let got = extend(&mut m, &mut kv, 2, &[1], prefix_len + 3);
        let want = fresh(
            &mut m,
            &[prefix.clone(), tokens(3, 16), vec![1]].concat(),
            prefix_len + 3,
        );
        assert_bits(&got, &want, &format!("child, prefix {prefix_len}"));
        let got = extend(&mut m, &mut kv, 1, &[2], prefix_len + 5);
        let want = fresh(
            &mut m,
            &[&prefix[..prefix_len - 1], &tokens(6, 17), &[2]].concat(),
            prefix_len + 5,
        );
        assert_bits(
            &got,
            &want,
            &format!("rewritten child, prefix {prefix_len}"),
        );
    }
}
