//! The forward pass's buffers, kept between passes, and the rotary tables of a batch.

use rill_kernels::ops;

use crate::forward::Batch;
use crate::kv_cache::SeqId;
use crate::ModelConfig;

/// Buffers reused across forward passes: sized for the largest batch seen, so steady-state
/// decoding allocates nothing.
#[derive(Default)]
pub(crate) struct Workspace {
    /// The cuts of a pass's rows with logits, and the two-pass head's buffers.
    pub(crate) head_cuts: Vec<crate::HeadCut>,
    pub(crate) two_pass: crate::two_pass_head::TwoPassScratch,
    pub(crate) x: Vec<f32>,
    pub(crate) h: Vec<f32>,
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) attn: Vec<f32>,
    /// Qwen3.5's attention output gates (with the queries, while they are split apart).
    pub(crate) attn_gate: Vec<f32>,
    pub(crate) o: Vec<f32>,
    pub(crate) gate: Vec<f32>,
    pub(crate) up: Vec<f32>,
    pub(crate) scores: Vec<f32>,
    pub(crate) cos_global: Vec<f32>,
    pub(crate) sin_global: Vec<f32>,
    pub(crate) cos_local: Vec<f32>,
    pub(crate) sin_local: Vec<f32>,
    pub(crate) logit_rows: Vec<f32>,
    pub(crate) quant_scratch: Vec<u8>,
    pub(crate) moe: crate::moe::MoeScratch,
    /// Gemma 4's per-layer inputs of the batch's rows, the table rows meanwhile, and a layer's
    /// gate and own inputs.
    pub(crate) per_layer: [Vec<f32>; 4],
    pub(crate) recurrent: crate::recurrent::RecurrentScratch,
    /// Each sequence of the batch with its length after the batch.
    pub(crate) seq_lens: Vec<(SeqId, usize)>,
    /// How the fast path's attention cuts its work.
    pub(crate) tiles: crate::attention::TilePlan,
    /// The rows with logits, for the layers past the last that stores keys and values.
    pub(crate) tail_batch: Batch,
    /// The MTP block's input pairs (embedding and hidden state, each normed).
    pub(crate) mtp_pairs: Vec<f32>,
}

impl Workspace {
    /// Rotary cos/sin per row of `batch`, for global and sliding-window layers (`capacity`: the
    /// cache's positions, which pick LongRoPE's factors).
    pub(crate) fn rope_tables(
        &mut self,
        cfg: &ModelConfig,
        w: &crate::Weights,
        batch: &Batch,
        capacity: usize,
    ) {
        let t_rows = batch.len();
        for (cos, sin, base, scaling, divisors, rope_dim) in [
            (
                &mut self.cos_global,
                &mut self.sin_global,
                cfg.rope_base,
                cfg.rope_scaling,
                &w.rope_divisors_global,
                cfg.rope_dim,
            ),
            (
                &mut self.cos_local,
                &mut self.sin_local,
                cfg.rope_base_local,
                cfg.rope_scaling_local,
                &w.rope_divisors_local,
                cfg.rope_dim_local,
            ),
        ] {
            let half = rope_dim / 2;
            fit(cos, t_rows * half);
            fit(sin, t_rows * half);
            let magnitude = scaling.magnitude();
            // LongRoPE's long factors once the cache can hold more than the original context (the
            // whole cache's size decides, as llama.cpp's context size does: every row alike).
            let divisors = match scaling {
                crate::RopeScaling::LongRope {
                    original_context, ..
                } if capacity > original_context => &w.rope_divisors_long,
                _ => divisors,
            };
            for (t, row) in batch.rows.iter().enumerate() {
                let (c, s) = (
                    &mut cos[t * half..(t + 1) * half],
                    &mut sin[t * half..(t + 1) * half],
                );
                let pos = scaling.position(row.pos);
                ops::rope_angles(pos, base, rope_dim, divisors.as_deref(), c, s);
                if magnitude != 1.0 {
                    c.iter_mut()
                        .chain(s.iter_mut())
                        .for_each(|v| *v *= magnitude);
                }
            }
        }
    }
}

pub(crate) fn fit(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}
