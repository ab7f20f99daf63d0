//! The prefix cache: publishing blocks under their prefix's hash, finding and attaching them.

use super::blocks::{block_hash, NIL, ROOT_HASH};
use super::{KvCache, KvError, KvEvent, PrefixHit, SeqId};

impl KvCache {
    /// Publishes the full blocks of `seq` in the prefix cache. `tokens` are the tokens at its
    /// positions from 0 (at most its length; the same tokens on every call: blocks hashed on an
    /// earlier call are not hashed again). A block whose hash already names another cached block
    /// (the same prefix computed twice) is left unpublished. Returns the blocks newly published.
    pub fn publish_prefix(&mut self, seq: SeqId, tokens: &[u32]) -> Result<usize, KvError> {
        self.publish(seq, tokens, false)
    }

    /// [`KvCache::publish_prefix`]; `ending`: the sequence will grow no more (its recurrent
    /// state's snapshot is stored whatever was stored before).
    fn publish(&mut self, seq: SeqId, tokens: &[u32], ending: bool) -> Result<usize, KvError> {
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
            let b = s.blocks[i];
            published += usize::from(self.pool.publish(b, h, parent, chunk));
            if self.pool.published[b as usize] {
                // Its window data stays with it while the window arena has room.
                self.pool
                    .window
                    .attach(b, s.window.get(i).copied().unwrap_or(NIL));
            }
        }
        // The recurrent state after the last hashed block, where the sequence's snapshot is.
        let hashed = s.hashes.len();
        let storable = |at: usize| at.is_multiple_of(bs) && at / bs > 0 && at / bs <= hashed;
        let snapshot = self.state_snapshots(seq).ok().and_then(|p| p.0);
        if let Some((slot, at)) = snapshot
            .filter(|&at| storable(at))
            .and_then(|_| self.snapshot_to_store(seq, ending))
        {
            let h = self.sequences[&seq].hashes[at / bs - 1];
            if let (Some(a), Some(&b)) = (&mut self.states, self.pool.by_hash.get(&h)) {
                a.store(h, b, slot);
            }
        }
        Ok(published)
    }

    /// The longest cached prefix of `tokens`: its leading full blocks, then the positions a
    /// published block after them shares with the next tokens (a block that ended part-way, or
    /// one whose tokens differ from some point on). Pass `&tokens[..n]` to leave positions
    /// from `n` on to be computed.
    ///
    /// With a sliding window, the prefix ends where the window data its next query reads is
    /// no longer cached (see [`SlidingWindow`](super::SlidingWindow)).
    pub fn lookup_prefix(&self, tokens: &[u32]) -> PrefixHit {
        let found = self.find_prefix(tokens);
        let bs = self.block_size;
        let held = &found.blocks[..found.usable.div_ceil(bs)];
        PrefixHit {
            blocks: found.usable / bs,
            partial: found.usable % bs,
            tokens: found.usable,
            idle_blocks: held
                .iter()
                .filter(|&&b| self.pool.ref_counts[b as usize] == 0)
                .count(),
        }
    }

    /// The published blocks `tokens` start with, and how many of their positions a sequence
    /// can start from.
    fn find_prefix(&self, tokens: &[u32]) -> FoundPrefix {
        let mut blocks = Vec::new();
        let mut hashes = Vec::new();
        let parent = self.walk_prefix(tokens, |b, h| {
            blocks.push(b);
            hashes.push(h);
        });
        let mut found = blocks.len() * self.block_size;
        if let Some((b, same)) = self.pool.find_partial(parent, &tokens[found..]) {
            blocks.push(b);
            found += same;
        }
        let usable = self.state_usable(&blocks, &hashes, self.window_usable(&blocks, found));
        FoundPrefix {
            blocks,
            hashes,
            usable,
        }
    }

    /// The longest `n <= found` such that the companions of `blocks` hold every position the
    /// query at `n` reads in the window layers (`found` without a window; 0 always works).
    fn window_usable(&self, blocks: &[u32], found: usize) -> usize {
        let Some(w) = &self.window else {
            return found;
        };
        let bs = self.block_size;
        // For each block index, the last one at or before it without a companion.
        let mut last_missing = Vec::with_capacity(blocks.len());
        let mut missing = None;
        for (i, &b) in blocks.iter().enumerate() {
            if self.pool.window.companion_of(b) == NIL {
                missing = Some(i);
            }
            last_missing.push(missing);
        }
        // The query at `n` reads blocks `first_read(n) / bs ..= (n - 1) / bs`; for each last
        // block `u` the largest such `n` reads the fewest.
        for u in (0..found.div_ceil(bs)).rev() {
            let n = found.min((u + 1) * bs);
            let first = w.first_read(n) / bs;
            if last_missing[u].is_none_or(|m| m < first) {
                return n;
            }
        }
        0
    }

    /// The largest `n <= found` at which the recurrent layers' state is stored (a block
    /// boundary), or `found` without recurrent layers.
    fn state_usable(&self, blocks: &[u32], hashes: &[u64], found: usize) -> usize {
        let Some(a) = &self.states else {
            return found;
        };
        let full = (found / self.block_size).min(hashes.len());
        (1..=full)
            .rev()
            .find(|&i| a.find(hashes[i - 1], blocks[i - 1]).is_some())
            .map_or(0, |i| i * self.block_size)
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
        let found = self.find_prefix(tokens);
        let bs = self.block_size;
        let len = found.usable;
        let held = &found.blocks[..len.div_ceil(bs)];
        for &b in held {
            self.pool.retain(b);
        }
        let window_from = self.window.as_ref().map(|w| w.first_read(len) / bs);
        let s = self
            .sequences
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        s.blocks.extend_from_slice(held);
        s.hashes
            .extend_from_slice(&found.hashes[..(len / bs).min(found.hashes.len())]);
        s.len = len;
        let stored = match (&self.states, len > 0) {
            (Some(a), true) => a.find(found.hashes[len / bs - 1], found.blocks[len / bs - 1]),
            _ => None,
        };
        if let Some(from) = window_from {
            // The companions of the blocks the next query reads (`window_usable` checked them).
            s.window_from = from;
            for (i, &b) in held.iter().enumerate() {
                let w = if i < from {
                    NIL
                } else {
                    self.pool.window.companion_of(b)
                };
                if w != NIL {
                    self.pool.window.retain(w);
                }
                s.window.push(w);
            }
        }
        if let Some(stored) = stored {
            self.start_from_snapshot(seq, stored, len);
        }
        Ok(len)
    }

    /// Publishes the partly filled last block of `seq` (its positions past the last full
    /// block, whose `tokens` are given as for [`KvCache::publish_prefix`]) so that a prompt
    /// continuing from there shares it, for a sequence that will write no more into it (call it
    /// as it ends). Full blocks are published as by [`KvCache::publish_prefix`]. Returns whether
    /// the partial block was published.
    pub fn publish_tail(&mut self, seq: SeqId, tokens: &[u32]) -> Result<bool, KvError> {
        self.publish(seq, tokens, true)?;
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
        let published = self
            .pool
            .publish(b, block_hash(parent, chunk), parent, chunk);
        if published {
            let w = s.window.get(full).copied().unwrap_or(NIL);
            self.pool.window.attach(b, w);
        }
        Ok(published)
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
        while let Some(b) = self.pool.lru.pop_front() {
            self.pool.unpublish(b);
            self.pool.free.push(b);
        }
        for b in 0..self.n_blocks as u32 {
            self.pool.unpublish(b);
        }
        self.pool.by_hash.clear();
        self.pool.by_parent.clear();
        if let Some(a) = &mut self.states {
            a.clear_store();
        }
        if let Some(events) = &mut self.pool.events {
            // One event says it all.
            events.clear();
            events.push(KvEvent::AllCleared);
        }
    }
}

/// What [`KvCache::find_prefix`] found.
struct FoundPrefix {
    /// The leading full blocks, then the one shared part-way, if any.
    blocks: Vec<u32>,
    /// The full blocks' hashes.
    hashes: Vec<u64>,
    /// Positions a sequence can start from (at most those the blocks hold).
    usable: usize,
}
