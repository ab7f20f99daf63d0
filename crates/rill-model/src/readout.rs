//! What each attention head of a block wrote into the residual stream at a position, and how much
//! each cached value could write: the glass box's per-head attribution and its value-weighted
//! attention (weight × ‖value through the output projection‖, after Kobayashi et al. 2020, "Attention
//! is not only a weight"), since raw weights are dominated by the first token, whose value is small.

use rill_kernels::ops::KvView;

use crate::{KvCache, Model, ModelError, SeqId};

/// One block's attention at one position, head by head, as it reaches the residual stream.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadReadout {
    /// Per query head: its share of the block's attention write (`d_model` values), the head's
    /// output through its columns of the output projection, then through what the block applies
    /// after it at this position (the post-attention norm's scale and weight, the residual
    /// scale). With [`HeadReadout::bias_write`] they add up to the block's attention write.
    pub head_writes: Vec<Vec<f32>>,
    /// The output projection's bias, scaled the same way (zeros without a bias).
    pub bias_write: Vec<f32>,
    /// When asked: per query head, per position `0..len`, the norm of what that position's value
    /// would write through the head's columns, scaled the same way: multiplied by the head's
    /// attention weight there, how much the position actually moved the residual stream.
    pub value_norms: Option<Vec<Vec<f32>>>,
}

impl Model {
    /// Block `layer`'s attention at the position whose attention output (before the output
    /// projection, `q_dim` values: each query head's weighted sum of values) is `head_output`,
    /// split by head, on the output projection's dequantized weights (each head's dot products
    /// in f32, everything after in f64: a reading of the pass, not a second forward pass). With `value_norms`, also every cached position's value
    /// norm per head, read from `seq`'s first `len` positions of `kv` (the Gram matrix of each
    /// head's scaled columns, so each position costs `head_dim²` per head).
    pub fn head_readout(
        &self,
        kv: &KvCache,
        seq: SeqId,
        layer: usize,
        len: usize,
        head_output: &[f32],
        value_norms: bool,
    ) -> Result<HeadReadout, ModelError> {
        let cfg = &self.config;
        let hd = (cfg.layer_attention.get(layer)).map_or(cfg.head_dim, |s| s.head_dim);
        let (d, q_dim) = (cfg.d_model, cfg.n_heads * hd);
        let block = self
            .weights
            .layers
            .get(layer)
            .ok_or_else(|| ModelError::BadBatch {
                row: 0,
                reason: format!("layer {layer} is past the model's {}", cfg.n_layers),
            })?;
        let lw = block
            .mixer
            .attention()
            .ok_or_else(|| ModelError::BadBatch {
                row: 0,
                reason: format!("layer {layer} is a recurrent layer: it has no attention heads"),
            })?;
        if head_output.len() != q_dim {
            return Err(ModelError::BadBatch {
                row: 0,
                reason: format!(
                    "an attention output has {q_dim} values, not {}",
                    head_output.len()
                ),
            });
        }
        // Row by row through one buffer; the whole matrix only when the Gram matrices of value
        // weighting are still to be made from it.
        let wo = &lw.wo;
        let data = wo.data(&self.file);
        let row_bytes = wo.row_bytes();
        let keep_whole = value_norms && self.value_grams[layer].get().is_none();
        let mut whole = if keep_whole {
            vec![0.0f32; d * q_dim]
        } else {
            Vec::new()
        };
        let mut row = vec![0.0f32; q_dim];
        // Each head's write before the block's scaling, and the whole output it scales by.
        let mut raw = vec![vec![0.0f64; d]; cfg.n_heads];
        let mut total = vec![0.0f64; d];
        for i in 0..d {
            let src = data
                .get(i * row_bytes..(i + 1) * row_bytes)
                .ok_or_else(|| ModelError::BadBatch {
                    row: 0,
                    reason: format!("{} is shorter than its shape", wo.name),
                })?;
            rill_kernels::dequantize_row(wo.ty, src, &mut row)?;
            for (h, raw_h) in raw.iter_mut().enumerate() {
                let cols = &row[h * hd..(h + 1) * hd];
                let a = &head_output[h * hd..(h + 1) * hd];
                raw_h[i] = f64::from(rill_kernels::dot_f32(cols, a));
                total[i] += raw_h[i];
            }
            if let Some(bias) = &lw.o_bias {
                total[i] += f64::from(bias[i]);
            }
            if keep_whole {
                whole[i * q_dim..(i + 1) * q_dim].copy_from_slice(&row);
            }
        }
        // What the block applies after the projection: the post-norm's weight per dimension,
        // and one factor for the row (the post-norm's 1/rms here, the residual scale).
        let residual_scale = f64::from(cfg.residual_scale.unwrap_or(1.0));
        let row_factor = match &block.post_attn_norm {
            Some(_) => {
                let mean_sq = total.iter().map(|v| v * v).sum::<f64>() / d as f64;
                residual_scale / (mean_sq + f64::from(cfg.rms_eps)).sqrt()
            }
            None => residual_scale,
        };
        let scale: Vec<f64> = match &block.post_attn_norm {
            Some(g) => g.iter().map(|&g| f64::from(g) * row_factor).collect(),
            None => vec![row_factor; d],
        };
        let head_writes = raw
            .iter()
            .map(|r| r.iter().zip(&scale).map(|(v, s)| (v * s) as f32).collect())
            .collect();
        let bias_write = match &lw.o_bias {
            Some(b) => b
                .iter()
                .zip(&scale)
                .map(|(&b, s)| (f64::from(b) * s) as f32)
                .collect(),
            None => vec![0.0; d],
        };

        let value_norms = if value_norms {
            Some(self.value_norms(kv, seq, layer, len, &whole, row_factor)?)
        } else {
            None
        };
        Ok(HeadReadout {
            head_writes,
            bias_write,
            value_norms,
        })
    }

    /// Per query head of block `layer`, the Gram matrix `G_h = (g ⊙ W_h)ᵀ (g ⊙ W_h)` of its
    /// columns `W_h` of the output projection `w` (`d × q_dim`) weighted by the post-norm's
    /// weight `g` (1 without one): weights only, so computed once per block and kept (`w` is
    /// read only the first time).
    fn value_grams(&self, layer: usize, w: &[f32]) -> &[Vec<f32>] {
        self.value_grams[layer].get_or_init(|| {
            let cfg = &self.config;
            let hd = cfg.layer_attention[layer].head_dim;
            let (d, q_dim) = (cfg.d_model, cfg.n_heads * hd);
            let g = self.weights.layers[layer].post_attn_norm.as_deref();
            (0..cfg.n_heads)
                .map(|h| {
                    // The head's scaled columns, each contiguous.
                    let mut cols = vec![0.0f32; hd * d];
                    for (i, row) in w.chunks_exact(q_dim).enumerate() {
                        let gi = g.map_or(1.0, |g| g[i]);
                        for a in 0..hd {
                            cols[a * d + i] = row[h * hd + a] * gi;
                        }
                    }
                    let mut gram = vec![0.0f32; hd * hd];
                    for a in 0..hd {
                        for b in a..hd {
                            let v = rill_kernels::dot_f32(
                                &cols[a * d..(a + 1) * d],
                                &cols[b * d..(b + 1) * d],
                            );
                            gram[a * hd + b] = v;
                            gram[b * hd + a] = v;
                        }
                    }
                    gram
                })
                .collect()
        })
    }

    /// Per query head, per position `0..len`: ‖scale ⊙ W_h v_j‖ for the head's columns `W_h` of
    /// the output projection `w` and the value `v_j` of its KV head, with `scale` the post-norm's
    /// weight times `row_factor`: `row_factor · sqrt(v_jᵀ G_h v_j)` ([`Model::value_grams`]).
    fn value_norms(
        &self,
        kv: &KvCache,
        seq: SeqId,
        layer: usize,
        len: usize,
        w: &[f32],
        row_factor: f64,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let cfg = &self.config;
        let shape = cfg.layer_attention[layer];
        let hd = shape.head_dim;
        let group = cfg.n_heads / shape.n_kv_heads;
        let grams = self.value_grams(layer, w);
        let mut norms = vec![vec![0.0f32; len]; cfg.n_heads];
        let mut v = vec![0.0f32; hd];
        let mut gv = vec![0.0f32; hd];
        // A window layer's query at `len - 1` reads (and its cache holds) only its window.
        let first = match (cfg.layer_is_sliding.get(layer), cfg.sliding_window) {
            (Some(true), Some(w)) => len.saturating_sub(w),
            _ => 0,
        };
        for kv_head in 0..shape.n_kv_heads {
            let view = kv.view(layer, seq, kv_head, len)?;
            // Each position's value is read once for all the query heads sharing it.
            #[allow(clippy::needless_range_loop)]
            for j in first..len {
                v.fill(0.0);
                view.value_axpy(j, 1.0, &mut v);
                for h in kv_head * group..(kv_head + 1) * group {
                    let g = &grams[h];
                    for (a, out) in gv.iter_mut().enumerate() {
                        *out = rill_kernels::dot_f32(&g[a * hd..(a + 1) * hd], &v);
                    }
                    let sq = f64::from(rill_kernels::dot_f32(&gv, &v));
                    norms[h][j] = (row_factor.abs() * sq.max(0.0).sqrt()) as f32;
                }
            }
        }
        Ok(norms)
    }
}
