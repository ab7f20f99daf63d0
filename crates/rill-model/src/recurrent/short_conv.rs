//! LFM2's gated short convolution.
//!
//! Per token: one projection gives `B`, `C` and `x` (each `d_model`); `B·x` goes through a
//! causal depthwise convolution of a few taps (no activation), is multiplied by `C`, and goes
//! through the output projection. The state is the last `kernel - 1` values of `B·x`.

use rill_gguf::GgufFile;

use super::RecurrentScratch;
use crate::forward::{fit, Pass};
use crate::kv_cache::KvCache;
use crate::linear::linear;
use crate::profile::{Laps, Stage};
use crate::weights::{matrix, shaped, Weight};
use crate::ModelError;

/// A short-convolution layer's weights.
#[derive(Debug, Clone)]
pub struct ShortConvWeights {
    /// `d_model → 3·d_model`: `B`, `C`, `x`.
    pub in_proj: Weight,
    /// The convolution's kernels, channel by channel (`d_model × kernel`).
    pub conv: Vec<f32>,
    pub kernel: usize,
    pub out_proj: Weight,
}

impl ShortConvWeights {
    pub(crate) fn load(
        file: &GgufFile,
        il: usize,
        d: usize,
        kernel: usize,
    ) -> Result<ShortConvWeights, ModelError> {
        let name = |s: &str| format!("blk.{il}.shortconv.{s}.weight");
        let (info, ty) = shaped(file, &name("conv"), &[kernel, d])?;
        let mut conv = vec![0.0; kernel * d];
        rill_kernels::dequantize_row(ty, file.tensor_data(info), &mut conv)?;
        Ok(ShortConvWeights {
            in_proj: matrix(file, &name("in_proj"), d, 3 * d)?,
            conv,
            kernel,
            out_proj: matrix(file, &name("out_proj"), d, d)?,
        })
    }

    pub(crate) fn matrices(&self) -> Vec<&Weight> {
        vec![&self.in_proj, &self.out_proj]
    }

    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Weight> {
        vec![&mut self.in_proj, &mut self.out_proj]
    }

    pub(crate) fn vector_len(&self) -> usize {
        self.conv.len()
    }
}

/// Layer `il` over `h` (`t_rows × d_model`), writing `o`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn short_conv_layer(
    pass: &Pass,
    w: &ShortConvWeights,
    il: usize,
    kv: &mut KvCache,
    (h, o): (&[f32], &mut [f32]),
    scratch: &mut RecurrentScratch,
    quant_scratch: &mut Vec<u8>,
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
    let (t_rows, d) = (batch.len(), cfg.d_model);
    let bcx = fit(&mut scratch.mixed, t_rows * 3 * d);
    linear(
        pool,
        precision,
        file,
        &w.in_proj,
        h,
        t_rows,
        bcx,
        quant_scratch,
    )?;
    laps.lap(Stage::Qkv);
    let y = fit(&mut scratch.out, t_rows * d);
    for t in 0..t_rows {
        let row = &bcx[t * 3 * d..(t + 1) * 3 * d];
        let (b, x) = (&row[..d], &row[2 * d..]);
        for ((yv, &bv), &xv) in y[t * d..(t + 1) * d].iter_mut().zip(b).zip(x) {
            *yv = bv * xv;
        }
    }
    let mut states = super::layer_states(kv, il, &scratch.seqs, &mut scratch.lookup)?;
    let bcx = &*bcx;
    super::convolve_rows(
        &scratch.seqs,
        &mut states,
        y,
        (d, 0, d),
        &w.conv,
        w.kernel,
        |t, yr| {
            let c = &bcx[t * 3 * d + d..t * 3 * d + 2 * d];
            yr.iter_mut().zip(c).for_each(|(v, &cv)| *v *= cv);
        },
    );
    drop(states);
    laps.lap(Stage::Attention);
    linear(
        pool,
        precision,
        file,
        &w.out_proj,
        y,
        t_rows,
        o,
        quant_scratch,
    )?;
    laps.lap(Stage::AttnOut);
    Ok(())
}
