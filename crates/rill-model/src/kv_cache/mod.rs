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

mod blocks;
mod storage;

pub use blocks::KvEvent;
use blocks::{block_hash, BlockPool, NIL, ROOT_HASH};
use storage::Arena;
pub(crate) use storage::LayerView;
pub use storage::{KvDtype, KvTypes, MAX_QUANTIZED_HEAD_DIM};

/// Identifies a sequence in the cache.
pub type SeqId = u64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("the KV cache is full: {needed} more blocks of {block_size} positions needed, {free} free (capacity {capacity_tokens} positions)")]
    OutOfBlocks {
        needed: usize,
        free: usize,
        block_size: usize,
        capacity_tokens: usize,
    },
    #[error("KV type {dtype} stores rows in blocks of 32 (at most {max} elements): heads of {head_dim} do not fit; use f16 or f32", max = MAX_QUANTIZED_HEAD_DIM)]
    HeadDimForType {
        dtype: &'static str,
        head_dim: usize,
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

struct Sequence {
    blocks: Vec<u32>,
    len: usize,
    /// Chained hashes of the leading full blocks whose tokens were given to
    /// [`KvCache::publish_prefix`] or [`KvCache::attach_prefix`] (never more than `len` covers).
    hashes: Vec<u64>,
}

/// What [`KvCache::lookup_prefix`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixHit {
    /// Leading full blocks of the tokens that are cached.
    pub blocks: usize,
    /// Positions shared with the published block after them, which holds the next tokens but
    /// not a whole block of them (fewer than the block size; 0 when none does).
    pub partial: usize,
    /// Positions found in all (`blocks * block_size + partial`).
    pub tokens: usize,
    /// How many of those blocks no sequence references now (they count as free until a
    /// sequence attaches them).
    pub idle_blocks: usize,
}

/// Every block of the arena and every sequence's table, as of now (the glass box's notepad).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMap {
    pub block_size: usize,
    /// Per block: how many sequences reference it (0: free or cached-free).
    pub refs: Vec<u32>,
    /// Per block: whether it is in the prefix cache (with 0 references: cached-free, taken last).
    pub published: Vec<bool>,
    /// Each sequence's id, positions and block table (blocks reserved for its next positions
    /// included), by id.
    pub sequences: Vec<(SeqId, usize, Vec<u32>)>,
    /// Cached blocks evicted so far to make room.
    pub evictions: u64,
}

/// The cache. Positions of a sequence are appended in order; [`KvCache::truncate`] drops a tail.
pub struct KvCache {
    types: KvTypes,
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
        types: impl Into<KvTypes>,
    ) -> Result<KvCache, KvError> {
        let types = types.into();
        types.check_head_dim(head_dim)?;
        let block_size = block_size.max(1);
        let n_blocks = capacity_tokens.div_ceil(block_size).max(1);
        let too_large = || KvError::TooLarge {
            capacity_tokens,
            bytes: (n_blocks as u128 * block_size as u128)
                * types.bytes_per_token(n_layers, n_kv_heads * head_dim) as u128,
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
            keys.push(Arena::new(types.keys, per_layer).ok_or_else(too_large)?);
            values.push(Arena::new(types.values, per_layer).ok_or_else(too_large)?);
        }
        let pool = BlockPool::new(n_blocks, block_size).ok_or_else(too_large)?;
        Ok(KvCache {
            types,
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
        types: impl Into<KvTypes>,
    ) -> Result<KvCache, KvError> {
        KvCache::new(
            config.n_layers,
            config.n_kv_heads,
            config.head_dim,
            capacity_tokens,
            Self::DEFAULT_BLOCK_SIZE,
            types,
        )
    }

    /// (layers, KV heads, head size): what a model must match to use this cache.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.keys.len(), self.n_kv_heads, self.head_dim)
    }

    /// The element types of keys and values.
    pub fn types(&self) -> KvTypes {
        self.types
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

    /// Every block's state and every sequence's blocks (a copy: about 5 bytes per block).
    pub fn block_map(&self) -> BlockMap {
        let mut sequences: Vec<(SeqId, usize, Vec<u32>)> = self
            .sequences
            .iter()
            .map(|(&id, s)| (id, s.len, s.blocks.clone()))
            .collect();
        sequences.sort_unstable_by_key(|&(id, _, _)| id);
        BlockMap {
            block_size: self.block_size,
            refs: self.pool.ref_counts.clone(),
            published: self.pool.published.clone(),
            sequences,
            evictions: self.pool.evictions,
        }
    }

    /// Bytes of keys and values one position takes over all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.types.bytes_per_token(self.keys.len(), self.kv_dim())
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

    /// Distinct blocks the tables of `seqs` hold (a block shared among them counted once;
    /// unknown ids hold none).
    pub fn distinct_blocks(&self, seqs: &[SeqId]) -> usize {
        let mut blocks: Vec<u32> = seqs
            .iter()
            .filter_map(|s| self.sequences.get(s))
            .flat_map(|s| s.blocks.iter().copied())
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        blocks.len()
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

    /// The longest cached prefix of `tokens`: its leading full blocks, then the positions a
    /// published block after them shares with the next tokens (a block that ended part-way, or
    /// one whose tokens differ from some point on). Pass `&tokens[..n]` to leave positions
    /// from `n` on to be computed.
    pub fn lookup_prefix(&self, tokens: &[u32]) -> PrefixHit {
        let mut hit = PrefixHit::default();
        let parent = self.walk_prefix(tokens, |b, _| {
            hit.blocks += 1;
            hit.idle_blocks += usize::from(self.pool.ref_counts[b as usize] == 0);
        });
        hit.tokens = hit.blocks * self.block_size;
        if let Some((b, same)) = self.pool.find_partial(parent, &tokens[hit.tokens..]) {
            hit.partial = same;
            hit.tokens += same;
            hit.idle_blocks += usize::from(self.pool.ref_counts[b as usize] == 0);
        }
        hit
    }

    /// Calls `found(block, hash)` for each leading full block of `tokens` found in the cache;
    /// returns the hash of the prefix they make.
    fn walk_prefix(&self, tokens: &[u32], mut found: impl FnMut(u32, u64)) -> u64 {
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(self.block_size) {
            let h = block_hash(parent, chunk);
            match self.pool.find(h, parent, chunk) {
                Some(b) => found(b, h),
                None => break,
            }
            parent = h;
        }
        parent
    }

    /// Starts the empty sequence `seq` with the longest cached prefix of `tokens` (as
    /// [`KvCache::lookup_prefix`] finds it), referencing its blocks instead of computing them.
    /// Returns the positions it now holds. A block shared part-way is copied before the
    /// sequence writes into it.
    pub fn attach_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        let s = self
            .sequences
            .get(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if s.len > 0 || !s.blocks.is_empty() {
            return Err(KvError::NotEmpty(seq));
        }
        let mut found: Vec<(u32, u64)> = Vec::new();
        let parent = self.walk_prefix(tokens, |b, h| found.push((b, h)));
        let full = found.len() * self.block_size;
        let partial = self.pool.find_partial(parent, &tokens[full..]);
        for &(b, _) in &found {
            self.pool.retain(b);
        }
        if let Some((b, _)) = partial {
            self.pool.retain(b);
        }
        let s = self
            .sequences
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        s.blocks.extend(found.iter().map(|&(b, _)| b));
        s.hashes.extend(found.iter().map(|&(_, h)| h));
        s.len = full;
        if let Some((b, same)) = partial {
            s.blocks.push(b);
            s.len += same;
        }
        Ok(s.len)
    }

    /// Publishes the partly filled last block of `seq` (its positions past the last full
    /// block, whose `tokens` are given as for [`KvCache::publish_prefix`]) so that a prompt
    /// continuing from there shares it, for a sequence that will write no more into it (call it
    /// as it ends). Full blocks are published as by [`KvCache::publish_prefix`]. Returns whether
    /// the partial block was published.
    pub fn publish_tail(&mut self, seq: SeqId, tokens: &[u32]) -> Result<bool, KvError> {
        self.publish_prefix(seq, tokens)?;
        let bs = self.block_size;
        let s = &self.sequences[&seq];
        let full = tokens.len() / bs;
        let Some(&b) = s.blocks.get(full) else {
            return Ok(false);
        };
        if tokens.len().is_multiple_of(bs) || s.hashes.len() < full {
            return Ok(false);
        }
        if self.pool.published[b as usize] {
            // Shared part-way from an earlier publication of the same positions.
            return Ok(false);
        }
        let parent = if full == 0 {
            ROOT_HASH
        } else {
            s.hashes[full - 1]
        };
        let chunk = &tokens[full * bs..];
        Ok(self
            .pool
            .publish(b, block_hash(parent, chunk), parent, chunk))
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
        self.pool.by_parent.clear();
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
        self.must_copy(b).then_some(b)
    }

    /// Whether a write into the partly filled block `b` must go to a copy: when other
    /// sequences share it, or it is published (a cached block is never written: it may be
    /// shared again part-way, and its tokens name what it holds).
    fn must_copy(&self, b: u32) -> bool {
        self.pool.ref_counts[b as usize] > 1 || self.pool.published[b as usize]
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
            if !self.pool.published[shared as usize]
                && earlier + 1 >= self.pool.ref_counts[shared as usize] as usize
            {
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
        // Copy-on-write of a shared or published, partly filled last block (the block of
        // position `len`, which is not the table's last when blocks were reserved past the end
        // before a fork).
        if new_len > s.len && s.len % bs != 0 {
            let idx = s.len / bs;
            let last = s.blocks[idx];
            let rc = self.pool.ref_counts[last as usize];
            if rc > 1 || self.pool.published[last as usize] {
                // Counted above; the block is referenced, so taking cannot evict it.
                let fresh = self.pool.take().ok_or_else(|| out_of_blocks(&self.pool))?;
                self.pool.release(last);
                let n = bs * kv_dim;
                for arena in self.keys.iter_mut().chain(self.values.iter_mut()) {
                    arena.copy_within(last as usize * n, fresh as usize * n, n);
                }
                s.blocks[idx] = fresh;
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

#[cfg(test)]
mod tests {
    use super::*;
    use rill_kernels::ops::KvView;

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

    /// Quantized rows are stored whole per position and head, survive a copy-on-write of
    /// their block, and read back as ggml dequantizes them.
    #[test]
    fn quantized_rows_round_trip_through_copy_on_write() {
        for dtype in [KvDtype::Q8_0, KvDtype::Q4_0] {
            let (heads, dim) = (2, 32);
            let mut c = KvCache::new(1, heads, dim, 16, 4, dtype).unwrap();
            assert_eq!(c.bytes_per_token(), 2 * dtype.row_bytes(heads * dim));
            c.add_sequence(1).unwrap();
            c.reserve(1, 2).unwrap();
            let row = |p: usize| -> Vec<f32> {
                (0..heads * dim)
                    .map(|i| ((i * 7 + p * 3) % 19) as f32 - 9.0)
                    .collect()
            };
            for p in 0..2 {
                c.write(0, 1, p, &row(p), &row(p + 10)).unwrap();
            }
            c.set_len(1, 2).unwrap();
            c.fork(1, 2).unwrap();
            // Writing position 2 of the fork copies the shared, partly filled block.
            c.reserve(2, 3).unwrap();
            c.write(0, 2, 2, &row(2), &row(12)).unwrap();
            c.set_len(2, 3).unwrap();
            let ty = dtype.block_type().unwrap();
            let stored = |x: &[f32]| {
                let mut bytes = vec![0u8; dtype.row_bytes(x.len())];
                match dtype {
                    KvDtype::Q8_0 => rill_kernels::quantize_row_q8_0(x, &mut bytes).unwrap(),
                    _ => rill_kernels::quantize_row_q4_0(x, &mut bytes).unwrap(),
                }
                let mut back = vec![0f32; x.len()];
                rill_kernels::dequantize_row(ty, &bytes, &mut back).unwrap();
                back
            };
            let q: Vec<f32> = (0..dim).map(|i| (i as f32 * 0.37).sin()).collect();
            for head in 0..heads {
                let view = c.view(0, 2, head, 3).unwrap();
                for p in 0..3 {
                    let key = stored(&row(p))[head * dim..(head + 1) * dim].to_vec();
                    let want: f32 = key.iter().zip(&q).map(|(k, q)| k * q).sum();
                    let got = view.key_dot(p, &q);
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{dtype} {p}"
                    );
                    let value = stored(&row(p + 10))[head * dim..(head + 1) * dim].to_vec();
                    let mut out = vec![0f32; dim];
                    view.value_axpy(p, 2.0, &mut out);
                    for (o, v) in out.iter().zip(&value) {
                        assert_eq!(*o, 2.0 * v, "{dtype} value {p}");
                    }
                }
            }
        }
    }
}
