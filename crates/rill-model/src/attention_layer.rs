//! An attention layer of the forward pass: projections, norms and rotation, the KV cache write,
//! attention over the cache, the output gate and projection.

use rill_kernels::ops;

use crate::attention::{attention_by_row, attention_tiled, LayerAttention, TilePlan};
use crate::forward::{attention_softmax, fit, for_rows, Pass};
use crate::kv_cache::KvCache;
use crate::linear::{linear, linear_group};
use crate::profile::{Laps, Stage};
use crate::weights::AttentionWeights;
use crate::{Capture, ModelError, Precision, QkNorm};

/// The workspace buffers an attention layer uses (`h`: the normed input, `o`: the output).
pub(crate) struct AttentionBuffers<'a> {
    pub h: &'a [f32],
    pub q: &'a mut Vec<f32>,
    pub k: &'a mut Vec<f32>,
    pub v: &'a mut Vec<f32>,
    pub gate: &'a mut Vec<f32>,
    pub attn: &'a mut Vec<f32>,
    pub o: &'a mut [f32],
    pub scores: &'a mut Vec<f32>,
    pub tiles: &'a mut TilePlan,
    pub quant_scratch: &'a mut Vec<u8>,
    /// Rotary cos/sin per row: global layers', then sliding-window layers'.
    pub rope: [&'a [f32]; 4],
}

/// Attention of layer `il` over `h`, writing `o` (`t_rows × d_model`, before the output bias).
pub(crate) fn attention_layer(
    pass: &Pass,
    lw: &AttentionWeights,
    il: usize,
    kv: &mut KvCache,
    bufs: AttentionBuffers,
    mut capture: Option<&mut Capture>,
    laps: &mut Laps,
) -> Result<(), ModelError> {
    let Pass {
        pool,
        precision,
        file,
        cfg,
        batch,
        ..
    } = *pass;
    let t_rows = batch.len();
    // This layer's heads (Gemma 4's sliding layers have smaller ones than its global layers).
    let shape = cfg.layer_attention[il];
    let hd = shape.head_dim;
    let (q_dim, kv_dim) = (cfg.n_heads * hd, shape.kv_dim());
    let half = shape.rope_dim / 2;
    let sliding = cfg.layer_is_sliding[il];
    let rotates = cfg.layer_uses_rope[il];
    let whole_qk_norm = cfg.qk_norm == QkNorm::Whole;
    // A layer sharing an earlier layer's keys and values computes only queries.
    let computed_kv = if lw.wk.is_some() { kv_dim } else { 0 };
    let q = fit(bufs.q, t_rows * q_dim);
    let k = fit(bufs.k, t_rows * computed_kv);
    let v = fit(bufs.v, t_rows * computed_kv);
    {
        let q_out: &mut [f32] = if lw.output_gate {
            // Each head's queries then its gate, head after head: split apart below.
            fit(bufs.gate, 2 * t_rows * q_dim)
        } else {
            &mut *q
        };
        let (h, scratch) = (bufs.h, &mut *bufs.quant_scratch);
        match (&lw.wk, &lw.wv) {
            (Some(wk), Some(wv)) => linear_group(
                pool,
                precision,
                file,
                &mut [(&lw.wq, q_out), (wk, &mut *k), (wv, &mut *v)],
                h,
                t_rows,
                scratch,
            )?,
            (Some(wk), None) => {
                let products = &mut [(&lw.wq, q_out), (wk, &mut *k)];
                linear_group(pool, precision, file, products, h, t_rows, scratch)?;
                // The values are the raw keys (Gemma 4 31B's global layers).
                v.copy_from_slice(k);
            }
            (None, _) => linear(pool, precision, file, &lw.wq, h, t_rows, q_out, scratch)?,
        }
    }
    if lw.output_gate {
        let both = &mut bufs.gate[..2 * t_rows * q_dim];
        for t in 0..t_rows {
            for head in 0..cfg.n_heads {
                let src = (t * cfg.n_heads + head) * 2 * hd;
                let dst = t * q_dim + head * hd;
                q[dst..dst + hd].copy_from_slice(&both[src..src + hd]);
            }
        }
        // The gates, compacted into the front of the same buffer (each moves to an earlier or
        // the same place, so in order nothing is overwritten before it is read).
        for t in 0..t_rows {
            for head in 0..cfg.n_heads {
                let src = (t * cfg.n_heads + head) * 2 * hd + hd;
                let dst = t * q_dim + head * hd;
                both.copy_within(src..src + hd, dst);
            }
        }
    }
    laps.lap(Stage::Qkv);

    let [cos_g, sin_g, cos_l, sin_l] = bufs.rope;
    let (cos, sin) = if sliding {
        (cos_l, sin_l)
    } else {
        (cos_g, sin_g)
    };
    let widths = [q_dim, computed_kv, computed_kv];
    for_rows(
        pool,
        t_rows,
        [&mut *q, &mut *k, &mut *v],
        widths,
        |t, [qt, kt, vt]| {
            let (c, s) = (
                &cos[t * half..(t + 1) * half],
                &sin[t * half..(t + 1) * half],
            );
            for (row, bias) in [
                (&mut *qt, &lw.q_bias),
                (&mut *kt, &lw.k_bias),
                (&mut *vt, &lw.v_bias),
            ] {
                if let Some(bias) = bias {
                    for (x, &b) in row.iter_mut().zip(bias) {
                        *x += b;
                    }
                }
            }
            for (heads, norm) in [(qt, &lw.q_norm), (kt, &lw.k_norm)] {
                if let (true, Some(norm)) = (whole_qk_norm, norm) {
                    ops::rms_norm_inplace(heads, norm, cfg.rms_eps);
                }
                for head in heads.chunks_exact_mut(hd) {
                    if let (false, Some(norm)) = (whole_qk_norm, norm) {
                        ops::rms_norm_inplace(head, norm, cfg.rms_eps);
                    }
                    if rotates {
                        ops::rope_apply(head, c, s, cfg.rope_style);
                    }
                }
            }
            if cfg.v_norm {
                for head in vt.chunks_exact_mut(hd) {
                    ops::rms_norm_unweighted_inplace(head, cfg.rms_eps);
                }
            }
        },
    );
    if computed_kv > 0 {
        for (t, row) in batch.rows.iter().enumerate() {
            kv.write(
                il,
                row.seq,
                row.pos,
                &k[t * kv_dim..(t + 1) * kv_dim],
                &v[t * kv_dim..(t + 1) * kv_dim],
            )?;
        }
    }
    laps.lap(Stage::RopeKv);

    let attn = fit(bufs.attn, t_rows * q_dim);
    let window = match (sliding, cfg.sliding_window) {
        (true, Some(window)) => Some(window),
        _ => None,
    };
    let layer = LayerAttention {
        kv,
        layer: il,
        shape,
        window,
        cfg,
        sinks: lw.attn_sinks.as_deref(),
        seq_ends: cfg.bidirectional.then_some(pass.seq_ends),
    };
    match precision {
        Precision::Exact => {
            let softmax = attention_softmax(precision);
            let max_len = kv.capacity_tokens();
            attention_by_row(pool, batch, &layer, q, attn, bufs.scores, max_len, softmax)?
        }
        Precision::Fast => attention_tiled(pool, batch, &layer, q, attn, bufs.scores, bufs.tiles)?,
    }
    if let Some(c) = capture.as_mut() {
        c.record_attention(batch, &layer, q, precision)?;
        c.record_head_outputs(attn, q_dim, batch.rows.iter().map(|r| r.logits));
    }
    if lw.output_gate {
        let gate = &bufs.gate[..t_rows * q_dim];
        for (a, &g) in attn.iter_mut().zip(gate) {
            *a *= sigmoid(g);
        }
    }
    laps.lap(Stage::Attention);

    linear(
        pool,
        precision,
        file,
        &lw.wo,
        attn,
        t_rows,
        bufs.o,
        bufs.quant_scratch,
    )?;
    laps.lap(Stage::AttnOut);
    Ok(())
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
