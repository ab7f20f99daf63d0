//! Gemma 4's per-layer inputs: besides its embedding, each token brings every layer a small
//! vector of its own (a row of a second embedding table plus a projection of the first
//! embedding), which the layer gates with its residual stream and adds back after its
//! feed-forward. The math is written out in `docs/models/gemma4-notes.md` (section 2 and 3e).

use rill_gguf::GgufFile;
use rill_kernels::ops::{self, GateActivation};

use crate::forward::{fit, for_rows, Pass};
use crate::linear::linear;
use crate::weights::{matrix, vector, Weight};
use crate::{ModelConfig, ModelError};

/// The model-wide part: the per-layer embedding table and the embedding's projection.
#[derive(Debug, Clone)]
pub struct PerLayerInputs {
    /// `per_layer_token_embd`: per token, `n_layers × width` values (layer after layer).
    pub token_embd: Weight,
    /// `per_layer_model_proj`: the (scaled) embedding to `n_layers × width` values.
    pub model_proj: Weight,
    /// `per_layer_proj_norm`: the RMSNorm weight of each layer's slice of the projection.
    pub proj_norm: Vec<f32>,
    pub width: usize,
}

/// One layer's part: the gate from its residual stream and the projection back.
#[derive(Debug, Clone)]
pub struct LayerInputWeights {
    /// `inp_gate`: `d_model` to `width`.
    pub gate: Weight,
    /// `proj`: `width` to `d_model`.
    pub proj: Weight,
    /// `post_norm`: RMSNorm of the projection before the residual add.
    pub post_norm: Vec<f32>,
}

impl PerLayerInputs {
    pub(crate) fn load(
        file: &GgufFile,
        config: &ModelConfig,
        width: usize,
    ) -> Result<PerLayerInputs, ModelError> {
        let all = config.n_layers * width;
        Ok(PerLayerInputs {
            token_embd: matrix(file, "per_layer_token_embd.weight", all, config.vocab_size)?,
            model_proj: matrix(file, "per_layer_model_proj.weight", config.d_model, all)?,
            proj_norm: vector(file, "per_layer_proj_norm.weight", width)?,
            width,
        })
    }

    /// Every row's inputs for every layer (`out`: `rows × n_layers × width`) from the scaled
    /// embeddings `x0`: `(rms(x0 · P / √d) + table[token] · √width) / √2`, the norm over each
    /// layer's slice. `table_rows` holds the rows' table entries meanwhile.
    pub(crate) fn compute(
        &self,
        pass: &Pass,
        x0: &[f32],
        (out, table_rows): (&mut Vec<f32>, &mut Vec<f32>),
        scratch: &mut Vec<u8>,
    ) -> Result<(), ModelError> {
        let Pass {
            pool,
            precision,
            file,
            cfg,
            batch,
            ..
        } = *pass;
        let (t_rows, all, n) = (batch.len(), self.model_proj.rows, self.width);
        let out = fit(out, t_rows * all);
        linear(
            pool,
            precision,
            file,
            &self.model_proj,
            x0,
            t_rows,
            out,
            scratch,
        )?;
        let table = self.token_embd.data(file);
        let row_bytes = self.token_embd.row_bytes();
        let table_rows = fit(table_rows, t_rows * all);
        for (row, dst) in batch.rows.iter().zip(table_rows.chunks_exact_mut(all)) {
            let tok = row.token as usize;
            let bytes = &table[tok * row_bytes..(tok + 1) * row_bytes];
            rill_kernels::dequantize_row(self.token_embd.ty, bytes, dst)?;
        }
        let proj_scale = 1.0 / (cfg.d_model as f32).sqrt();
        let token_scale = (n as f32).sqrt();
        let eps = cfg.rms_eps;
        for_rows(
            pool,
            t_rows,
            [out, table_rows],
            [all, all],
            |_, [row, own]| {
                for layer in row.chunks_exact_mut(n) {
                    layer.iter_mut().for_each(|v| *v *= proj_scale);
                    ops::rms_norm_inplace(layer, &self.proj_norm, eps);
                }
                for (v, &e) in row.iter_mut().zip(own.iter()) {
                    *v = (*v + e * token_scale) * std::f32::consts::FRAC_1_SQRT_2;
                }
            },
        );
        Ok(())
    }
}

/// The buffers a layer's per-layer input uses.
pub(crate) struct LayerInputBuffers<'a> {
    /// Every row's inputs for every layer ([`PerLayerInputs::compute`]).
    pub inputs: &'a [f32],
    pub gate: &'a mut Vec<f32>,
    pub own: &'a mut Vec<f32>,
    /// `rows × d_model`: the projection back.
    pub o: &'a mut [f32],
    pub scratch: &'a mut Vec<u8>,
}

impl LayerInputWeights {
    pub(crate) fn load(
        file: &GgufFile,
        il: usize,
        d: usize,
        width: usize,
    ) -> Result<LayerInputWeights, ModelError> {
        let name = |s: &str| format!("blk.{il}.{s}.weight");
        Ok(LayerInputWeights {
            gate: matrix(file, &name("inp_gate"), d, width)?,
            proj: matrix(file, &name("proj"), width, d)?,
            post_norm: vector(file, &name("post_norm"), d)?,
        })
    }

    /// Layer `il`'s use of its inputs: `x += rms(proj(gelu(gate(x)) · inputs[il]))`.
    pub(crate) fn apply(
        &self,
        pass: &Pass,
        il: usize,
        x: &mut [f32],
        bufs: LayerInputBuffers,
    ) -> Result<(), ModelError> {
        let Pass {
            pool,
            precision,
            file,
            cfg,
            batch,
            ..
        } = *pass;
        let (t_rows, n, d) = (batch.len(), self.gate.rows, cfg.d_model);
        let all = cfg.n_layers * n;
        let gate = fit(bufs.gate, t_rows * n);
        linear(
            pool,
            precision,
            file,
            &self.gate,
            x,
            t_rows,
            gate,
            bufs.scratch,
        )?;
        let own = fit(bufs.own, t_rows * n);
        for (t, row) in own.chunks_exact_mut(n).enumerate() {
            row.copy_from_slice(&bufs.inputs[t * all + il * n..t * all + (il + 1) * n]);
        }
        match precision {
            crate::Precision::Exact => ops::gated_activation(gate, own, GateActivation::GeluTanh),
            crate::Precision::Fast => {
                ops::gated_activation_fast(gate, own, GateActivation::GeluTanh)
            }
        }
        linear(
            pool,
            precision,
            file,
            &self.proj,
            gate,
            t_rows,
            bufs.o,
            bufs.scratch,
        )?;
        let eps = cfg.rms_eps;
        for_rows(pool, t_rows, [x, bufs.o], [d, d], |_, [xr, or]| {
            ops::rms_norm_inplace(or, &self.post_norm, eps);
            xr.iter_mut().zip(or.iter()).for_each(|(xv, &ov)| *xv += ov);
        });
        Ok(())
    }
}
