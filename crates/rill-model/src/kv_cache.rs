//! A paged KV cache: one preallocated arena per layer, split into fixed-size blocks of positions;
//! each sequence owns a block table. Blocks are reference counted so sequences can share a prefix
//! (fork) and copy a shared block only when they write into it.
//!
//! **Prefix cache.** A full block can be *published* ([`KvCache::publish_prefix`]) under a hash of
//! its tokens chained with the hash of everything before it, so the hash names the block's whole
//! prefix. A new sequence whose tokens start with published blocks references them instead of
//! computing them again ([`KvCache::lookup_prefix`], [`KvCache::attach_prefix`]). A published block
//! that no sequence references any more stays cached, counted as free, in least-recently-used
//! order; taking a block when no never-used or plain free block is left evicts the least recently
//! used one. A published block is immutable: a sequence about to write into one (after a
//! truncation) copies it when shared, or unpublishes it when it is the only owner.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use half::f16;
use rill_kernels::ops::{self, KvView};

/// Identifies a sequence in the cache.
pub type SeqId = u64;

/// Element type of cached keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// Exact: what the reference computes.
    F32,
    /// Half the memory; what llama.cpp uses by default.
    F16,
}

impl KvDtype {
    /// Its name, as `--kv-type` and the metrics spell it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("the KV cache is full: {needed} more blocks of {block_size} positions needed, {free} free (capacity {capacity_tokens} positions)")]
    OutOfBlocks {
        needed: usize,
        free: usize,
        block_size: usize,
        capacity_tokens: usize,
    },
    #[error("sequence {0} is not in the KV cache")]
    UnknownSequence(SeqId),
    #[error("sequence {0} is already in the KV cache")]
    SequenceExists(SeqId),
    #[error("sequence {seq}: position {pos} would leave a gap after its {len} cached positions")]
    Gap { seq: SeqId, pos: usize, len: usize },
    #[error(
        "a KV cache of {capacity_tokens} positions needs {bytes} bytes, which cannot be allocated"
    )]
    TooLarge { capacity_tokens: usize, bytes: u128 },
    #[error(
        "sequence {0} already holds positions: a cached prefix can only start an empty sequence"
    )]
    NotEmpty(SeqId),
    #[error("sequence {seq} holds {len} positions but {tokens} tokens were given for them")]
    TokensPastEnd {
        seq: SeqId,
        len: usize,
        tokens: usize,
    },
    #[error("position {len} or KV head {kv_head} is outside the cache (layer {layer} of {n_layers}, {n_kv_heads} KV heads)")]
    OutOfRange {
        layer: usize,
        n_layers: usize,
        kv_head: usize,
        n_kv_heads: usize,
        len: usize,
    },
}

enum Arena {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

fn zeroed<T: Clone>(n: usize, zero: T) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, zero);
    Some(v)
}

impl Arena {
    /// `None` when the memory cannot be had (an error for the caller, never an abort).
    fn new(dtype: KvDtype, n: usize) -> Option<Arena> {
        Some(match dtype {
            KvDtype::F32 => Arena::F32(zeroed(n, 0.0)?),
            KvDtype::F16 => Arena::F16(zeroed(n, f16::ZERO)?),
        })
    }

    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Arena::F32(a) => a[at..at + src.len()].copy_from_slice(src),
            Arena::F16(a) => {
                for (d, &s) in a[at..at + src.len()].iter_mut().zip(src) {
                    *d = f16::from_f32(s);
                }
            }
        }
    }

    fn copy_within(&mut self, from: usize, to: usize, n: usize) {
        match self {
            Arena::F32(a) => a.copy_within(from..from + n, to),
            Arena::F16(a) => a.copy_within(from..from + n, to),
        }
    }
}

struct Sequence {
    blocks: Vec<u32>,
    len: usize,
    /// Chained hashes of the leading full blocks whose tokens were given to
    /// [`KvCache::publish_prefix`] or [`KvCache::attach_prefix`] (never more than `len` covers).
    hashes: Vec<u64>,
}

/// No block (end of a list, or not published).
const NIL: u32 = u32::MAX;

/// Hash of the (empty) prefix before a sequence's first block.
const ROOT_HASH: u64 = 0x7269_6c6c_5f6b_7600;

/// The hash naming a block: its tokens chained with the hash of its prefix.
fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed (zero) keys: deterministic, and well mixed for the map.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// A change to the prefix cache, for routers that route by what each replica has cached
/// (vLLM's KV-event stream): recorded only after [`KvCache::record_events`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks were published: `hashes` name consecutive blocks, the first after the prefix
    /// named `parent` (`None`: at the start of a sequence); `tokens` are all their tokens.
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: usize,
    },
    /// Blocks left the prefix cache (evicted, or unpublished to be written into).
    Removed { hashes: Vec<u64> },
    /// The whole prefix cache was emptied.
    AllCleared,
}

/// Reference counts, the free list and the prefix cache: everything about blocks but their
/// contents and the sequences' tables (so a table can be borrowed while blocks are released).
struct BlockPool {
    block_size: usize,
    ref_counts: Vec<u32>,
    /// Blocks nobody references that are not published.
    free: Vec<u32>,
    /// Per block, its hash while published (`published[b]`), the hash of its prefix and its
    /// tokens, checked on every lookup: a block is handed out only for its own tokens after a
    /// prefix of the same (64-bit, chained) hash.
    published: Vec<bool>,
    hash: Vec<u64>,
    parent: Vec<u64>,
    tokens: Vec<u32>,
    /// Published blocks by hash.
    by_hash: HashMap<u64, u32>,
    /// Published blocks nobody references, least recently used first: an intrusive list over
    /// block ids, so moving a block in or out allocates nothing.
    lru_prev: Vec<u32>,
    lru_next: Vec<u32>,
    lru_head: u32,
    lru_tail: u32,
    idle: usize,
    evictions: u64,
    /// Changes to the prefix cache since they were last taken (when recording).
    events: Option<Vec<KvEvent>>,
}

impl BlockPool {
    fn new(n_blocks: usize, block_size: usize) -> Option<BlockPool> {
        Some(BlockPool {
            block_size,
            ref_counts: zeroed(n_blocks, 0)?,
            free: (0..n_blocks as u32).rev().collect(),
            published: zeroed(n_blocks, false)?,
            hash: zeroed(n_blocks, 0)?,
            parent: zeroed(n_blocks, 0)?,
            tokens: zeroed(n_blocks.checked_mul(block_size)?, 0)?,
            by_hash: HashMap::new(),
            lru_prev: zeroed(n_blocks, NIL)?,
            lru_next: zeroed(n_blocks, NIL)?,
            lru_head: NIL,
            lru_tail: NIL,
            idle: 0,
            evictions: 0,
            events: None,
        })
    }

    /// Blocks that can be taken: free ones and idle cached ones.
    fn available(&self) -> usize {
        self.free.len() + self.idle
    }

    fn lru_push_back(&mut self, b: u32) {
        self.lru_prev[b as usize] = self.lru_tail;
        self.lru_next[b as usize] = NIL;
        if self.lru_tail == NIL {
            self.lru_head = b;
        } else {
            self.lru_next[self.lru_tail as usize] = b;
        }
        self.lru_tail = b;
        self.idle += 1;
    }

    fn lru_remove(&mut self, b: u32) {
        let (prev, next) = (self.lru_prev[b as usize], self.lru_next[b as usize]);
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.lru_next[prev as usize] = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.lru_prev[next as usize] = prev;
        }
        self.lru_prev[b as usize] = NIL;
        self.lru_next[b as usize] = NIL;
        self.idle -= 1;
    }

    /// A block for a sequence to write into (reference count 1): a free one, else the least
    /// recently used idle cached one, evicted. `None` when there is neither.
    fn take(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let b = self.lru_head;
                if b == NIL {
                    return None;
                }
                self.lru_remove(b);
                self.unpublish(b);
                self.evictions += 1;
                b
            }
        };
        self.ref_counts[b as usize] = 1;
        Some(b)
    }

    /// Adds a reference to `b` (shared by a fork or a prefix hit).
    fn retain(&mut self, b: u32) {
        if self.ref_counts[b as usize] == 0 {
            // Only an idle cached block is referenced from nothing.
            self.lru_remove(b);
        }
        self.ref_counts[b as usize] += 1;
    }

    /// Drops one reference to `block`: when nobody holds it any more it goes back to the free
    /// list, or, published, to the most recently used end of the cached ones.
    fn release(&mut self, block: u32) {
        let rc = &mut self.ref_counts[block as usize];
        *rc -= 1;
        if *rc == 0 {
            if self.published[block as usize] {
                self.lru_push_back(block);
            } else {
                self.free.push(block);
            }
        }
    }

    fn unpublish(&mut self, b: u32) {
        if std::mem::take(&mut self.published[b as usize]) {
            let h = self.hash[b as usize];
            if self.by_hash.get(&h) == Some(&b) {
                self.by_hash.remove(&h);
                if let Some(events) = &mut self.events {
                    match events.last_mut() {
                        Some(KvEvent::Removed { hashes }) => hashes.push(h),
                        _ => events.push(KvEvent::Removed { hashes: vec![h] }),
                    }
                }
            }
        }
    }

    /// Publishes block `b` (full, holding `tokens` after the prefix named `parent`) under `h`,
    /// unless that hash already names a block.
    fn publish(&mut self, b: u32, h: u64, parent: u64, tokens: &[u32]) -> bool {
        if self.published[b as usize] || self.by_hash.contains_key(&h) {
            return false;
        }
        let bs = self.block_size;
        self.published[b as usize] = true;
        self.hash[b as usize] = h;
        self.parent[b as usize] = parent;
        self.tokens[b as usize * bs..(b as usize + 1) * bs].copy_from_slice(tokens);
        self.by_hash.insert(h, b);
        if let Some(events) = &mut self.events {
            // A block following the last one stored extends that event (one per prompt run).
            match events.last_mut() {
                Some(KvEvent::Stored {
                    hashes,
                    tokens: all,
                    ..
                }) if hashes.last() == Some(&parent) => {
                    hashes.push(h);
                    all.extend_from_slice(tokens);
                }
                _ => events.push(KvEvent::Stored {
                    hashes: vec![h],
                    parent: (parent != ROOT_HASH).then_some(parent),
                    tokens: tokens.to_vec(),
                    block_size: bs,
                }),
            }
        }
        true
    }

    /// The published block holding `tokens` after the prefix named `parent`, if any.
    fn find(&self, h: u64, parent: u64, tokens: &[u32]) -> Option<u32> {
        let &b = self.by_hash.get(&h)?;
        let bs = self.block_size;
        (self.published[b as usize]
            && self.parent[b as usize] == parent
            && self.tokens[b as usize * bs..(b as usize + 1) * bs] == *tokens)
            .then_some(b)
    }
}

/// What [`KvCache::lookup_prefix`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixHit {
    /// Leading full blocks of the tokens that are cached.
    pub blocks: usize,
    /// Positions they hold (`blocks * block_size`).
    pub tokens: usize,
    /// How many of those blocks no sequence references now (they count as free until a
    /// sequence attaches them).
    pub idle_blocks: usize,
}

/// The cache. Positions of a sequence are appended in order; [`KvCache::truncate`] drops a tail.
pub struct KvCache {
    dtype: KvDtype,
    block_size: usize,
    n_blocks: usize,
    n_kv_heads: usize,
    head_dim: usize,
    /// Per layer, keys then values: `[block][slot][kv_head * head_dim]`.
    keys: Vec<Arena>,
    values: Vec<Arena>,
    pool: BlockPool,
    sequences: HashMap<SeqId, Sequence>,
}

impl KvCache {
    /// Positions per block unless told otherwise.
    pub const DEFAULT_BLOCK_SIZE: usize = 16;

    /// A cache holding `capacity_tokens` positions (rounded up to whole blocks) for every layer,
    /// allocated now; an error if the arena cannot be allocated.
    pub fn new(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity_tokens: usize,
        block_size: usize,
        dtype: KvDtype,
    ) -> Result<KvCache, KvError> {
        let block_size = block_size.max(1);
        let n_blocks = capacity_tokens.div_ceil(block_size).max(1);
        let too_large = || KvError::TooLarge {
            capacity_tokens,
            bytes: 2
                * n_layers as u128
                * (n_blocks as u128 * block_size as u128)
                * (n_kv_heads as u128 * head_dim as u128)
                * dtype.bytes() as u128,
        };
        let per_layer = n_blocks
            .checked_mul(block_size)
            .and_then(|n| n.checked_mul(n_kv_heads))
            .and_then(|n| n.checked_mul(head_dim))
            .filter(|_| u32::try_from(n_blocks).is_ok())
            .ok_or_else(too_large)?;
        let mut keys = Vec::with_capacity(n_layers);
        let mut values = Vec::with_capacity(n_layers);
        for _ in 0..n_layers {
            keys.push(Arena::new(dtype, per_layer).ok_or_else(too_large)?);
            values.push(Arena::new(dtype, per_layer).ok_or_else(too_large)?);
        }
        let pool = BlockPool::new(n_blocks, block_size).ok_or_else(too_large)?;
        Ok(KvCache {
            dtype,
            block_size,
            n_blocks,
            n_kv_heads,
            head_dim,
            keys,
            values,
            pool,
            sequences: HashMap::new(),
        })
    }

    /// A cache sized for `capacity_tokens` positions of a model.
    pub fn for_model(
        config: &crate::ModelConfig,
        capacity_tokens: usize,
        dtype: KvDtype,
    ) -> Result<KvCache, KvError> {
        KvCache::new(
            config.n_layers,
            config.n_kv_heads,
            config.head_dim,
            capacity_tokens,
            Self::DEFAULT_BLOCK_SIZE,
            dtype,
        )
    }

    /// (layers, KV heads, head size): what a model must match to use this cache.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.keys.len(), self.n_kv_heads, self.head_dim)
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Total positions the arena holds.
    pub fn capacity_tokens(&self) -> usize {
        self.n_blocks * self.block_size
    }

    /// Blocks a sequence can take: never used or released ones, and cached blocks of the prefix
    /// cache that no sequence references (taking one evicts it).
    pub fn free_blocks(&self) -> usize {
        self.pool.available()
    }

    /// Blocks referenced by at least one sequence.
    pub fn used_blocks(&self) -> usize {
        self.n_blocks - self.pool.available()
    }

    /// Published blocks of the prefix cache (referenced or not).
    pub fn cached_blocks(&self) -> usize {
        self.pool.by_hash.len()
    }

    /// Published blocks that no sequence references: kept for reuse, counted as free.
    pub fn idle_cached_blocks(&self) -> usize {
        self.pool.idle
    }

    /// Cached blocks evicted (taken for other contents) so far.
    pub fn evictions(&self) -> u64 {
        self.pool.evictions
    }

    pub fn total_blocks(&self) -> usize {
        self.n_blocks
    }

    /// Bytes of keys and values one position takes over all layers.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.keys.len() * self.n_kv_heads * self.head_dim * self.dtype.bytes()
    }

    /// Bytes the arena occupies.
    pub fn arena_bytes(&self) -> usize {
        self.bytes_per_token() * self.capacity_tokens()
    }

    fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Registers an empty sequence.
    pub fn add_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        // Room for every block up front, so growing never allocates while decoding.
        self.add_sequence_for(seq, self.capacity_tokens())
    }

    /// Registers an empty sequence that will hold at most `max_len` positions: its block table
    /// gets room for that many up front (so growing to `max_len` allocates nothing), not for the
    /// whole arena as [`KvCache::add_sequence`] does. It may still grow past `max_len`.
    pub fn add_sequence_for(&mut self, seq: SeqId, max_len: usize) -> Result<(), KvError> {
        if self.sequences.contains_key(&seq) {
            return Err(KvError::SequenceExists(seq));
        }
        let blocks = max_len.div_ceil(self.block_size).min(self.n_blocks);
        self.sequences.insert(
            seq,
            Sequence {
                blocks: Vec::with_capacity(blocks),
                len: 0,
                hashes: Vec::new(),
            },
        );
        Ok(())
    }

    pub fn has_sequence(&self, seq: SeqId) -> bool {
        self.sequences.contains_key(&seq)
    }

    /// Forgets a sequence, returning its blocks to the pool (shared blocks stay with their
    /// other owners).
    pub fn remove_sequence(&mut self, seq: SeqId) -> Result<(), KvError> {
        let s = self
            .sequences
            .remove(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        // Last block first: cached blocks are evicted in the order they went idle, and a block
        // is of no use once its prefix is gone, so the tail should go first.
        for &b in s.blocks.iter().rev() {
            self.pool.release(b);
        }
        Ok(())
    }

    /// Cached positions of a sequence.
    pub fn seq_len(&self, seq: SeqId) -> Result<usize, KvError> {
        self.sequences
            .get(&seq)
            .map(|s| s.len)
            .ok_or(KvError::UnknownSequence(seq))
    }

    /// Drops every position at or after `len` (speculation rejects, edits).
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let bs = self.block_size;
        let s = self
            .sequences
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        s.len = s.len.min(len);
        s.hashes.truncate(s.len / bs);
        // Also drops blocks reserved past the end by a pass that then failed.
        let keep = s.len.div_ceil(bs).min(s.blocks.len());
        for &b in s.blocks[keep..].iter().rev() {
            self.pool.release(b);
        }
        s.blocks.truncate(keep);
        Ok(())
    }

    /// Makes `dst` a copy of `src` sharing all of its blocks; a shared block is copied only when
    /// one of them writes into it.
    pub fn fork(&mut self, src: SeqId, dst: SeqId) -> Result<(), KvError> {
        if self.sequences.contains_key(&dst) {
            return Err(KvError::SequenceExists(dst));
        }
        let s = self
            .sequences
            .get(&src)
            .ok_or(KvError::UnknownSequence(src))?;
        let mut blocks = Vec::with_capacity(s.blocks.capacity().max(s.blocks.len()));
        blocks.extend_from_slice(&s.blocks[..s.len.div_ceil(self.block_size)]);
        let len = s.len;
        let hashes = s.hashes.clone();
        for &b in &blocks {
            self.pool.retain(b);
        }
        self.sequences.insert(
            dst,
            Sequence {
                blocks,
                len,
                hashes,
            },
        );
        Ok(())
    }

    /// Publishes the full blocks of `seq` in the prefix cache. `tokens` are the tokens at its
    /// positions from 0 (at most its length; the same tokens on every call: blocks hashed on an
    /// earlier call are not hashed again). A block whose hash already names another cached block
    /// (the same prefix computed twice) is left unpublished. Returns the blocks newly published.
    pub fn publish_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        let bs = self.block_size;
        let s = self
            .sequences
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if tokens.len() > s.len {
            return Err(KvError::TokensPastEnd {
                seq,
                len: s.len,
                tokens: tokens.len(),
            });
        }
        let full = tokens.len() / bs;
        let mut published = 0;
        for i in s.hashes.len()..full {
            let parent = if i == 0 { ROOT_HASH } else { s.hashes[i - 1] };
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let h = block_hash(parent, chunk);
            s.hashes.push(h);
            published += usize::from(self.pool.publish(s.blocks[i], h, parent, chunk));
        }
        Ok(published)
    }

    /// The longest run of leading full blocks of `tokens` in the prefix cache. Only whole
    /// blocks count: pass `&tokens[..n]` to leave positions from `n` on to be computed.
    pub fn lookup_prefix(&self, tokens: &[u32]) -> PrefixHit {
        let mut hit = PrefixHit::default();
        self.walk_prefix(tokens, |b, _| {
            hit.blocks += 1;
            hit.idle_blocks += usize::from(self.pool.ref_counts[b as usize] == 0);
        });
        hit.tokens = hit.blocks * self.block_size;
        hit
    }

    /// Calls `found(block, hash)` for each leading full block of `tokens` found in the cache.
    fn walk_prefix(&self, tokens: &[u32], mut found: impl FnMut(u32, u64)) {
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(self.block_size) {
            let h = block_hash(parent, chunk);
            match self.pool.find(h, parent, chunk) {
                Some(b) => found(b, h),
                None => break,
            }
            parent = h;
        }
    }

    /// Starts the empty sequence `seq` with the longest cached prefix of `tokens` (as
    /// [`KvCache::lookup_prefix`] finds it), referencing its blocks instead of computing them.
    /// Returns the positions it now holds (a multiple of the block size, possibly 0).
    pub fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        let s = self
            .sequences
            .get(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if s.len > 0 || !s.blocks.is_empty() {
            return Err(KvError::NotEmpty(seq));
        }
        let mut found: Vec<(u32, u64)> = Vec::new();
        self.walk_prefix(tokens, |b, h| found.push((b, h)));
        for &(b, _) in &found {
            self.pool.retain(b);
        }
        let s = self
            .sequences
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        s.blocks.extend(found.iter().map(|&(b, _)| b));
        s.hashes.extend(found.iter().map(|&(_, h)| h));
        s.len = found.len() * self.block_size;
        Ok(s.len)
    }

    /// Starts (or stops) recording the prefix cache's changes as [`KvEvent`]s, taken with
    /// [`KvCache::take_events`]. Off by default: then nothing is recorded or allocated.
    pub fn record_events(&mut self, on: bool) {
        self.pool.events = on.then(Vec::new);
    }

    /// The changes recorded since the last call, oldest first (empty when not recording).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.pool
            .events
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Empties the prefix cache: idle cached blocks become plain free blocks, referenced ones
    /// stay with their sequences, unpublished.
    pub fn clear_prefix_cache(&mut self) {
        while self.pool.lru_head != NIL {
            let b = self.pool.lru_head;
            self.pool.lru_remove(b);
            self.pool.unpublish(b);
            self.pool.free.push(b);
        }
        for b in 0..self.n_blocks as u32 {
            self.pool.unpublish(b);
        }
        self.pool.by_hash.clear();
        if let Some(events) = &mut self.pool.events {
            // One event says it all.
            events.clear();
            events.push(KvEvent::AllCleared);
        }
    }

    /// Blocks needed to grow `seq` to `new_len` positions, counting copies of shared blocks.
    pub fn blocks_needed(&self, seq: SeqId, new_len: usize) -> Result<usize, KvError> {
        let s = self
            .sequences
            .get(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let new_blocks = new_len
            .div_ceil(self.block_size)
            .saturating_sub(s.blocks.len());
        Ok(new_blocks + usize::from(self.shared_partial_block(s, new_len).is_some()))
    }

    /// The partly filled last block of `s` (index `len / block_size`, which need not be the last
    /// of its table when blocks were reserved past the end) when growing to `new_len` writes into
    /// it while other sequences share it: the block that growth must copy first.
    fn shared_partial_block(&self, s: &Sequence, new_len: usize) -> Option<u32> {
        if new_len <= s.len || s.len.is_multiple_of(self.block_size) {
            return None;
        }
        let b = *s.blocks.get(s.len / self.block_size)?;
        (self.pool.ref_counts[b as usize] > 1).then_some(b)
    }

    /// Makes room for several sequences at once, or for none of them: on error nothing is
    /// reserved.
    ///
    /// The count is exact when every sequence appears once: when `k` sequences of the call grow
    /// out of one shared, partly filled block held by `rc` sequences, `min(k, rc - 1)` copies are
    /// needed (the last owner to grow writes into the original), not `k`.
    pub fn reserve_all(&mut self, wanted: &[(SeqId, usize)]) -> Result<(), KvError> {
        let distinct = wanted
            .iter()
            .enumerate()
            .all(|(i, (seq, _))| wanted[..i].iter().all(|(other, _)| other != seq));
        let mut needed = 0;
        for (i, &(seq, len)) in wanted.iter().enumerate() {
            needed += self.blocks_needed(seq, len)?;
            if !distinct {
                // A sequence listed twice: the plain sum over-counts, which is safe.
                continue;
            }
            let Some(shared) = self.shared_partial_block(&self.sequences[&seq], len) else {
                continue;
            };
            // `reserve` runs in list order; the r-th sequence (from 0) growing out of `shared`
            // finds `rc - r` owners and copies only while that is more than one.
            let earlier = wanted[..i]
                .iter()
                .filter(|&&(other, other_len)| {
                    self.sequences
                        .get(&other)
                        .and_then(|o| self.shared_partial_block(o, other_len))
                        == Some(shared)
                })
                .count();
            if earlier + 1 >= self.pool.ref_counts[shared as usize] as usize {
                needed -= 1;
            }
        }
        if needed > self.pool.available() {
            return Err(KvError::OutOfBlocks {
                needed,
                free: self.pool.available(),
                block_size: self.block_size,
                capacity_tokens: self.capacity_tokens(),
            });
        }
        for &(seq, len) in wanted {
            self.reserve(seq, len)?;
        }
        Ok(())
    }

    /// Makes room for positions `len..new_len` of `seq`, so writes to them cannot fail.
    pub fn reserve(&mut self, seq: SeqId, new_len: usize) -> Result<(), KvError> {
        let needed = self.blocks_needed(seq, new_len)?;
        if needed > self.pool.available() {
            return Err(KvError::OutOfBlocks {
                needed,
                free: self.pool.available(),
                block_size: self.block_size,
                capacity_tokens: self.capacity_tokens(),
            });
        }
        let bs = self.block_size;
        let kv_dim = self.kv_dim();
        let s = self
            .sequences
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let out_of_blocks = |pool: &BlockPool| KvError::OutOfBlocks {
            needed,
            free: pool.available(),
            block_size: bs,
            capacity_tokens: self.n_blocks * bs,
        };
        // Copy-on-write of a shared, partly filled last block (the block of position `len`,
        // which is not the table's last when blocks were reserved past the end before a fork).
        if new_len > s.len && s.len % bs != 0 {
            let idx = s.len / bs;
            let last = s.blocks[idx];
            if self.pool.ref_counts[last as usize] > 1 {
                // Counted above; the shared block is referenced, so taking cannot evict it.
                let fresh = self.pool.take().ok_or_else(|| out_of_blocks(&self.pool))?;
                self.pool.ref_counts[last as usize] -= 1;
                let n = bs * kv_dim;
                for arena in self.keys.iter_mut().chain(self.values.iter_mut()) {
                    arena.copy_within(last as usize * n, fresh as usize * n, n);
                }
                s.blocks[idx] = fresh;
            } else {
                // A published block is never written: its only owner takes it out of the cache.
                self.pool.unpublish(last);
            }
        }
        while s.blocks.len() < new_len.div_ceil(bs) {
            let b = self.pool.take().ok_or_else(|| out_of_blocks(&self.pool))?;
            s.blocks.push(b);
        }
        Ok(())
    }

    /// Stores the keys and values of position `pos` (which must be the sequence's next position
    /// or an already cached one) for `layer`. Space must have been [`reserve`](Self::reserve)d.
    pub(crate) fn write(
        &mut self,
        layer: usize,
        seq: SeqId,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), KvError> {
        let bs = self.block_size;
        let kv_dim = self.kv_dim();
        let s = self
            .sequences
            .get(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let block = *s.blocks.get(pos / bs).ok_or(KvError::Gap {
            seq,
            pos,
            len: s.len,
        })?;
        let at = (block as usize * bs + pos % bs) * kv_dim;
        self.keys[layer].write(at, k);
        self.values[layer].write(at, v);
        Ok(())
    }

    /// Records that `seq` now holds `len` positions (after a forward pass wrote them).
    pub(crate) fn set_len(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let s = self
            .sequences
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        s.len = len;
        Ok(())
    }

    /// Read access to one layer's keys/values of `seq` for KV head `kv_head`, positions `0..len`.
    pub(crate) fn view(
        &self,
        layer: usize,
        seq: SeqId,
        kv_head: usize,
        len: usize,
    ) -> Result<LayerView<'_>, KvError> {
        let s = self
            .sequences
            .get(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if layer >= self.keys.len()
            || kv_head >= self.n_kv_heads
            || len > s.blocks.len() * self.block_size
        {
            return Err(KvError::OutOfRange {
                layer,
                n_layers: self.keys.len(),
                kv_head,
                n_kv_heads: self.n_kv_heads,
                len,
            });
        }
        Ok(LayerView {
            keys: &self.keys[layer],
            values: &self.values[layer],
            blocks: &s.blocks,
            block_size: self.block_size,
            kv_dim: self.kv_dim(),
            head_offset: kv_head * self.head_dim,
            head_dim: self.head_dim,
            len,
        })
    }
}

/// One layer, one sequence, one KV head.
pub(crate) struct LayerView<'a> {
    keys: &'a Arena,
    values: &'a Arena,
    blocks: &'a [u32],
    block_size: usize,
    kv_dim: usize,
    head_offset: usize,
    head_dim: usize,
    len: usize,
}

impl LayerView<'_> {
    #[inline]
    fn offset(&self, j: usize) -> usize {
        let block = self.blocks[j / self.block_size] as usize;
        (block * self.block_size + j % self.block_size) * self.kv_dim + self.head_offset
    }
}

impl KvView for LayerView<'_> {
    fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn key_dot(&self, j: usize, q: &[f32]) -> f32 {
        let at = self.offset(j);
        match self.keys {
            Arena::F32(a) => rill_kernels::dot_f32(&a[at..at + self.head_dim], q),
            Arena::F16(a) => ops::dot_f16_f32(&a[at..at + self.head_dim], q),
        }
    }

    #[inline]
    fn value_axpy(&self, j: usize, w: f32, out: &mut [f32]) {
        let at = self.offset(j);
        match self.values {
            Arena::F32(a) => ops::axpy_f32(out, w, &a[at..at + self.head_dim]),
            Arena::F16(a) => ops::axpy_f16(out, w, &a[at..at + self.head_dim]),
        }
    }
    #[inline]
    fn key_dots(&self, j: usize, q: &[f32], out: &mut [f32]) {
        let at = self.offset(j);
        match self.keys {
            Arena::F32(a) => {
                let key = &a[at..at + self.head_dim];
                for (g, o) in out.iter_mut().enumerate() {
                    *o = rill_kernels::dot_f32(key, &q[g * self.head_dim..(g + 1) * self.head_dim]);
                }
            }
            Arena::F16(a) => ops::dot_f16_f32_heads(&a[at..at + self.head_dim], q, out),
        }
    }

    #[inline]
    fn value_axpys(&self, j: usize, w: &[f32], out: &mut [f32]) {
        let at = self.offset(j);
        match self.values {
            Arena::F32(a) => {
                let value = &a[at..at + self.head_dim];
                for (g, &wg) in w.iter().enumerate() {
                    let o = &mut out[g * self.head_dim..(g + 1) * self.head_dim];
                    ops::axpy_f32(o, wg, value);
                }
            }
            Arena::F16(a) => ops::axpy_f16_heads(out, w, &a[at..at + self.head_dim]),
        }
    }

    fn key_dots_run(
        &self,
        j0: usize,
        n: usize,
        q: &[f32],
        heads: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let Arena::F16(a) = self.keys else {
            return ops::key_dots_run_by_position(self, j0, n, q, heads, out, out_stride);
        };
        for (k, keys) in self.runs(a, j0, n) {
            ops::dot_f16_f32_heads_run(keys, q, heads, &mut out[k..], out_stride);
        }
    }

    fn value_axpys_run(
        &self,
        j0: usize,
        n: usize,
        w: &[f32],
        w_stride: usize,
        heads: usize,
        out: &mut [f32],
    ) {
        let Arena::F16(a) = self.values else {
            return ops::value_axpys_run_by_position(self, j0, n, w, w_stride, heads, out);
        };
        for (k, values) in self.runs(a, j0, n) {
            ops::axpy_f16_heads_run(&mut out[..heads * self.head_dim], &w[k..], w_stride, values);
        }
    }
}

impl<'a> LayerView<'a> {
    /// Positions `j0..j0 + n` as runs that are contiguous in the arena (one per cache block
    /// touched), each with its offset `k` from `j0`.
    fn runs<'s>(
        &'s self,
        arena: &'a [f16],
        j0: usize,
        n: usize,
    ) -> impl Iterator<Item = (usize, ops::F16Rows<'a>)> + 's {
        let mut k = 0;
        std::iter::from_fn(move || {
            if k >= n {
                return None;
            }
            let j = j0 + k;
            let rows = (self.block_size - j % self.block_size).min(n - k);
            let at = self.offset(j);
            let run = ops::F16Rows {
                data: &arena[at..at + (rows - 1) * self.kv_dim + self.head_dim],
                stride: self.kv_dim,
                rows,
                dim: self.head_dim,
            };
            let start = k;
            k += rows;
            Some((start, run))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(blocks: usize) -> KvCache {
        KvCache::new(1, 1, 2, blocks * 4, 4, KvDtype::F32).unwrap()
    }

    #[test]
    fn reserve_write_truncate_and_free() {
        let mut c = cache(3);
        c.add_sequence(1).unwrap();
        c.reserve(1, 6).unwrap();
        assert_eq!(c.free_blocks(), 1);
        for p in 0..6 {
            c.write(0, 1, p, &[p as f32, 0.0], &[0.0, p as f32])
                .unwrap();
        }
        c.set_len(1, 6).unwrap();
        let v = c.view(0, 1, 0, 6).unwrap();
        assert_eq!(v.key_dot(5, &[1.0, 0.0]), 5.0);
        c.truncate(1, 3).unwrap();
        assert_eq!(c.free_blocks(), 2);
        assert!(matches!(c.reserve(1, 13), Err(KvError::OutOfBlocks { .. })));
        c.remove_sequence(1).unwrap();
        assert_eq!(c.free_blocks(), 3);
    }

    #[test]
    fn fork_shares_blocks_and_copies_on_write() {
        let mut c = cache(4);
        c.add_sequence(1).unwrap();
        c.reserve(1, 6).unwrap();
        for p in 0..6 {
            c.write(0, 1, p, &[p as f32, 1.0], &[1.0, 1.0]).unwrap();
        }
        c.set_len(1, 6).unwrap();
        c.fork(1, 2).unwrap();
        assert_eq!(c.free_blocks(), 2);
        // Seq 2 writes position 6 into the shared, partly filled block: it gets its own copy.
        assert_eq!(c.blocks_needed(2, 7).unwrap(), 1);
        c.reserve(2, 7).unwrap();
        c.write(0, 2, 6, &[100.0, 0.0], &[0.0, 0.0]).unwrap();
        c.set_len(2, 7).unwrap();
        assert_eq!(c.free_blocks(), 1);
        // The copy kept the shared prefix; the original is untouched.
        let v2 = c.view(0, 2, 0, 7).unwrap();
        assert_eq!(v2.key_dot(5, &[1.0, 0.0]), 5.0);
        assert_eq!(v2.key_dot(6, &[1.0, 0.0]), 100.0);
        c.remove_sequence(1).unwrap();
        c.remove_sequence(2).unwrap();
        assert_eq!(c.free_blocks(), 4);
    }
}
