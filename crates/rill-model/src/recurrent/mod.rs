//! Recurrent token mixers: Gated DeltaNet (Qwen3.5's linear attention) and the gated short
//! convolution (LFM2). Each keeps a fixed-size state per sequence in the KV cache's recurrent
//! arena (`kv_cache::recurrent`) and walks a sequence's rows in order, one step per token, in
//! prefill as in decoding: a row's bits never depend on how its prompt was split into passes
//! or on what shares its batch.

mod delta_net;
mod short_conv;

pub(crate) use delta_net::delta_net_layer;
pub use delta_net::DeltaNetWeights;
pub(crate) use short_conv::short_conv_layer;
pub use short_conv::ShortConvWeights;

use crate::kv_cache::SeqId;
use crate::Batch;

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
    pub flags: Vec<(SeqId, bool)>,
    pub slots: Vec<(u32, u32)>,
}

/// One sequence's rows of the batch, and the row after which the pass takes its snapshot.
#[derive(Default, Clone)]
pub(crate) struct SeqRows {
    pub seq: SeqId,
    pub rows: Vec<usize>,
    /// Index into `rows` of the last row at a block boundary (its position + 1 a multiple of
    /// the block size), when the pass crosses one.
    pub snapshot_after: Option<usize>,
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
