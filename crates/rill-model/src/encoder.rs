//! What BERT-style encoders add to the one forward pass (data in [`ModelConfig`]: `bidirectional`,
//! `post_layer_norms`, `learned_positions`, `ungated_ffn`, no `output_head`): learned absolute
//! positions and the token type's embedding added to each token's, a LayerNorm (weight and
//! bias) of that sum, and LayerNorms of the residual stream after each residual add.

use rill_gguf::GgufFile;
use rill_kernels::ops;

use crate::forward::{for_rows, Batch};
use crate::weights::{matrix, vector, Weight};
use crate::{ModelConfig, ModelError};

/// A LayerNorm's gain and bias (`<name>.weight`, `<name>.bias`).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

impl LayerNorm {
    pub(crate) fn load(file: &GgufFile, name: &str, d: usize) -> Result<LayerNorm, ModelError> {
        Ok(LayerNorm {
            weight: vector(file, &format!("{name}.weight"), d)?,
            bias: vector(file, &format!("{name}.bias"), d)?,
        })
    }

    /// Elements of its vectors.
    pub fn len(&self) -> usize {
        self.weight.len() + self.bias.len()
    }

    pub fn is_empty(&self) -> bool {
        self.weight.is_empty()
    }
}

/// What an encoder adds to the token embeddings before the first layer.
#[derive(Debug, Clone)]
pub struct EncoderEmbeddings {
    /// Learned absolute positions (`position_embd`): row `p` is added at position `p`.
    pub positions: Option<Weight>,
    /// Token type 0's embedding (`token_types` row 0), added at every position: a text is
    /// embedded as BERT's "sentence A", as llama.cpp does.
    pub token_type: Option<Vec<f32>>,
    /// The LayerNorm of the sum (`token_embd_norm`).
    pub norm: LayerNorm,
}

impl EncoderEmbeddings {
    /// The file's, for a configuration with normed embeddings; `None` otherwise.
    pub(crate) fn load(
        file: &GgufFile,
        config: &ModelConfig,
    ) -> Result<Option<EncoderEmbeddings>, ModelError> {
        if !config.post_layer_norms {
            return Ok(None);
        }
        let d = config.d_model;
        let rows = |name: &str| {
            let dims = file.tensor(name).map(|t| t.dims.clone());
            dims.and_then(|dims| dims.get(1).map(|&n| n as usize))
                .ok_or_else(|| ModelError::MissingTensor(name.into()))
        };
        let positions = match config.learned_positions {
            true => {
                let name = "position_embd.weight";
                Some(matrix(file, name, d, rows(name)?)?)
            }
            false => None,
        };
        let token_type = match file.tensor("token_types.weight") {
            Some(_) => {
                let name = "token_types.weight";
                let table = matrix(file, name, d, rows(name)?)?;
                let mut row = vec![0.0; d];
                let data = table.data(file);
                rill_kernels::dequantize_row(table.ty, &data[..table.row_bytes()], &mut row)?;
                Some(row)
            }
            None => None,
        };
        Ok(Some(EncoderEmbeddings {
            positions,
            token_type,
            norm: LayerNorm::load(file, "token_embd_norm", d)?,
        }))
    }

    /// Positions the learned table holds (every position, without one).
    pub fn max_positions(&self) -> usize {
        self.positions.as_ref().map_or(usize::MAX, |p| p.rows)
    }

    /// Adds each row's position and the token type to `x` (the token embeddings, one row per
    /// batch row) and normalises every row.
    pub(crate) fn apply(
        &self,
        pool: &rill_kernels::ThreadPool,
        file: &GgufFile,
        cfg: &ModelConfig,
        batch: &Batch,
        x: &mut [f32],
    ) -> Result<(), ModelError> {
        let d = cfg.d_model;
        let mut position = vec![0.0; d];
        for (t, row) in batch.rows.iter().enumerate() {
            let xr = &mut x[t * d..(t + 1) * d];
            if let Some(p) = &self.positions {
                let bytes = p.row_bytes();
                let data = &p.data(file)[row.pos * bytes..(row.pos + 1) * bytes];
                rill_kernels::dequantize_row(p.ty, data, &mut position)?;
                xr.iter_mut().zip(&position).for_each(|(v, &p)| *v += p);
            }
            if let Some(tt) = &self.token_type {
                xr.iter_mut().zip(tt).for_each(|(v, &p)| *v += p);
            }
        }
        layer_norm_rows(pool, x, &self.norm, cfg);
        Ok(())
    }
}

/// A layer's LayerNorms of the residual stream: after attention's residual add
/// (`attn_output_norm`), after the feed-forward's (`layer_output_norm`).
pub(crate) fn residual_norms(
    file: &GgufFile,
    config: &ModelConfig,
    il: usize,
) -> Result<Option<Box<[LayerNorm; 2]>>, ModelError> {
    if !config.post_layer_norms {
        return Ok(None);
    }
    let d = config.d_model;
    Ok(Some(Box::new([
        LayerNorm::load(file, &format!("blk.{il}.attn_output_norm"), d)?,
        LayerNorm::load(file, &format!("blk.{il}.layer_output_norm"), d)?,
    ])))
}

/// Every row of `x` through `norm`, in place.
pub(crate) fn layer_norm_rows(
    pool: &rill_kernels::ThreadPool,
    x: &mut [f32],
    norm: &LayerNorm,
    cfg: &ModelConfig,
) {
    let d = cfg.d_model;
    for_rows(pool, x.len() / d, [x], [d], |_, [row]| {
        ops::layer_norm_inplace(row, &norm.weight, &norm.bias, cfg.rms_eps);
    });
}

/// `gelu(x + bias)` for every row of `x` (rows as wide as `bias`; no bias: every element), in
/// place: GELU by the error function exact to f64 on the reference path, vectorised (within
/// 5e-7) on the fast one.
pub(crate) fn biased_gelu_rows(
    pool: &rill_kernels::ThreadPool,
    x: &mut [f32],
    bias: Option<&[f32]>,
    precision: crate::Precision,
) {
    let gelu = match precision {
        crate::Precision::Exact => ops::gelu_erf_inplace,
        crate::Precision::Fast => ops::gelu_erf_fast,
    };
    let width = bias.map_or(x.len(), <[f32]>::len).max(1);
    for_rows(pool, x.len() / width, [x], [width], |_, [row]| {
        if let Some(bias) = bias {
            row.iter_mut().zip(bias).for_each(|(v, &b)| *v += b);
        }
        gelu(row);
    });
}
