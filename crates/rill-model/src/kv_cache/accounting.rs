//! What a cache holds and costs: its blocks by state, its window arena, bytes per token, its
//! block map for the glass box.

use super::*;

impl KvCache {
    /// The sliding window, when some layers have one.
    pub fn window(&self) -> Option<&SlidingWindow> {
        self.window.as_ref()
    }

    /// Positions before each sequence's window that the window layers keep, so that a
    /// rollback of that many ([`KvCache::truncate`]) keeps what the next query reads.
    pub fn rollback_slack(&self) -> usize {
        self.rollback_slack
    }

    /// Sets [`KvCache::rollback_slack`] (0 where sequences never roll back: the serving loop).
    pub fn set_rollback_slack(&mut self, positions: usize) {
        self.rollback_slack = positions;
    }

    /// Whether `layer` keeps its positions in the window arena.
    pub(super) fn is_window_layer(&self, layer: usize) -> bool {
        reserve::in_window(&self.window, layer)
    }

    /// Positions the window layers' arena holds (0 without a window).
    pub fn window_capacity_tokens(&self) -> usize {
        self.pool.window.n_blocks() * self.block_size
    }

    /// Window blocks a sequence can take: free ones, and companions only the prefix cache
    /// holds (taking one reclaims it).
    pub fn free_window_blocks(&self) -> usize {
        self.pool.window.available()
    }

    /// Window blocks referenced by at least one sequence.
    pub fn used_window_blocks(&self) -> usize {
        self.pool.window.n_blocks() - self.pool.window.available()
    }

    pub fn total_window_blocks(&self) -> usize {
        self.pool.window.n_blocks()
    }

    /// (layers, KV heads, head size): what a model must match to use this cache.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
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
        self.pool.lru.len()
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
        let recurrent = self.recurrent_map(sequences.iter().map(|&(id, _, _)| id));
        let window = self.window.as_ref().map(|w| WindowMap {
            size: w.size,
            refs: self.pool.window.ref_counts.clone(),
            sequences: sequences
                .iter()
                .map(|&(id, _, _)| {
                    let s = &self.sequences[&id];
                    (s.window_from * self.block_size, s.window.clone())
                })
                .collect(),
            companions: self
                .pool
                .window
                .companion
                .iter()
                .map(|&w| w != NIL)
                .collect(),
            reclaims: self.pool.window.reclaims,
        });
        BlockMap {
            block_size: self.block_size,
            refs: self.pool.ref_counts.clone(),
            published: self.pool.published.clone(),
            sequences,
            evictions: self.pool.evictions,
            window,
            recurrent,
        }
    }

    /// Bytes of keys and values one position takes over all layers while it is in the window.
    pub fn bytes_per_token(&self) -> usize {
        self.layout.bytes_per_token(self.types, |_| true)
    }

    /// Layers that store keys and values (not the recurrent ones, nor those reading another
    /// layer's).
    pub fn n_kv_layers(&self) -> usize {
        self.layout.n_storing()
    }

    /// Bytes one position takes in the layers without a window: what each position of a
    /// context costs once it has left the window (all layers without a window).
    pub fn global_bytes_per_token(&self) -> usize {
        let window = &self.window;
        (self.layout).bytes_per_token(self.types, |l| !reserve::in_window(window, l))
    }

    /// Bytes the arenas occupy.
    pub fn arena_bytes(&self) -> usize {
        let window = self.bytes_per_token() - self.global_bytes_per_token();
        self.global_bytes_per_token() * self.capacity_tokens()
            + window * self.window_capacity_tokens()
    }
}
