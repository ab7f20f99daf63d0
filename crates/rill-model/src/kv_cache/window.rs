//! The sliding-window layers' blocks.
//!
//! A layer with a window of `W` positions reads, for the query at position `p`, only the keys
//! at `p + 1 - W ..= p`. Those layers keep their keys and values in an arena of their own, in
//! blocks of the same size and index as the global layers' blocks: position `p` of a sequence
//! is in block `p / block_size` of both of its tables. A sequence lets go of the window layers'
//! blocks that no future query of it can read (before its next query's window), so the window
//! arena needs room for about one window per sequence, not for whole contexts.
//!
//! **Prefix cache.** A published (global) block keeps its window block as a *companion* (one
//! reference of its own), so a later prompt sharing that prefix can start from it: a prefix is
//! usable up to a position `n` when the companions of every block the query at `n` reads are
//! there. Companions that only the prefix cache holds are reclaimed, least recently used first,
//! when the window arena runs out; a prefix hit then ends where the window data it needs ends.

use super::blocks::{zeroed, NIL};
use super::lru::LruList;

/// Which layers attend through a sliding window, and how far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Positions a query reads: its own and the `size - 1` before it.
    pub size: usize,
    /// Per layer: whether it has the window.
    pub layers: Vec<bool>,
}

impl SlidingWindow {
    /// Positions before a sequence's window that its window layers keep unless told otherwise
    /// ([`KvCache::set_rollback_slack`](super::KvCache::set_rollback_slack)), so that a rollback of
    /// up to this many positions (a rejected speculative draft) keeps the window it reads.
    pub const DEFAULT_ROLLBACK_SLACK: usize = 64;

    /// The model's window, when some layers have one.
    pub fn of(config: &crate::ModelConfig) -> Option<SlidingWindow> {
        let size = config.sliding_window?;
        let layers: Vec<bool> = config.layer_is_sliding.clone();
        (size > 0 && layers.iter().any(|&s| s)).then_some(SlidingWindow { size, layers })
    }

    /// Layers with the window.
    pub fn n_window_layers(&self) -> usize {
        self.layers.iter().filter(|&&s| s).count()
    }

    /// The first position the query at `pos` reads.
    pub fn first_read(&self, pos: usize) -> usize {
        (pos + 1).saturating_sub(self.size)
    }
}

/// Reference counts and the free list of the window arena's blocks, and the prefix cache's
/// companions: per global block, the window block published with it.
pub(super) struct WindowPool {
    pub(super) ref_counts: Vec<u32>,
    pub(super) free: Vec<u32>,
    /// Per global block: its companion window block (`NIL`: none).
    pub(super) companion: Vec<u32>,
    /// Per window block: the global block it is the companion of (`NIL`: none).
    pub(super) owner: Vec<u32>,
    /// Companions only the prefix cache holds, in the order they are reclaimed: those a
    /// sequence let go of as its window slid past them first (most recent first), then those
    /// of sequences that ended (their last windows, which a next turn starts from), least
    /// recently released first.
    lru: LruList,
    pub(super) reclaims: u64,
}

impl WindowPool {
    /// A pool of `n_blocks` window blocks for an arena of `n_global` global blocks (both 0 when
    /// the cache has no window).
    pub(super) fn new(n_blocks: usize, n_global: usize) -> Option<WindowPool> {
        Some(WindowPool {
            ref_counts: zeroed(n_blocks, 0)?,
            free: (0..n_blocks as u32).rev().collect(),
            companion: zeroed(if n_blocks > 0 { n_global } else { 0 }, NIL)?,
            owner: zeroed(n_blocks, NIL)?,
            lru: LruList::new(n_blocks)?,
            reclaims: 0,
        })
    }

    pub(super) fn n_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Window blocks that can be taken: free ones and companions only the cache holds.
    pub(super) fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// A window block for a sequence to write into (reference count 1): a free one, else the
    /// least recently released companion, taken from its global block.
    pub(super) fn take(&mut self) -> Option<u32> {
        let w = match self.free.pop() {
            Some(w) => w,
            None => {
                let w = self.lru.pop_front()?;
                let b = std::mem::replace(&mut self.owner[w as usize], NIL);
                self.companion[b as usize] = NIL;
                self.reclaims += 1;
                w
            }
        };
        self.ref_counts[w as usize] = 1;
        Some(w)
    }

    /// Adds a sequence's reference to `w`.
    pub(super) fn retain(&mut self, w: u32) {
        if self.lru.contains(w) {
            self.lru.remove(w);
        }
        self.ref_counts[w as usize] += 1;
    }

    /// Drops one reference to `w`: unreferenced, it is free; held by the prefix cache alone,
    /// it becomes reclaimable (after those let go by a sliding window).
    pub(super) fn release(&mut self, w: u32) {
        if self.unref(w) {
            self.lru.push_back(w);
        }
    }

    /// [`WindowPool::release`] for a block a sequence's window slid past: held by the prefix
    /// cache alone, it is reclaimed before the last windows of ended sequences (a prompt
    /// diverging that far back is rarer than a conversation's next turn).
    pub(super) fn release_behind(&mut self, w: u32) {
        if self.unref(w) {
            self.lru.push_front(w);
        }
    }

    /// Drops a sequence's reference; whether only the prefix cache holds `w` now.
    fn unref(&mut self, w: u32) -> bool {
        let rc = &mut self.ref_counts[w as usize];
        *rc -= 1;
        match *rc {
            0 => {
                self.free.push(w);
                false
            }
            1 => self.owner[w as usize] != NIL,
            _ => false,
        }
    }

    /// Makes `w` (held by a sequence) the companion of the published global block `b`, unless
    /// `b` has one.
    pub(super) fn attach(&mut self, b: u32, w: u32) {
        if w == NIL || self.companion[b as usize] != NIL || self.owner[w as usize] != NIL {
            return;
        }
        self.companion[b as usize] = w;
        self.owner[w as usize] = b;
        self.ref_counts[w as usize] += 1;
    }

    /// Lets go of the companion of `b` (unpublished or evicted), if it has one.
    pub(super) fn detach(&mut self, b: u32) {
        let Some(&w) = self.companion.get(b as usize) else {
            return;
        };
        if w == NIL {
            return;
        }
        self.companion[b as usize] = NIL;
        self.owner[w as usize] = NIL;
        if self.lru.contains(w) {
            self.lru.remove(w);
        }
        let rc = &mut self.ref_counts[w as usize];
        *rc -= 1;
        if *rc == 0 {
            self.free.push(w);
        }
    }

    /// The companion of `b` (`NIL`: none, or no window).
    pub(super) fn companion_of(&self, b: u32) -> u32 {
        self.companion.get(b as usize).copied().unwrap_or(NIL)
    }
}
