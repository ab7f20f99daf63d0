//! The second kind of memory: recurrent layers' fixed-size state.
//!
//! A recurrent layer (Gated DeltaNet, a short convolution, a state-space layer) keeps, per
//! sequence, a window of its last few convolution inputs and a state matrix, both of a size
//! that does not grow with the text. The state is valid only at the position it was left at, so
//! it cannot be shared part-way the way keys and values are.
//!
//! **Slots.** The arena holds a fixed number of *slots*, each one state of every recurrent
//! layer. A sequence holds two: its current state (at its length) and a *snapshot*, the state at
//! the last block boundary it crossed (taken by the forward pass as it goes by). A rollback
//! ([`KvCache::truncate`](super::KvCache::truncate)) to a length at or after the snapshot goes
//! back to the snapshot (the caller computes again from there); to an earlier one, to nothing.
//! Forks copy both slots.
//!
//! **Prefix cache.** When a sequence publishes the block that ends at its snapshot, the snapshot
//! is copied into a *stored* slot named by that block's chained hash. A later prompt sharing the
//! prefix resumes from the deepest published block that has a stored snapshot (and no further:
//! keys and values alone cannot restore a recurrent layer). Stored snapshots are evicted least
//! recently used first.

use super::blocks::NIL;
use crate::large_buffer::LargeBuffer;

/// The recurrent layers' state, per layer (both sizes 0 where a layer keeps keys and values).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecurrentShape {
    pub layers: Vec<LayerState>,
}

/// One layer's state: floats of its convolution window and of its recurrent state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayerState {
    pub conv: usize,
    pub ssm: usize,
}

impl LayerState {
    pub fn floats(&self) -> usize {
        self.conv + self.ssm
    }

    pub fn is_recurrent(&self) -> bool {
        self.floats() > 0
    }
}

impl RecurrentShape {
    /// The model's recurrent state, when it has recurrent layers.
    pub fn of(config: &crate::ModelConfig) -> Option<RecurrentShape> {
        let layers: Vec<LayerState> = (0..config.n_layers)
            .map(|il| config.layer_state(il))
            .collect();
        layers
            .iter()
            .any(LayerState::is_recurrent)
            .then_some(RecurrentShape { layers })
    }

    /// Floats of one state of every layer.
    pub fn floats(&self) -> usize {
        self.layers.iter().map(LayerState::floats).sum()
    }

    /// Bytes of one state of every layer (f32).
    pub fn state_bytes(&self) -> usize {
        self.floats() * 4
    }

    /// Bytes a sequence holds: its current state and its snapshot.
    pub fn bytes_per_sequence(&self) -> usize {
        2 * self.state_bytes()
    }

    pub fn is_recurrent(&self, layer: usize) -> bool {
        self.layers.get(layer).is_some_and(LayerState::is_recurrent)
    }

    pub fn n_recurrent(&self) -> usize {
        self.layers.iter().filter(|l| l.is_recurrent()).count()
    }
}

/// A snapshot the prefix cache keeps: the state after the block published under `hash`.
struct Stored {
    hash: u64,
    /// The block it was published with (a snapshot is used only with that very block).
    block: u32,
    slot: u32,
    last_used: u64,
}

/// The slots and the prefix cache's stored snapshots.
pub(super) struct StateArena {
    pub(super) shape: RecurrentShape,
    /// Per layer, where its convolution window starts in a slot (its state follows it).
    offsets: Vec<usize>,
    slot_floats: usize,
    data: LargeBuffer<f32>,
    free: Vec<u32>,
    n_slots: usize,
    stored: Vec<Stored>,
    /// Slots the prefix cache may keep snapshots in.
    store_capacity: usize,
    clock: u64,
}

/// One sequence's state of one layer, mutable: the current state and, where the pass takes a
/// snapshot, the snapshot's place.
pub(crate) struct SeqLayerState<'a> {
    pub conv: &'a mut [f32],
    pub ssm: &'a mut [f32],
    pub snapshot: Option<(&'a mut [f32], &'a mut [f32])>,
}

impl StateArena {
    /// Room for `max_sequences` sequences (two slots each) and `stored` prefix snapshots;
    /// `None` when the memory cannot be had. Untouched slots cost no memory (a fresh mapping).
    pub(super) fn new(
        shape: RecurrentShape,
        max_sequences: usize,
        stored: usize,
    ) -> Option<StateArena> {
        let mut offsets = Vec::with_capacity(shape.layers.len());
        let mut at = 0;
        for l in &shape.layers {
            offsets.push(at);
            at += l.floats();
        }
        let slot_floats = at;
        let n_slots = max_sequences.checked_mul(2)?.checked_add(stored)?;
        let data = LargeBuffer::zeroed(n_slots.checked_mul(slot_floats)?)?;
        u32::try_from(n_slots).ok()?;
        Some(StateArena {
            shape,
            offsets,
            slot_floats,
            data,
            free: (0..n_slots as u32).rev().collect(),
            n_slots,
            stored: Vec::new(),
            store_capacity: stored,
            clock: 0,
        })
    }

    pub(super) fn n_slots(&self) -> usize {
        self.n_slots
    }

    pub(super) fn free_slots(&self) -> usize {
        self.free.len() + self.stored.len()
    }

    pub(super) fn stored_snapshots(&self) -> usize {
        self.stored.len()
    }

    pub(super) fn bytes(&self) -> usize {
        self.n_slots * self.slot_floats * 4
    }

    /// A zeroed slot: a free one, else the least recently used stored snapshot's.
    pub(super) fn take(&mut self) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let oldest = (0..self.stored.len()).min_by_key(|&i| self.stored[i].last_used)?;
                self.stored.swap_remove(oldest).slot
            }
        };
        self.slot_mut(slot).fill(0.0);
        Some(slot)
    }

    /// Two zeroed slots, or none.
    pub(super) fn take_pair(&mut self) -> Option<(u32, u32)> {
        let a = self.take()?;
        match self.take() {
            Some(b) => Some((a, b)),
            None => {
                self.release(a);
                None
            }
        }
    }

    pub(super) fn release(&mut self, slot: u32) {
        if slot != NIL {
            self.free.push(slot);
        }
    }

    fn range(&self, slot: u32) -> std::ops::Range<usize> {
        let at = slot as usize * self.slot_floats;
        at..at + self.slot_floats
    }

    fn slot_mut(&mut self, slot: u32) -> &mut [f32] {
        let r = self.range(slot);
        &mut self.data[r]
    }

    pub(super) fn zero(&mut self, slot: u32) {
        self.slot_mut(slot).fill(0.0);
    }

    pub(super) fn copy(&mut self, from: u32, to: u32) {
        if from != to {
            let src = self.range(from);
            self.data.copy_within(src, to as usize * self.slot_floats);
        }
    }

    /// Keeps a copy of `slot` as the snapshot after `block` (published under `hash`), unless
    /// one is kept already. Returns whether it was stored.
    pub(super) fn store(&mut self, hash: u64, block: u32, slot: u32) -> bool {
        if self.store_capacity == 0 {
            return false;
        }
        self.clock += 1;
        if let Some(s) = self.stored.iter_mut().find(|s| s.hash == hash) {
            if s.block == block {
                s.last_used = self.clock;
                return false;
            }
            // The same prefix published again with another block: the newer one.
            let to = s.slot;
            s.block = block;
            s.last_used = self.clock;
            self.copy(slot, to);
            return true;
        }
        let to = if self.stored.len() < self.store_capacity {
            match self.free.pop() {
                Some(s) => s,
                None => return false,
            }
        } else {
            let oldest = (0..self.stored.len())
                .min_by_key(|&i| self.stored[i].last_used)
                .expect("a full store holds snapshots");
            self.stored.swap_remove(oldest).slot
        };
        self.copy(slot, to);
        self.stored.push(Stored {
            hash,
            block,
            slot: to,
            last_used: self.clock,
        });
        true
    }

    /// The stored snapshot after `block` (published under `hash`).
    pub(super) fn find(&self, hash: u64, block: u32) -> Option<u32> {
        self.stored
            .iter()
            .find(|s| s.hash == hash && s.block == block)
            .map(|s| s.slot)
    }

    /// Marks the stored snapshot `slot` as just used.
    pub(super) fn touch(&mut self, slot: u32) {
        self.clock += 1;
        if let Some(s) = self.stored.iter_mut().find(|s| s.slot == slot) {
            s.last_used = self.clock;
        }
    }

    /// Forgets every stored snapshot.
    pub(super) fn clear_store(&mut self) {
        for s in self.stored.drain(..) {
            self.free.push(s.slot);
        }
    }

    /// `layer`'s part of each of `slots` (current, then the snapshot where it is not `NIL`),
    /// mutable at once: the slots must be distinct.
    pub(super) fn layer_parts(
        &mut self,
        layer: usize,
        slots: &[(u32, u32)],
    ) -> Vec<SeqLayerState<'_>> {
        let l = self.shape.layers[layer];
        let off = self.offsets[layer];
        let mut by_slot: Vec<Option<&mut [f32]>> = self
            .data
            .chunks_exact_mut(self.slot_floats)
            .map(Some)
            .collect();
        let mut part = |slot: u32| -> (&mut [f32], &mut [f32]) {
            let whole = by_slot[slot as usize].take().expect("distinct slots");
            let (conv, ssm) = whole[off..off + l.floats()].split_at_mut(l.conv);
            (conv, ssm)
        };
        slots
            .iter()
            .map(|&(current, snapshot)| {
                let (conv, ssm) = part(current);
                let snapshot = (snapshot != NIL).then(|| part(snapshot));
                SeqLayerState {
                    conv,
                    ssm,
                    snapshot,
                }
            })
            .collect()
    }
}
