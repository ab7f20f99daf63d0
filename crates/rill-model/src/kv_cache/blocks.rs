//! Blocks: reference counts, the free list, the prefix cache's hashes and its LRU, and the
//! events routers read.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

pub(super) fn zeroed<T: Clone>(n: usize, zero: T) -> Option<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, zero);
    Some(v)
}

/// No block (end of a list, or not published).
pub(super) const NIL: u32 = u32::MAX;

/// Hash of the (empty) prefix before a sequence's first block.
pub(super) const ROOT_HASH: u64 = 0x7269_6c6c_5f6b_7600;

/// The hash naming a block: its tokens chained with the hash of its prefix.
pub(super) fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
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
pub(super) struct BlockPool {
    pub(super) block_size: usize,
    pub(super) ref_counts: Vec<u32>,
    /// Blocks nobody references that are not published.
    pub(super) free: Vec<u32>,
    /// Per block, its hash while published (`published[b]`), the hash of its prefix and its
    /// tokens, checked on every lookup: a block is handed out only for its own tokens after a
    /// prefix of the same (64-bit, chained) hash.
    pub(super) published: Vec<bool>,
    pub(super) hash: Vec<u64>,
    pub(super) parent: Vec<u64>,
    pub(super) tokens: Vec<u32>,
    /// Per block, the positions it holds while published: the block size, or fewer for the
    /// partly filled last block of a sequence that ended ([`KvCache::publish_tail`]).
    pub(super) filled: Vec<u32>,
    /// Published blocks by hash.
    pub(super) by_hash: HashMap<u64, u32>,
    /// Published blocks by the hash of their prefix: where a prompt that leaves a block
    /// part-way (an edit, a branch, a context that ended mid-block) finds the positions it
    /// shares with one.
    pub(super) by_parent: HashMap<u64, Vec<u32>>,
    /// Published blocks nobody references, least recently used first.
    pub(super) lru: super::lru::LruList,
    pub(super) evictions: u64,
    /// Changes to the prefix cache since they were last taken (when recording).
    pub(super) events: Option<Vec<KvEvent>>,
    /// The sliding-window layers' blocks and the published blocks' companions among them.
    pub(super) window: super::window::WindowPool,
}

impl BlockPool {
    pub(super) fn new(
        n_blocks: usize,
        block_size: usize,
        n_window_blocks: usize,
    ) -> Option<BlockPool> {
        Some(BlockPool {
            block_size,
            ref_counts: zeroed(n_blocks, 0)?,
            free: (0..n_blocks as u32).rev().collect(),
            published: zeroed(n_blocks, false)?,
            hash: zeroed(n_blocks, 0)?,
            parent: zeroed(n_blocks, 0)?,
            tokens: zeroed(n_blocks.checked_mul(block_size)?, 0)?,
            filled: zeroed(n_blocks, 0)?,
            by_hash: HashMap::new(),
            by_parent: HashMap::new(),
            lru: super::lru::LruList::new(n_blocks)?,
            evictions: 0,
            events: None,
            window: super::window::WindowPool::new(n_window_blocks, n_blocks)?,
        })
    }

    /// Blocks that can be taken: free ones and idle cached ones.
    pub(super) fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// A block for a sequence to write into (reference count 1): a free one, else the least
    /// recently used idle cached one, evicted. `None` when there is neither.
    pub(super) fn take(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let b = self.lru.pop_front()?;
                self.unpublish(b);
                self.evictions += 1;
                b
            }
        };
        self.ref_counts[b as usize] = 1;
        Some(b)
    }

    /// Adds a reference to `b` (shared by a fork or a prefix hit).
    pub(super) fn retain(&mut self, b: u32) {
        if self.ref_counts[b as usize] == 0 {
            // Only an idle cached block is referenced from nothing.
            self.lru.remove(b);
        }
        self.ref_counts[b as usize] += 1;
    }

    /// Drops one reference to `block`: when nobody holds it any more it goes back to the free
    /// list, or, published, to the most recently used end of the cached ones.
    pub(super) fn release(&mut self, block: u32) {
        let rc = &mut self.ref_counts[block as usize];
        *rc -= 1;
        if *rc == 0 {
            if self.published[block as usize] {
                self.lru.push_back(block);
            } else {
                self.free.push(block);
            }
        }
    }

    pub(super) fn unpublish(&mut self, b: u32) {
        if std::mem::take(&mut self.published[b as usize]) {
            self.window.detach(b);
            let (h, parent) = (self.hash[b as usize], self.parent[b as usize]);
            if let Some(siblings) = self.by_parent.get_mut(&parent) {
                siblings.retain(|&x| x != b);
                if siblings.is_empty() {
                    self.by_parent.remove(&parent);
                }
            }
            if self.by_hash.get(&h) == Some(&b) {
                self.by_hash.remove(&h);
                let full = self.filled[b as usize] as usize == self.block_size;
                if let (Some(events), true) = (&mut self.events, full) {
                    match events.last_mut() {
                        Some(KvEvent::Removed { hashes }) => hashes.push(h),
                        _ => events.push(KvEvent::Removed { hashes: vec![h] }),
                    }
                }
            }
        }
    }

    /// Publishes block `b` (holding `tokens`, at most a block's worth, after the prefix named
    /// `parent`) under `h`, unless that hash already names a block. Only full blocks are
    /// announced to routers (their events name whole blocks).
    pub(super) fn publish(&mut self, b: u32, h: u64, parent: u64, tokens: &[u32]) -> bool {
        if self.published[b as usize] || self.by_hash.contains_key(&h) {
            return false;
        }
        let bs = self.block_size;
        self.published[b as usize] = true;
        self.hash[b as usize] = h;
        self.parent[b as usize] = parent;
        self.filled[b as usize] = tokens.len() as u32;
        self.tokens[b as usize * bs..b as usize * bs + tokens.len()].copy_from_slice(tokens);
        self.by_hash.insert(h, b);
        self.by_parent.entry(parent).or_default().push(b);
        if tokens.len() < bs {
            return true;
        }
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

    /// The published full block holding `tokens` after the prefix named `parent`, if any.
    pub(super) fn find(&self, h: u64, parent: u64, tokens: &[u32]) -> Option<u32> {
        let &b = self.by_hash.get(&h)?;
        let bs = self.block_size;
        (self.published[b as usize]
            && self.parent[b as usize] == parent
            && self.filled[b as usize] as usize == bs
            && self.tokens[b as usize * bs..(b as usize + 1) * bs] == *tokens)
            .then_some(b)
    }

    /// The published block after the prefix named `parent` whose leading positions hold the
    /// most leading tokens of `rest`, with how many (at least one, fewer than a block): a block
    /// to share part of.
    pub(super) fn find_partial(&self, parent: u64, rest: &[u32]) -> Option<(u32, usize)> {
        let bs = self.block_size;
        let limit = rest.len().min(bs - 1);
        self.by_parent
            .get(&parent)?
            .iter()
            .map(|&b| {
                let held = &self.tokens[b as usize * bs..][..self.filled[b as usize] as usize];
                let same = held
                    .iter()
                    .zip(&rest[..limit])
                    .take_while(|(a, b)| a == b)
                    .count();
                (b, same)
            })
            .filter(|&(_, same)| same > 0)
            // The longest; on a tie the lowest block id, so a lookup is deterministic.
            .max_by_key(|&(b, same)| (same, std::cmp::Reverse(b)))
    }
}
