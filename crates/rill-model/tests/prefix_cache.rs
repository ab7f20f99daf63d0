//! The KV cache's prefix cache: full blocks published under a hash of their tokens chained with
//! their prefix's hash, found again only for the same tokens after the same prefix, shared by
//! reference, kept when idle (counted as free) and evicted least recently used first; a published
//! block is never written (a sequence writing into one part-way writes into a copy). A context that
//! ended mid-block publishes that block too, and a prompt leaving a published block part-way
//! shares its leading positions. Contents are checked through the model: a continuation computed on
//! attached blocks must give the logits of a fresh run, bit for bit.

mod common;

use common::{assert_bits, cache, extend, fresh, model, tokens};
use rill_model::synthetic::VOCAB_SIZE;
use rill_model::{KvCache, KvError, KvEvent, Model};

/// A sequence holding `toks`, computed and published.
fn computed(model: &mut Model, kv: &mut KvCache, seq: u64, toks: &[u32]) {
    kv.add_sequence(seq).unwrap();
    extend(model, kv, seq, toks, 0);
    kv.publish_prefix(seq, toks).unwrap();
}

/// (blocks, tokens, idle blocks) of the cached prefix of `toks`.
fn hit(kv: &KvCache, toks: &[u32]) -> (usize, usize, usize) {
    let h = kv.lookup_prefix(toks);
    (h.blocks, h.tokens, h.idle_blocks)
}

#[test]
fn only_full_blocks_after_the_same_prefix_are_found() {
    let mut m = model();
    let mut kv = cache(&m, 16);
    let a = tokens(10, 1);
    computed(&mut m, &mut kv, 0, &a);
    // Two full blocks published; the partly filled third is not.
    assert_eq!(kv.cached_blocks(), 2);
    assert_eq!(hit(&kv, &a), (2, 8, 0));
    assert_eq!(kv.lookup_prefix(&a[..7]).blocks, 1);
    assert_eq!(kv.lookup_prefix(&a[..3]).blocks, 0);
    // A different token in the second block: only the first matches.
    let mut b = a.clone();
    b[5] = (b[5] + 1) % VOCAB_SIZE as u32;
    assert_eq!(kv.lookup_prefix(&b).blocks, 1);
    // The same second block after a different first block is a different block.
    let mut c = a.clone();
    c[0] = (c[0] + 1) % VOCAB_SIZE as u32;
    assert_eq!(kv.lookup_prefix(&c).blocks, 0);
    // Publishing again hashes nothing new; tokens past the cached length are refused.
    assert_eq!(kv.publish_prefix(0, &a).unwrap(), 0);
    assert_eq!(
        kv.publish_prefix(0, &tokens(11, 1)),
        Err(KvError::TokensPastEnd {
            seq: 0,
            len: 10,
            tokens: 11
        })
    );
}

#[test]
fn attached_blocks_are_shared_and_continue_exactly() {
    let mut m = model();
    let mut kv = cache(&m, 16);
    let prompt = tokens(13, 2);
    computed(&mut m, &mut kv, 0, &prompt);
    let free = kv.free_blocks();
    // A second request with the same 12-token prefix and a different tail.
    let mut other = prompt[..12].to_vec();
    other.extend_from_slice(&tokens(5, 3));
    kv.add_sequence(1).unwrap();
    assert_eq!(kv.attach_prefix(1, &other[..other.len() - 1]).unwrap(), 12);
    assert_eq!(kv.seq_len(1).unwrap(), 12);
    // Referencing takes no block.
    assert_eq!(kv.free_blocks(), free);
    let got = extend(&mut m, &mut kv, 1, &other[12..], 12);
    assert_bits(
        &got,
        &fresh(&mut m, &other, 12),
        "continuation on cached blocks",
    );
    // The first sequence is unchanged by the second's writes.
    let got = extend(&mut m, &mut kv, 0, &[7], 13);
    let want = fresh(&mut m, &[prompt.clone(), vec![7]].concat(), 13);
    assert_bits(&got, &want, "owner after sharing");
    // Attaching to a sequence that holds positions is refused.
    assert_eq!(kv.attach_prefix(1, &other), Err(KvError::NotEmpty(1)));
    assert_eq!(
        kv.attach_prefix(9, &other),
        Err(KvError::UnknownSequence(9))
    );
}

#[test]
fn idle_cached_blocks_count_as_free_and_are_reused() {
    let mut m = model();
    let mut kv = cache(&m, 8);
    let prompt = tokens(9, 4);
    computed(&mut m, &mut kv, 0, &prompt);
    assert_eq!(kv.used_blocks(), 3);
    kv.remove_sequence(0).unwrap();
    // The two full blocks stay cached, idle, and count as free.
    assert_eq!(kv.used_blocks(), 0);
    assert_eq!(kv.free_blocks(), 8);
    assert_eq!(kv.idle_cached_blocks(), 2);
    assert_eq!(hit(&kv, &prompt), (2, 8, 2));
    // Reattached, they are used again, and the continuation is exact.
    kv.add_sequence(1).unwrap();
    assert_eq!(kv.attach_prefix(1, &prompt[..8]).unwrap(), 8);
    assert_eq!(kv.idle_cached_blocks(), 0);
    assert_eq!(kv.used_blocks(), 2);
    let got = extend(&mut m, &mut kv, 1, &prompt[8..], 8);
    assert_bits(&got, &fresh(&mut m, &prompt, 8), "reused idle blocks");
    kv.remove_sequence(1).unwrap();
    assert_eq!(kv.used_blocks(), 0);
    assert_eq!(kv.evictions(), 0);
}

#[test]
fn eviction_takes_least_recently_used_blocks_tail_first() {
    let mut m = model();
    let mut kv = cache(&m, 6);
    let a = tokens(8, 5);
    let b = tokens(8, 6);
    computed(&mut m, &mut kv, 0, &a);
    computed(&mut m, &mut kv, 1, &b);
    kv.remove_sequence(0).unwrap();
    kv.remove_sequence(1).unwrap();
    assert_eq!(kv.idle_cached_blocks(), 4);
    // `a` is used again (attached and dropped): `b` is now the least recently used.
    kv.add_sequence(2).unwrap();
    assert_eq!(kv.attach_prefix(2, &a).unwrap(), 8);
    kv.remove_sequence(2).unwrap();
    // Six blocks, two never used: a sequence of 12 positions takes those and one cached block,
    // `b`'s tail (a block without its prefix is of no use).
    kv.add_sequence(3).unwrap();
    kv.reserve(3, 12).unwrap();
    assert_eq!(kv.evictions(), 1);
    assert_eq!(kv.lookup_prefix(&b).blocks, 1);
    assert_eq!(kv.lookup_prefix(&a).blocks, 2);
    // Then `b`'s first block, then `a`'s tail.
    kv.reserve(3, 16).unwrap();
    assert_eq!(kv.lookup_prefix(&b).blocks, 0);
    assert_eq!(kv.lookup_prefix(&a).blocks, 2);
    kv.reserve(3, 20).unwrap();
    assert_eq!(kv.lookup_prefix(&a).blocks, 1);
    assert_eq!(kv.evictions(), 3);
    // Out of blocks once every cached block is taken too.
    kv.reserve(3, 24).unwrap();
    assert!(matches!(
        kv.reserve(3, 25),
        Err(KvError::OutOfBlocks { .. })
    ));
    assert_eq!(kv.cached_blocks(), 0);
    kv.remove_sequence(3).unwrap();
    assert_eq!(kv.free_blocks(), kv.total_blocks());
}

#[test]
fn a_published_block_is_never_written() {
    let mut m = model();
    let mut kv = cache(&m, 16);
    let prompt = tokens(8, 7);
    computed(&mut m, &mut kv, 0, &prompt);
    // Shared: a second sequence holds the same two blocks.
    kv.add_sequence(1).unwrap();
    assert_eq!(kv.attach_prefix(1, &prompt).unwrap(), 8);
    // Sequence 1 rewinds into its second block and writes there: it gets its own copy.
    kv.truncate(1, 6).unwrap();
    let free = kv.free_blocks();
    let rewritten = [1u32, 2];
    let got = extend(&mut m, &mut kv, 1, &rewritten, 6);
    assert_eq!(kv.free_blocks(), free - 1);
    let mut want_toks = prompt[..6].to_vec();
    want_toks.extend_from_slice(&rewritten);
    assert_bits(&got, &fresh(&mut m, &want_toks, 6), "rewritten copy");
    // The cached block still holds the original tokens, and still serves them exactly.
    assert_eq!(kv.lookup_prefix(&prompt).blocks, 2);
    kv.add_sequence(2).unwrap();
    assert_eq!(kv.attach_prefix(2, &prompt).unwrap(), 8);
    let got = extend(&mut m, &mut kv, 2, &[3], 8);
    let want = fresh(&mut m, &[prompt.clone(), vec![3]].concat(), 8);
    assert_bits(&got, &want, "original after a sharer's rewrite");
    kv.remove_sequence(1).unwrap();
    kv.remove_sequence(2).unwrap();
    // Exclusive: the only owner rewinds and writes; it writes into a copy too, and the cached
    // block stays in the cache for its tokens (idle, so it still counts as free).
    kv.truncate(0, 6).unwrap();
    assert_eq!(kv.lookup_prefix(&prompt).blocks, 2);
    let (free, cached) = (kv.free_blocks(), kv.cached_blocks());
    extend(&mut m, &mut kv, 0, &rewritten, 6);
    assert_eq!((kv.free_blocks(), kv.cached_blocks()), (free, cached));
    assert_eq!(kv.lookup_prefix(&prompt).blocks, 2);
    // The copy, published with its new tokens, is found for those; both share 6 positions.
    kv.publish_prefix(0, &want_toks).unwrap();
    assert_eq!(kv.lookup_prefix(&want_toks).blocks, 2);
    assert_eq!(kv.lookup_prefix(&prompt).blocks, 2);
    let diverging = [&prompt[..6], &[9u32, 9]].concat();
    let hit = kv.lookup_prefix(&diverging);
    assert_eq!((hit.blocks, hit.partial, hit.tokens), (1, 2, 6));
}

#[test]
fn the_same_prefix_computed_twice_is_cached_once() {
    let mut m = model();
    let mut kv = cache(&m, 16);
    let prompt = tokens(8, 8);
    computed(&mut m, &mut kv, 0, &prompt);
    computed(&mut m, &mut kv, 1, &prompt);
    assert_eq!(kv.cached_blocks(), 2);
    assert_eq!(kv.used_blocks(), 4);
    // The duplicates are plain blocks: freed when their sequence goes.
    kv.remove_sequence(1).unwrap();
    assert_eq!(kv.used_blocks(), 2);
    assert_eq!(kv.idle_cached_blocks(), 0);
    kv.remove_sequence(0).unwrap();
    assert_eq!(kv.idle_cached_blocks(), 2);
    // Forks share the hashes too: a fork's later full block chains on the same prefix.
    computed(&mut m, &mut kv, 2, &prompt[..6]);
    kv.fork(2, 3).unwrap();
    let tail = tokens(6, 9);
    extend(&mut m, &mut kv, 3, &tail, 6);
    let all = [&prompt[..6], &tail[..]].concat();
    kv.publish_prefix(3, &all).unwrap();
    assert_eq!(kv.lookup_prefix(&all).blocks, 3);
}

#[test]
fn clearing_the_prefix_cache_frees_idle_blocks() {
    let mut m = model();
    let mut kv = cache(&m, 8);
    let a = tokens(8, 10);
    let b = tokens(8, 11);
    computed(&mut m, &mut kv, 0, &a);
    computed(&mut m, &mut kv, 1, &b);
    kv.remove_sequence(0).unwrap();
    assert_eq!(kv.idle_cached_blocks(), 2);
    kv.clear_prefix_cache();
    assert_eq!(kv.idle_cached_blocks(), 0);
    assert_eq!(kv.cached_blocks(), 0);
    assert_eq!(kv.lookup_prefix(&a).blocks, 0);
    assert_eq!(kv.lookup_prefix(&b).blocks, 0);
    assert_eq!(kv.used_blocks(), 2);
    kv.remove_sequence(1).unwrap();
    assert_eq!(kv.free_blocks(), 8);
    assert_eq!(kv.idle_cached_blocks(), 0);
}

/// The hashes a `Stored` event names.
fn stored(e: &KvEvent) -> (&[u64], Option<u64>, &[u32]) {
    match e {
        KvEvent::Stored {
            hashes,
            parent,
            tokens,
            ..
        } => (hashes, *parent, tokens),
        other => panic!("expected Stored, got {other:?}"),
    }
}

#[test]
fn recorded_events_name_every_block_published_and_removed() {
    let mut m = model();
    let mut kv = cache(&m, 8);
    // Nothing is recorded unless asked.
    computed(&mut m, &mut kv, 9, &tokens(8, 9));
    assert!(kv.take_events().is_empty());
    kv.remove_sequence(9).unwrap();
    kv.clear_prefix_cache();
    kv.record_events(true);
    assert_eq!(kv.take_events(), vec![]);

    let a = tokens(10, 5);
    let b = tokens(8, 6);
    computed(&mut m, &mut kv, 0, &a);
    computed(&mut m, &mut kv, 1, &b);
    let events = kv.take_events();
    assert_eq!(events.len(), 2, "{events:?}");
    // One event per run of blocks: a's two full blocks (its partial third is not cached).
    let (ha, parent, toks) = stored(&events[0]);
    assert_eq!((ha.len(), parent, toks), (2, None, &a[..8]));
    let ha = ha.to_vec();
    let (hb, _, toks) = stored(&events[1]);
    assert_eq!(toks, &b[..]);
    let hb = hb.to_vec();
    assert!(matches!(events[0], KvEvent::Stored { block_size: 4, .. }));
    // Taken once.
    assert!(kv.take_events().is_empty());

    // A block continuing a cached prefix names its parent.
    let mut longer = a.clone();
    longer.extend(tokens(6, 7));
    kv.add_sequence(2).unwrap();
    assert_eq!(kv.attach_prefix(2, &longer).unwrap(), 8);
    extend(&mut m, &mut kv, 2, &longer[8..], 8);
    kv.publish_prefix(2, &longer).unwrap();
    let events = kv.take_events();
    let (h, parent, toks) = stored(&events[0]);
    assert_eq!((h.len(), parent, toks), (2, Some(ha[1]), &longer[8..16]));
    let hl = h.to_vec();
    // The same prefix computed twice is published once, so reported once.
    computed(&mut m, &mut kv, 3, &b[..4]);
    assert!(kv.take_events().is_empty());
    for s in 0..4 {
        kv.remove_sequence(s).unwrap();
    }

    // Evictions name the blocks that left, least recently used first (b's tail: its head is
    // still held by sequence 3 when sequence 1 goes), each once.
    kv.add_sequence(4).unwrap();
    kv.reserve(4, 4 * 8).unwrap();
    let mut removed: Vec<u64> = kv
        .take_events()
        .iter()
        .flat_map(|e| match e {
            KvEvent::Removed { hashes } => hashes.clone(),
            other => panic!("expected Removed, got {other:?}"),
        })
        .collect();
    assert_eq!(removed.len(), kv.evictions() as usize);
    assert_eq!(removed[0], hb[1], "{removed:?}");
    let mut all: Vec<u64> = [ha, hb, hl].concat();
    all.sort_unstable();
    removed.sort_unstable();
    assert_eq!(removed, all);
    kv.remove_sequence(4).unwrap();
    computed(&mut m, &mut kv, 5, &a);
    kv.clear_prefix_cache();
    assert_eq!(kv.take_events(), vec![KvEvent::AllCleared]);
}

#[test]
fn a_context_that_ended_mid_block_is_shared_to_its_last_position() {
    let mut m = model();
    let mut kv = cache(&m, 16);
    kv.record_events(true);
    // 10 positions: two full blocks of 4 and a third holding 2, published as the sequence ends.
    let context = tokens(10, 5);
    kv.add_sequence(0).unwrap();
    extend(&mut m, &mut kv, 0, &context, 0);
    assert!(kv.publish_tail(0, &context).unwrap());
    kv.remove_sequence(0).unwrap();
    assert_eq!(kv.cached_blocks(), 3);
    // Routers hear of the two full blocks only.
    let stored: usize = kv
        .take_events()
        .iter()
        .map(|e| match e {
            KvEvent::Stored { hashes, .. } => hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(stored, 2);
    // Its continuation starts from all 10 positions and continues exactly, in a copy.
    let next = [context.clone(), tokens(3, 6)].concat();
    let hit = kv.lookup_prefix(&next);
    assert_eq!((hit.blocks, hit.partial, hit.tokens), (2, 2, 10));
    kv.add_sequence(1).unwrap();
    assert_eq!(kv.attach_prefix(1, &next[..12]).unwrap(), 10);
    let got = extend(&mut m, &mut kv, 1, &next[10..], 10);
    assert_bits(
        &got,
        &fresh(&mut m, &next, 10),
        "continuation of a partial block",
    );
    // One that shares only the first of the two: 9 positions, and exact too.
    let edit = [&context[..9], &[3u32, 4]].concat();
    kv.add_sequence(2).unwrap();
    assert_eq!(kv.attach_prefix(2, &edit[..10]).unwrap(), 9);
    let got = extend(&mut m, &mut kv, 2, &edit[9..], 9);
    assert_bits(
        &got,
        &fresh(&mut m, &edit, 9),
        "an edit inside a partial block",
    );
    // The published block was written by neither: the 10 positions are still there.
    kv.remove_sequence(1).unwrap();
    kv.remove_sequence(2).unwrap();
    assert_eq!(kv.lookup_prefix(&context).tokens, 10);
    // A full block serves a prompt that leaves it part-way.
    let branch = [&next[..5], &[1u32, 1, 1]].concat();
    let hit = kv.lookup_prefix(&branch);
    assert_eq!((hit.blocks, hit.partial), (1, 1));
}
