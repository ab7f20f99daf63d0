//! Recurrent token mixers: Gated DeltaNet (Qwen3.5's linear attention) and the gated short
//! convolution (LFM2). Each keeps a fixed-size state per sequence in the KV cache's recurrent
//! arena (`kv_cache::recurrent`) and walks a sequence's rows in order, one step per token, in
//! prefill as in decoding: a row's bits never depend on how its prompt was split into passes
//! or on what shares its batch.

mod delta_net;
mod mamba2;
mod short_conv;

pub use delta_net::DeltaNetWeights;
pub use mamba2::Mamba2Weights;
pub use short_conv::ShortConvWeights;

use std::sync::Mutex;

use rill_kernels::{ops, ThreadPool};

use crate::kv_cache::{KvCache, SeqId, SeqLayerState};
use crate::profile::Laps;
use crate::{Batch, ModelError};

/// A recurrent layer `il` over `h` (`t_rows × d_model`, the batch's rows grouped by sequence
/// in `scratch.seqs`), writing `o`: its projections timed as the q/k/v stage, its convolution
/// and scan as attention, its output projection as the attention output's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn recurrent_layer(
    pass: &crate::forward::Pass,
    mixer: &crate::weights::Mixer,
    il: usize,
    kv: &mut KvCache,
    (h, o): (&[f32], &mut [f32]),
    scratch: &mut RecurrentScratch,
    quant_scratch: &mut Vec<u8>,
    laps: &mut Laps,
) -> Result<(), ModelError> {
    use crate::weights::Mixer;
    let io = (h, o);
    match mixer {
        Mixer::DeltaNet(w) => {
            delta_net::delta_net_layer(pass, w, il, kv, io, scratch, quant_scratch, laps)
        }
        Mixer::ShortConv(w) => {
            short_conv::short_conv_layer(pass, w, il, kv, io, scratch, quant_scratch, laps)
        }
        Mixer::Mamba2(w) => mamba2::mamba2_layer(pass, w, il, kv, io, scratch, quant_scratch, laps),
        Mixer::Attention(_) => Err(ModelError::BadBatch {
            row: 0,
            reason: format!("layer {il} is an attention layer, not a recurrent one"),
        }),
    }
}

/// Buffers the recurrent layers reuse across passes.
#[derive(Default)]
pub(crate) struct RecurrentScratch {
    /// Projections' outputs.
    pub mixed: Vec<f32>,
    pub z: Vec<f32>,
    pub beta: Vec<f32>,
    pub alpha: Vec<f32>,
    /// Per-head outputs, head-major.
    pub heads: Vec<f32>,
    pub out: Vec<f32>,
    /// The batch's sequences: `(seq, rows in order, snapshot row)`.
    pub seqs: Vec<SeqRows>,
    pub lookup: StateLookup,
}

/// What fetching a layer's states uses: each sequence with whether the pass snapshots it, and
/// its slots.
#[derive(Default)]
pub(crate) struct StateLookup {
    flags: Vec<(SeqId, bool, bool)>,
    slots: Vec<(u32, u32, u32)>,
}

/// One sequence's rows of the batch, and the row after which the pass takes its snapshot.
#[derive(Default, Clone)]
pub(crate) struct SeqRows {
    pub seq: SeqId,
    pub rows: Vec<usize>,
    /// Index into `rows` of the last row at a block boundary (its position + 1 a multiple of
    /// the block size), when the pass crosses one.
    pub snapshot_after: Option<usize>,
    /// Index into `rows` after which the pass keeps the checkpoint (the first row of a pass of
    /// several rows continuing a sequence, where the cache keeps checkpoints).
    pub checkpoint_after: Option<usize>,
}

/// Groups the batch's rows by sequence, in order of first appearance, and marks where each
/// sequence crosses its last block boundary in this pass.
pub(crate) fn group_rows(batch: &Batch, block_size: usize, out: &mut Vec<SeqRows>) {
    out.clear();
    for (t, row) in batch.rows.iter().enumerate() {
        let at = match out.iter().position(|s| s.seq == row.seq) {
            Some(i) => i,
            None => {
                out.push(SeqRows {
                    seq: row.seq,
                    rows: Vec::new(),
                    snapshot_after: None,
                    checkpoint_after: None,
                });
                out.len() - 1
            }
        };
        let s = &mut out[at];
        if (row.pos + 1).is_multiple_of(block_size) {
            s.snapshot_after = Some(s.rows.len());
        }
        s.rows.push(t);
    }
}

/// Layer `il`'s state of each of the batch's sequences, with the snapshot's place for those
/// that cross a block boundary in this pass.
pub(crate) fn layer_states<'k>(
    kv: &'k mut KvCache,
    il: usize,
    seqs: &[SeqRows],
    lookup: &mut StateLookup,
) -> Result<Vec<SeqLayerState<'k>>, ModelError> {
    let StateLookup { flags, slots } = lookup;
    flags.clear();
    flags.extend(seqs.iter().map(|s| {
        (
            s.seq,
            s.snapshot_after.is_some(),
            s.checkpoint_after.is_some(),
        )
    }));
    Ok(kv.recurrent_layer(il, flags, slots)?)
}

/// A causal convolution over each sequence's rows in order (its window is the state): row `t`'s
/// channels are `buf[t * stride + offset..][..width]`, convolved in place, then `after(t, row)`;
/// the window goes to the snapshot at the row where the pass takes it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn convolve_rows(
    seqs: &[SeqRows],
    states: &mut [SeqLayerState],
    buf: &mut [f32],
    (stride, offset, width): (usize, usize, usize),
    weights: &[f32],
    kernel: usize,
    mut after: impl FnMut(usize, &mut [f32]),
) {
    for (s, st) in seqs.iter().zip(states.iter_mut()) {
        for (i, &t) in s.rows.iter().enumerate() {
            let x = &mut buf[t * stride + offset..t * stride + offset + width];
            ops::causal_conv_step(st.conv, weights, kernel, x);
            after(t, x);
            if s.snapshot_after == Some(i) {
                if let Some((conv, _)) = st.snapshot.as_mut() {
                    conv.copy_from_slice(st.conv);
                }
            }
            if s.checkpoint_after == Some(i) {
                if let Some((conv, _)) = st.checkpoint.as_mut() {
                    conv.copy_from_slice(st.conv);
                }
            }
        }
    }
}

/// One head's state of one sequence (`seq`: its index in the pass's groups), and its
/// snapshot's place when the pass takes one.
struct HeadState<'a> {
    seq: usize,
    state: &'a mut [f32],
    snapshot: Option<&'a mut [f32]>,
    checkpoint: Option<&'a mut [f32]>,
}

/// The scan of a state-space layer: one task per head, each walking every sequence's rows in
/// order, `step(head, t, next, state, out_row, carry)` updating the head's state (`head_len`
/// floats) with row `t` (`next`: the sequence's next row in this pass) and writing its output
/// row (`width` floats) into `out`, head-major (`heads × t_rows × width`); `carry` (from
/// `carry()`, one per head and sequence) is the step's to keep between rows. The state goes to
/// the snapshot at the row where the pass takes it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scan_heads<C>(
    pool: &ThreadPool,
    seqs: &[SeqRows],
    states: &mut [SeqLayerState],
    (n_heads, head_len): (usize, usize),
    out: &mut [f32],
    (t_rows, width): (usize, usize),
    carry: impl Fn() -> C + Sync,
    step: impl Fn(usize, usize, Option<usize>, &mut [f32], &mut [f32], &mut C) + Sync,
) {
    let per_head: Vec<Mutex<Vec<HeadState>>> =
        (0..n_heads).map(|_| Mutex::new(Vec::new())).collect();
    for (si, st) in states.iter_mut().enumerate() {
        let snap = st
            .snapshot
            .as_mut()
            .map(|(_, ssm)| ssm.chunks_exact_mut(head_len));
        let mut snap = snap.into_iter().flatten();
        let check = st
            .checkpoint
            .as_mut()
            .map(|(_, ssm)| ssm.chunks_exact_mut(head_len));
        let mut check = check.into_iter().flatten();
        for (h, state) in st.ssm.chunks_exact_mut(head_len).enumerate() {
            let entry = HeadState {
                seq: si,
                state,
                snapshot: snap.next(),
                checkpoint: check.next(),
            };
            per_head[h].lock().expect("no task panicked").push(entry);
        }
    }
    pool.run_chunks_mut(out, t_rows * width, |h, out| {
        let mut owned = per_head[h].lock().expect("no task panicked");
        for hs in owned.iter_mut() {
            let s = &seqs[hs.seq];
            let mut c = carry();
            for (i, &t) in s.rows.iter().enumerate() {
                let next = s.rows.get(i + 1).copied();
                let row = &mut out[t * width..(t + 1) * width];
                step(h, t, next, hs.state, row, &mut c);
                if s.snapshot_after == Some(i) {
                    if let Some(snap) = hs.snapshot.as_mut() {
                        snap.copy_from_slice(hs.state);
                    }
                }
                if s.checkpoint_after == Some(i) {
                    if let Some(check) = hs.checkpoint.as_mut() {
                        check.copy_from_slice(hs.state);
                    }
                }
            }
        }
    });
}
