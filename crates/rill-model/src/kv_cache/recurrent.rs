//! The second kind of memory: recurrent layers' fixed-size state.
//!
//! A recurrent layer (Gated DeltaNet, a short convolution, a state-space layer) keeps, per
//! sequence, a window of its last few convolution inputs and a state matrix, both of a size
//! that does not grow with the text. The state is valid only at the position it was left at, so
//! it cannot be shared part-way the way keys and values are.
//!
//! **Slots.** The arena holds a fixed number of *slots*, each one state of every recurrent
//! layer. A sequence holds its current state (at its length) and a *snapshot*: the state at the
//! last block boundary it crossed, taken by the forward pass as it goes by. Where sequences may
//! roll back (a cache with a rollback slack: speculative decoding) it holds a third, the
//! *checkpoint*: the state after the first row of its last pass of several rows, taken by the
//! pass as that row goes by (a draft's verification keeps at least that row: the pending
//! token's, so a rejected draft costs no recomputation; a prompt's next chunk likewise). A
//! rollback ([`KvCache::truncate`](super::KvCache::truncate)) goes back to the deepest of those
//! at or before the length asked for (the caller computes again from there), else to nothing.
//! Forks copy the state and the snapshot.
//!
//! **Prefix cache.** When a sequence publishes the block that ends at its snapshot, the snapshot
//! is copied into a *stored* slot named by that block's chained hash. A later prompt sharing the
//! prefix resumes from the deepest published block that has a stored snapshot (and no further:
//! keys and values alone cannot restore a recurrent layer). Stored snapshots are evicted least
//! recently used first.

use super::blocks::NIL;
use super::storage::Arena;
use super::{KvError, SeqId};
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

/// A sequence's slots.
pub(super) struct SeqState {
    state: u32,
    snapshot: u32,
    snapshot_at: Option<usize>,
    /// `NIL` where the cache keeps no checkpoints.
    checkpoint: u32,
    checkpoint_at: Option<usize>,
    /// The prefix cache has taken a copy of a snapshot of this sequence while it grew.
    stored: bool,
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
    /// Slots a sequence holds: 2, or 3 with a checkpoint.
    per_sequence: usize,
    /// Sequences holding slots.
    sequences: usize,
}

/// One sequence's state of one layer, mutable: the current state and, where the pass takes a
/// snapshot, the snapshot's place.
pub(crate) struct SeqLayerState<'a> {
    pub conv: &'a mut [f32],
    pub ssm: &'a mut [f32],
    pub snapshot: Option<(&'a mut [f32], &'a mut [f32])>,
    /// Where the pass keeps the state after the first row of a pass of several rows.
    pub checkpoint: Option<(&'a mut [f32], &'a mut [f32])>,
}

impl StateArena {
    /// Room for `max_sequences` sequences (two slots each) and `stored` prefix snapshots;
    /// `None` when the memory cannot be had. Untouched slots cost no memory (a fresh mapping).
    pub(super) fn new(
        shape: RecurrentShape,
        max_sequences: usize,
        stored: usize,
        checkpoints: bool,
    ) -> Option<StateArena> {
        let per_sequence = if checkpoints { 3 } else { 2 };
        let mut offsets = Vec::with_capacity(shape.layers.len());
        let mut at = 0;
        for l in &shape.layers {
            offsets.push(at);
            at += l.floats();
        }
        let slot_floats = at;
        let n_slots = max_sequences
            .checked_mul(per_sequence)?
            .checked_add(stored)?;
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
            per_sequence,
            sequences: 0,
        })
    }

    /// Sequences the arena holds at most (besides the prefix cache's snapshots).
    pub(super) fn max_sequences(&self) -> usize {
        (self.n_slots - self.store_capacity) / self.per_sequence
    }

    /// Sequences that can still be added (taking stored snapshots' slots if need be).
    pub(super) fn free_sequences(&self) -> usize {
        self.max_sequences() - self.sequences
    }

    /// A new sequence's zeroed slots.
    pub(super) fn take_seq(&mut self) -> Option<SeqState> {
        if self.free_sequences() == 0 {
            return None;
        }
        let state = self.take()?;
        let snapshot = self.take()?;
        let checkpoint = if self.per_sequence == 3 {
            self.take()?
        } else {
            NIL
        };
        self.sequences += 1;
        Some(SeqState {
            state,
            snapshot,
            snapshot_at: None,
            checkpoint,
            checkpoint_at: None,
            stored: false,
        })
    }

    /// A fork's slots: a copy of `from`'s state and snapshot (no checkpoint: a fork has not
    /// run a pass of its own).
    pub(super) fn fork_seq(&mut self, from: &SeqState) -> Option<SeqState> {
        let new = self.take_seq()?;
        self.copy(from.state, new.state);
        if from.snapshot_at.is_some() {
            self.copy(from.snapshot, new.snapshot);
        }
        Some(SeqState {
            snapshot_at: from.snapshot_at,
            ..new
        })
    }

    pub(super) fn release_seq(&mut self, s: &SeqState) {
        for slot in [s.state, s.snapshot, s.checkpoint] {
            self.release(slot);
        }
        self.sequences -= 1;
    }

    /// Goes back to the deepest snapshot or checkpoint at or before `len`, or to nothing;
    /// returns the length the state is now at.
    pub(super) fn roll_back(&mut self, s: &mut SeqState, len: usize) -> usize {
        let best = [(s.snapshot_at, s.snapshot), (s.checkpoint_at, s.checkpoint)]
            .into_iter()
            .filter_map(|(at, slot)| at.filter(|&at| at <= len).map(|at| (at, slot)))
            .max_by_key(|&(at, _)| at);
        match best {
            Some((at, slot)) => {
                self.copy(slot, s.state);
                // What lies past the new length is no longer the sequence's.
                s.snapshot_at = s.snapshot_at.filter(|&p| p <= at);
                s.checkpoint_at = s.checkpoint_at.filter(|&p| p <= at);
                at
            }
            None => {
                self.zero(s.state);
                s.snapshot_at = None;
                s.checkpoint_at = None;
                0
            }
        }
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
        slots: &[(u32, u32, u32)],
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
            .map(|&(current, snapshot, checkpoint)| {
                let (conv, ssm) = part(current);
                let snapshot = (snapshot != NIL).then(|| part(snapshot));
                let checkpoint = (checkpoint != NIL).then(|| part(checkpoint));
                SeqLayerState {
                    conv,
                    ssm,
                    snapshot,
                    checkpoint,
                }
            })
            .collect()
    }
}

impl super::KvCache {
    /// Adds the recurrent layers' state: room for `max_sequences` sequences and
    /// `prefix_snapshots` snapshots kept by the prefix cache. Sequences keep checkpoints for
    /// rollbacks where the cache has a rollback slack (set it first). Those layers stop keeping
    /// keys and values. For an empty cache only.
    pub fn with_recurrent_state(
        mut self,
        shape: RecurrentShape,
        max_sequences: usize,
        prefix_snapshots: usize,
    ) -> Result<super::KvCache, KvError> {
        let state_bytes = shape.state_bytes();
        let checkpoints = self.rollback_slack > 0;
        let arena = StateArena::new(shape, max_sequences.max(1), prefix_snapshots, checkpoints)
            .ok_or(KvError::StatesTooLarge {
                max_sequences,
                stored: prefix_snapshots,
                state_bytes,
            })?;
        for (layer, l) in arena.shape.layers.iter().enumerate() {
            if l.is_recurrent() {
                self.keys[layer] = Arena::new(self.types.keys, 0).expect("an empty arena");
                self.values[layer] = Arena::new(self.types.values, 0).expect("an empty arena");
            }
        }
        self.layout.drop_recurrent(&arena.shape);
        self.states = Some(arena);
        Ok(self)
    }

    /// The recurrent layers' state shape, for a model that has them.
    pub fn recurrent(&self) -> Option<&RecurrentShape> {
        self.states.as_ref().map(|a| &a.shape)
    }

    /// Bytes of recurrent state a sequence holds (its slots), 0 without recurrent layers.
    pub fn state_bytes_per_sequence(&self) -> usize {
        self.states
            .as_ref()
            .map_or(0, |a| a.per_sequence * a.shape.state_bytes())
    }

    /// Sequences the recurrent arena can still take (counting slots of snapshots the prefix
    /// cache keeps, which are given up for them); `usize::MAX` without recurrent layers.
    pub fn free_states(&self) -> usize {
        self.states
            .as_ref()
            .map_or(usize::MAX, StateArena::free_sequences)
    }

    /// Snapshots of recurrent state the prefix cache keeps.
    pub fn stored_snapshots(&self) -> usize {
        self.states.as_ref().map_or(0, StateArena::stored_snapshots)
    }

    /// Bytes of the recurrent-state arena (0 without recurrent layers).
    pub fn state_arena_bytes(&self) -> usize {
        self.states.as_ref().map_or(0, StateArena::bytes)
    }

    /// The positions of `seq`'s state snapshot and checkpoint, where it has them.
    pub fn state_snapshots(&self, seq: SeqId) -> Result<(Option<usize>, Option<usize>), KvError> {
        let s = self
            .sequences
            .get(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        Ok(s.state
            .as_ref()
            .map_or((None, None), |st| (st.snapshot_at, st.checkpoint_at)))
    }

    /// `layer`'s recurrent state of each of `seqs`, mutable at once, with the snapshot's place
    /// for those whose flag says the pass takes a snapshot in it.
    pub(crate) fn recurrent_layer(
        &mut self,
        layer: usize,
        seqs: &[(SeqId, bool, bool)],
        slots: &mut Vec<(u32, u32, u32)>,
    ) -> Result<Vec<SeqLayerState<'_>>, KvError> {
        slots.clear();
        for &(seq, snapshot, checkpoint) in seqs {
            let st = self
                .sequences
                .get(&seq)
                .and_then(|s| s.state.as_ref())
                .ok_or(KvError::UnknownSequence(seq))?;
            let pick = |wanted: bool, slot: u32| if wanted { slot } else { NIL };
            slots.push((
                st.state,
                pick(snapshot, st.snapshot),
                pick(checkpoint, st.checkpoint),
            ));
        }
        let n_layers = self.keys.len();
        match &mut self.states {
            Some(a) if a.shape.is_recurrent(layer) => Ok(a.layer_parts(layer, slots)),
            _ => Err(KvError::OutOfRange {
                layer,
                n_layers,
                kv_head: 0,
                n_kv_heads: 0,
                len: 0,
            }),
        }
    }

    /// Whether `seq` keeps checkpoints (the cache has a rollback slack).
    pub(crate) fn keeps_checkpoints(&self, seq: SeqId) -> bool {
        (self.sequences.get(&seq))
            .and_then(|s| s.state.as_ref())
            .is_some_and(|st| st.checkpoint != NIL)
    }

    /// Records that the pass kept `seq`'s state at position `pos` as its checkpoint (the state
    /// after the first row of a pass of several rows: whatever part of the pass a rollback
    /// keeps, it keeps that row, a speculative round's pending token).
    pub(crate) fn set_checkpoint_at(&mut self, seq: SeqId, pos: usize) -> Result<(), KvError> {
        let st = self
            .sequences
            .get_mut(&seq)
            .and_then(|s| s.state.as_mut())
            .ok_or(KvError::UnknownSequence(seq))?;
        st.checkpoint_at = Some(pos);
        Ok(())
    }

    pub(crate) fn set_snapshot_at(&mut self, seq: SeqId, pos: usize) -> Result<(), KvError> {
        let st = self
            .sequences
            .get_mut(&seq)
            .and_then(|s| s.state.as_mut())
            .ok_or(KvError::UnknownSequence(seq))?;
        st.snapshot_at = Some(pos);
        Ok(())
    }

    /// The arena as of now, with the snapshots of `seqs` in order.
    pub(super) fn recurrent_map(
        &self,
        seqs: impl Iterator<Item = SeqId>,
    ) -> Option<super::RecurrentMap> {
        let a = self.states.as_ref()?;
        Some(super::RecurrentMap {
            state_bytes: a.shape.state_bytes(),
            states_per_sequence: a.per_sequence,
            max_sequences: a.max_sequences(),
            free_sequences: a.free_sequences(),
            stored_snapshots: a.stored.len(),
            store_capacity: a.store_capacity,
            snapshots: seqs
                .map(|id| self.state_snapshots(id).unwrap_or((None, None)))
                .collect(),
        })
    }

    /// The snapshot slot and position of `seq`'s state, for the prefix cache to copy: once while
    /// the sequence grows (its first block boundary, usually in its prompt), and as it ends
    /// (`ending`: a conversation's next turn starts there), so that decoding does not copy a
    /// whole state every block.
    pub(super) fn snapshot_to_store(&mut self, seq: SeqId, ending: bool) -> Option<(u32, usize)> {
        let st = self.sequences.get_mut(&seq)?.state.as_mut()?;
        let at = st.snapshot_at?;
        if st.stored && !ending {
            return None;
        }
        st.stored = true;
        Some((st.snapshot, at))
    }

    /// Starts `seq`'s state from a stored snapshot taken at `len`.
    pub(super) fn start_from_snapshot(&mut self, seq: SeqId, stored: u32, len: usize) {
        let (Some(a), Some(st)) = (
            &mut self.states,
            self.sequences.get_mut(&seq).and_then(|s| s.state.as_mut()),
        ) else {
            return;
        };
        a.touch(stored);
        a.copy(stored, st.state);
        a.copy(stored, st.snapshot);
        st.snapshot_at = Some(len);
    }
}
