//! Room for what a sequence writes next: new blocks, copies of shared ones, and the window
//! layers' blocks it no longer needs let go.

use super::blocks::NIL;
use super::{KvCache, KvError, SeqId, Sequence};

impl KvCache {
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

    /// Window blocks needed to grow `seq` to `new_len` positions with the window layers' blocks
    /// taken for the next `ahead` positions only (the most one pass writes), counting the copy
    /// of a shared one. 0 without a window.
    pub fn window_blocks_needed(
        &self,
        seq: SeqId,
        new_len: usize,
        ahead: usize,
    ) -> Result<usize, KvError> {
        let s = self
            .sequences
            .get(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let Some((from, end)) = self.window_range(s, new_len, ahead) else {
            return Ok(0);
        };
        let missing = (from..end)
            .filter(|&i| s.window.get(i).is_none_or(|&w| w == NIL))
            .count();
        Ok(missing + usize::from(self.copies_window_block(s, new_len)))
    }

    /// Whether growing `s` to `new_len` copies its window block at the partly filled position:
    /// when the global block there is copied and the window one is held.
    fn copies_window_block(&self, s: &Sequence, new_len: usize) -> bool {
        self.shared_partial_block(s, new_len).is_some()
            && s.window
                .get(s.len / self.block_size)
                .is_some_and(|&w| w != NIL)
    }

    /// The block indices whose window blocks `s` needs for a pass growing it to `new_len` (at
    /// most `ahead` positions past its length): from the block of the first position its next
    /// query reads. `None` without a window.
    fn window_range(&self, s: &Sequence, new_len: usize, ahead: usize) -> Option<(usize, usize)> {
        let w = self.window.as_ref()?;
        let bs = self.block_size;
        let from = (w.first_read(s.len) / bs).max(s.window_from);
        let end = new_len.min(s.len.saturating_add(ahead)).div_ceil(bs);
        Some((from, end.max(from)))
    }

    /// Whether `seq` can grow to `new_len` (window blocks for the next `ahead` positions) and
    /// leave at least `spare` blocks free in each arena.
    pub fn fits(&self, seq: SeqId, new_len: usize, ahead: usize, spare: usize) -> bool {
        let global = self.blocks_needed(seq, new_len);
        let window = self.window_blocks_needed(seq, new_len, ahead);
        let room = |needed: Result<usize, KvError>, available: usize| {
            needed.is_ok_and(|n| n.saturating_add(spare) <= available)
        };
        room(global, self.pool.available())
            && (self.window.is_none() || room(window, self.pool.window.available()))
    }

    /// Lets go of the window blocks of `seq` before the first position its next query reads.
    fn slide(&mut self, seq: SeqId) {
        let Some(w) = &self.window else {
            return;
        };
        let Some(s) = self.sequences.get_mut(&seq) else {
            return;
        };
        let keep_from = w.first_read(s.len).saturating_sub(self.rollback_slack);
        let floor = (keep_from / self.block_size).min(s.window.len());
        for i in s.window_from..floor {
            let held = std::mem::replace(&mut s.window[i], NIL);
            if held != NIL {
                self.pool.window.release_behind(held);
            }
        }
        s.window_from = s.window_from.max(floor);
    }

    fn out_of_blocks(&self, needed: usize, window: bool) -> KvError {
        let (free, capacity_tokens) = if window {
            (self.pool.window.available(), self.window_capacity_tokens())
        } else {
            (self.pool.available(), self.capacity_tokens())
        };
        KvError::OutOfBlocks {
            needed,
            free,
            block_size: self.block_size,
            capacity_tokens,
            window,
        }
    }

    /// Whether a write into the partly filled block `b` must go to a copy: when other
    /// sequences share it, or it is published (a cached block is never written: it may be
    /// shared again part-way, and its tokens name what it holds).
    fn must_copy(&self, b: u32) -> bool {
        self.pool.ref_counts[b as usize] > 1 || self.pool.published[b as usize]
    }

    /// Makes room for several sequences at once, or for none of them: on error nothing is
    /// reserved (the window layers may have let go of blocks no query reads any more).
    ///
    /// The count is exact when every sequence appears once: when `k` sequences of the call grow
    /// out of one shared, partly filled block held by `rc` sequences, `min(k, rc - 1)` copies are
    /// needed (the last owner to grow writes into the original), not `k`.
    pub fn reserve_all(&mut self, wanted: &[(SeqId, usize)]) -> Result<(), KvError> {
        for &(seq, _) in wanted {
            self.slide(seq);
        }
        let distinct = wanted
            .iter()
            .enumerate()
            .all(|(i, (seq, _))| wanted[..i].iter().all(|(other, _)| other != seq));
        let (mut needed, mut needed_window) = (0, 0);
        for (i, &(seq, len)) in wanted.iter().enumerate() {
            needed += self.blocks_needed(seq, len)?;
            needed_window += self.window_blocks_needed(seq, len, usize::MAX)?;
            if !distinct {
                // A sequence listed twice: the plain sum over-counts, which is safe.
                continue;
            }
            let s = &self.sequences[&seq];
            let Some(shared) = self.shared_partial_block(s, len) else {
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
                // Its window block is shared by the same owners (forks share both tables).
                needed_window -= usize::from(self.copies_window_block(s, len));
            }
        }
        if needed > self.pool.available() {
            return Err(self.out_of_blocks(needed, false));
        }
        if self.window.is_some() && needed_window > self.pool.window.available() {
            return Err(self.out_of_blocks(needed_window, true));
        }
        for &(seq, len) in wanted {
            self.reserve(seq, len)?;
        }
        Ok(())
    }

    /// Makes room for positions `len..new_len` of `seq`, so writes to them cannot fail.
    pub fn reserve(&mut self, seq: SeqId, new_len: usize) -> Result<(), KvError> {
        self.reserve_within(seq, new_len, usize::MAX)
    }

    /// Makes room for positions `len..new_len` of `seq` in the global layers, and for the
    /// next `ahead` of them in the window layers (what its next pass may write: a later
    /// reservation takes the rest as the window slides on), letting go first of the window
    /// blocks its next query no longer reads.
    pub fn reserve_within(
        &mut self,
        seq: SeqId,
        new_len: usize,
        ahead: usize,
    ) -> Result<(), KvError> {
        self.slide(seq);
        let needed = self.blocks_needed(seq, new_len)?;
        if needed > self.pool.available() {
            return Err(self.out_of_blocks(needed, false));
        }
        let needed_window = self.window_blocks_needed(seq, new_len, ahead)?;
        if self.window.is_some() && needed_window > self.pool.window.available() {
            return Err(self.out_of_blocks(needed_window, true));
        }
        let window_range = self.window_range(&self.sequences[&seq], new_len, ahead);
        let bs = self.block_size;
        let layout = &self.layout;
        let out_of_blocks = self.out_of_blocks(needed, false);
        let out_of_window_blocks = self.out_of_blocks(needed_window, true);
        let s = self
            .sequences
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        // Copy-on-write of a shared or published, partly filled last block (the block of
        // position `len`, which is not the table's last when blocks were reserved past the end
        // before a fork), and of its window block with it.
        if new_len > s.len && s.len % bs != 0 {
            let idx = s.len / bs;
            let last = s.blocks[idx];
            let rc = self.pool.ref_counts[last as usize];
            if rc > 1 || self.pool.published[last as usize] {
                // Counted above; the block is referenced, so taking cannot evict it.
                let fresh = self.pool.take().ok_or(out_of_blocks.clone())?;
                self.pool.release(last);
                let arenas = self.keys.iter_mut().zip(self.values.iter_mut());
                for (layer, (k, v)) in arenas.enumerate() {
                    // Recurrent and KV-shared layers store no keys or values.
                    let n = bs * layout.stored_dim(layer);
                    if !in_window(&self.window, layer) && n > 0 {
                        k.copy_within(last as usize * n, fresh as usize * n, n);
                        v.copy_within(last as usize * n, fresh as usize * n, n);
                    }
                }
                s.blocks[idx] = fresh;
                let held = s.window.get(idx).copied().unwrap_or(NIL);
                if held != NIL {
                    // Also referenced: taking reclaims another companion, never this one.
                    let copy = self
                        .pool
                        .window
                        .take()
                        .ok_or(out_of_window_blocks.clone())?;
                    self.pool.window.release(held);
                    let arenas = self.keys.iter_mut().zip(self.values.iter_mut());
                    for (layer, (k, v)) in arenas.enumerate() {
                        let n = bs * layout.stored_dim(layer);
                        if in_window(&self.window, layer) && n > 0 {
                            k.copy_within(held as usize * n, copy as usize * n, n);
                            v.copy_within(held as usize * n, copy as usize * n, n);
                        }
                    }
                    s.window[idx] = copy;
                }
            }
        }
        while s.blocks.len() < new_len.div_ceil(bs) {
            let b = self.pool.take().ok_or(out_of_blocks.clone())?;
            s.blocks.push(b);
        }
        if let Some((from, end)) = window_range {
            s.window.resize(s.blocks.len(), NIL);
            for i in from..end.min(s.window.len()) {
                if s.window[i] == NIL {
                    s.window[i] = self
                        .pool
                        .window
                        .take()
                        .ok_or(out_of_window_blocks.clone())?;
                }
            }
        }
        Ok(())
    }
}

/// Whether `layer` keeps its positions in the window arena.
pub(super) fn in_window(window: &Option<super::SlidingWindow>, layer: usize) -> bool {
    window
        .as_ref()
        .is_some_and(|w| w.layers.get(layer) == Some(&true))
}
