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
//! used one. A published block is never written: a sequence about to write into one part-way
//! writes into a copy.
//!
//! **Sliding windows.** Layers that attend through a window keep their keys and values in a
//! second arena, and a sequence lets go of those blocks once no query of it can read them
//! (see [`window`](SlidingWindow)): with Gemma 3's five windowed layers in six, a long context
//! costs a sixth of the memory in its global layers plus one window per sequence.

use std::collections::HashMap;

mod accounting;
mod blocks;
mod build;
mod layout;
mod lru;
mod prefix;
mod recurrent;
mod reserve;
mod storage;
mod window;

pub use blocks::KvEvent;
use blocks::{BlockPool, NIL};
pub use layout::{KvLayout, LayerKv};
pub(crate) use recurrent::SeqLayerState;
pub use recurrent::{LayerState, RecurrentShape};
use recurrent::{SeqState, StateArena};
use storage::Arena;
pub(crate) use storage::LayerView;
pub use storage::{KvDtype, KvTypes, MAX_QUANTIZED_HEAD_DIM};
pub use window::SlidingWindow;

/// Identifies a sequence in the cache.
pub type SeqId = u64;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("the KV cache is full: {needed} more {} blocks of {block_size} positions needed, {free} free (capacity {capacity_tokens} positions)", if *.window { "sliding-window" } else { "" })]
    OutOfBlocks {
        needed: usize,
        free: usize,
        block_size: usize,
        capacity_tokens: usize,
        /// Whether the window layers' arena ran out (else the global layers').
        window: bool,
    },
    #[error("KV type {dtype} stores rows in blocks of 32 (at most {max} elements): heads of {head_dim} do not fit; use f16 or f32", max = MAX_QUANTIZED_HEAD_DIM)]
    HeadDimForType {
        dtype: &'static str,
        head_dim: usize,
    },
    #[error("the recurrent-state arena is full: it holds the state of {max_sequences} sequences")]
    OutOfStates { max_sequences: usize },
    #[error("a recurrent-state arena for {max_sequences} sequences and {stored} prefix snapshots of {state_bytes} bytes each cannot be allocated")]
    StatesTooLarge {
        max_sequences: usize,
        stored: usize,
        state_bytes: usize,
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
    #[error("sequence {seq}: the sliding-window layers no longer hold position {pos} (they keep positions from {kept_from} on)")]
    WindowDropped {
        seq: SeqId,
        pos: usize,
        kept_from: usize,
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
    /// The window layers' blocks, index for index with `blocks`: `NIL` before `window_from`
    /// (let go) and past what was reserved for them. Empty without a window.
    window: Vec<u32>,
    /// The first block whose window data the sequence holds.
    window_from: usize,
    len: usize,
    /// Chained hashes of the leading full blocks whose tokens were given to
    /// [`KvCache::publish_prefix`] or [`KvCache::attach_prefix`] (never more than `len` covers).
    hashes: Vec<u64>,
    /// The recurrent layers' state, for a model that has them.
    state: Option<SeqState>,
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
    /// The sliding-window layers' arena, when the model has one.
    pub window: Option<WindowMap>,
    /// The recurrent layers' state, when the model has them.
    pub recurrent: Option<RecurrentMap>,
}

/// The recurrent-state arena as of now (the glass box's fixed notepad).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecurrentMap {
    /// Bytes of one state of every recurrent layer.
    pub state_bytes: usize,
    /// States a sequence holds (its state, a snapshot, and a checkpoint where it may roll back).
    pub states_per_sequence: usize,
    pub max_sequences: usize,
    pub free_sequences: usize,
    /// Snapshots the prefix cache keeps, and how many it may keep.
    pub stored_snapshots: usize,
    pub store_capacity: usize,
    /// Per sequence of [`BlockMap::sequences`], in order: the positions of its snapshot and
    /// checkpoint.
    pub snapshots: Vec<(Option<usize>, Option<usize>)>,
}

/// The window layers' arena in a [`BlockMap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowMap {
    /// Positions each windowed query reads.
    pub size: usize,
    /// Per window block: how many sequences reference it, plus one while it is a published
    /// block's companion (1 with no sequence: reclaimable).
    pub refs: Vec<u32>,
    /// Per sequence (in [`BlockMap::sequences`]' order): the first position whose window data
    /// it holds (every earlier one is kept by the global layers only), and its window table
    /// (`u32::MAX`: let go or not yet taken).
    pub sequences: Vec<(usize, Vec<u32>)>,
    /// Per global block: whether it keeps its window data for the prefix cache.
    pub companions: Vec<bool>,
    /// Companions reclaimed so far for windows of running sequences.
    pub reclaims: u64,
}

/// The cache. Positions of a sequence are appended in order; [`KvCache::truncate`] drops a tail.
pub struct KvCache {
    types: KvTypes,
    block_size: usize,
    n_blocks: usize,
    /// The layers with a sliding window and its size; `None`: every layer keeps everything.
    window: Option<SlidingWindow>,
    /// Positions before each sequence's window that the window layers keep (for rollbacks).
    rollback_slack: usize,
    /// Each layer's heads, or the layer whose keys and values it reads.
    layout: KvLayout,
    /// Per layer, keys then values: `[block][slot][kv_head * head_dim]` (empty for a layer
    /// that stores none).
    keys: Vec<Arena>,
    values: Vec<Arena>,
    pool: BlockPool,
    sequences: HashMap<SeqId, Sequence>,
    /// The recurrent layers' state, for a model that has them (those layers keep no keys or
    /// values: their arenas are empty).
    states: Option<StateArena>,
}

impl KvCache {
    /// Positions per block unless told otherwise.
    pub const DEFAULT_BLOCK_SIZE: usize = 16;
    /// Sequences whose recurrent state a cache made for a model holds unless told otherwise
    /// (forks and beams included; untouched slots cost no memory).
    pub const DEFAULT_STATE_SEQUENCES: usize = 32;
    /// Recurrent-state snapshots its prefix cache keeps unless told otherwise.
    pub const DEFAULT_PREFIX_SNAPSHOTS: usize = 8;

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
        let state = match &mut self.states {
            None => None,
            Some(a) => Some(a.take_seq().ok_or(KvError::OutOfStates {
                max_sequences: a.max_sequences(),
            })?),
        };
        self.sequences.insert(
            seq,
            Sequence {
                blocks: Vec::with_capacity(blocks),
                window: Vec::with_capacity(if self.window.is_some() { blocks } else { 0 }),
                window_from: 0,
                len: 0,
                hashes: Vec::new(),
                state,
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
        for &w in s.window.iter().rev().filter(|&&w| w != NIL) {
            self.pool.window.release(w);
        }
        if let (Some(a), Some(st)) = (&mut self.states, &s.state) {
            a.release_seq(st);
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

    /// Drops every position at or after `len` (speculation rejects, edits), and returns the
    /// positions kept: `len` (or fewer when the sequence holds fewer), or 0 when the window
    /// layers no longer hold what a query at `len` reads (they let it go as the sequence grew:
    /// a rollback to no earlier than the length at the last reservation always keeps `len`).
    /// With recurrent layers, a rollback keeps the position of the sequence's state snapshot
    /// when it is at or before `len` (0 otherwise): the caller computes again from there.
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<usize, KvError> {
        let bs = self.block_size;
        let s = self
            .sequences
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let mut kept = s.len.min(len);
        if let (Some(a), Some(st), true) = (&mut self.states, &mut s.state, len < s.len) {
            // A recurrent state goes back only to a snapshot (or to nothing).
            kept = a.roll_back(st, kept);
        }
        // The window layers must still hold what the query at the kept length reads.
        let first_read = self.window.as_ref().map(|w| w.first_read(kept));
        if first_read.is_some_and(|first| kept > 0 && first / bs < s.window_from) {
            kept = 0;
            if let (Some(a), Some(st)) = (&mut self.states, &mut s.state) {
                a.roll_back(st, 0);
            }
        }
        s.len = kept;
        s.hashes.truncate(s.len / bs);
        // Also drops blocks reserved past the end by a pass that then failed.
        let keep = s.len.div_ceil(bs).min(s.blocks.len());
        for &b in s.blocks[keep..].iter().rev() {
            self.pool.release(b);
        }
        s.blocks.truncate(keep);
        if !s.window.is_empty() {
            for &w in s.window[keep.min(s.window.len())..].iter().rev() {
                if w != NIL {
                    self.pool.window.release(w);
                }
            }
            s.window.truncate(keep);
            if s.len == 0 {
                for w in s.window.drain(..) {
                    if w != NIL {
                        self.pool.window.release(w);
                    }
                }
                s.window_from = 0;
            }
        }
        Ok(s.len)
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
        let held = s.len.div_ceil(self.block_size);
        let mut blocks = Vec::with_capacity(s.blocks.capacity().max(s.blocks.len()));
        blocks.extend_from_slice(&s.blocks[..held]);
        let mut window = Vec::with_capacity(s.window.capacity());
        window.extend_from_slice(&s.window[..held.min(s.window.len())]);
        let (len, window_from) = (s.len, s.window_from);
        let hashes = s.hashes.clone();
        let state = match (&mut self.states, &s.state) {
            (Some(a), Some(from)) => Some(a.fork_seq(from).ok_or(KvError::OutOfStates {
                max_sequences: a.max_sequences(),
            })?),
            _ => None,
        };
        for &b in &blocks {
            self.pool.retain(b);
        }
        for &w in window.iter().filter(|&&w| w != NIL) {
            self.pool.window.retain(w);
        }
        self.sequences.insert(
            dst,
            Sequence {
                blocks,
                window,
                window_from,
                len,
                hashes,
                state,
            },
        );
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
        let kv_dim = self.layout.stored_dim(layer);
        if kv_dim == 0 || k.len() != kv_dim || v.len() != kv_dim {
            let n_kv_heads = self.layout.layer(layer).map_or(0, |l| l.n_kv_heads);
            return Err(KvError::OutOfRange {
                layer,
                n_layers: self.keys.len(),
                kv_head: k.len().max(v.len()),
                n_kv_heads,
                len: pos,
            });
        }
        let s = self
            .sequences
            .get(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let table = if self.is_window_layer(layer) {
            &s.window
        } else {
            &s.blocks
        };
        let block = *table
            .get(pos / bs)
            .filter(|&&b| b != NIL)
            .ok_or(KvError::Gap {
                seq,
                pos,
                len: s.len,
            })?;
        let at = (block as usize * bs + pos % bs) * kv_dim;
        self.keys[layer].write(at, k);
        self.values[layer].write(at, v);
        Ok(())
    }

    /// Records that `seq` holds `len` positions without writing them (their keys and values
    /// stay what the arena holds): for schedulers' tests, which plan and commit steps with no
    /// model. Its blocks must have been reserved up to `len`.
    pub fn assume_written(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let bs = self.block_size;
        let s = self
            .sequences
            .get(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if len > s.blocks.len() * bs {
            return Err(KvError::Gap {
                seq,
                pos: s.blocks.len() * bs,
                len: s.len,
            });
        }
        self.set_len(seq, len)
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
        // A layer sharing another's keys and values reads the other's.
        let shape = self.layout.layer(layer);
        let source = shape.map_or(layer, |l| l.source);
        let windowed = self.is_window_layer(source);
        let blocks = if windowed { &s.window } else { &s.blocks };
        let n_kv_heads = shape.map_or(0, |l| l.n_kv_heads);
        if kv_head >= n_kv_heads || len > blocks.len() * self.block_size {
            return Err(KvError::OutOfRange {
                layer,
                n_layers: self.keys.len(),
                kv_head,
                n_kv_heads,
                len,
            });
        }
        let LayerKv { head_dim, .. } = self.layout.layer(source).unwrap_or(LayerKv {
            n_kv_heads,
            head_dim: 0,
            source,
        });
        if let (true, Some(w)) = (windowed, &self.window) {
            // What the query at `len - 1` reads must still be held.
            let first = w.first_read(len.saturating_sub(1));
            if len > 0 && first / self.block_size < s.window_from {
                return Err(KvError::WindowDropped {
                    seq,
                    pos: first,
                    kept_from: s.window_from * self.block_size,
                });
            }
        }
        Ok(LayerView {
            keys: &self.keys[source],
            values: &self.values[source],
            blocks,
            block_size: self.block_size,
            kv_dim: self.layout.stored_dim(source),
            head_offset: kv_head * head_dim,
            head_dim,
            len,
        })
    }
}

#[cfg(test)]
mod tests;
