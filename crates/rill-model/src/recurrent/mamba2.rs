//! Mamba-2 (the state-space layers of Granite 4.0-H and the other Mamba-2 hybrids).
//!
//! Per token: one projection gives the gate `z`, the convolution's input (`x`, then each
//! group's `B` and `C`) and one `dt` per head. After a causal depthwise convolution (with a
//! bias, then SiLU), head `h` (in group `h / (heads / groups)`) updates its
//! `head_dim × d_state` state with decay `exp(dt · A)`, `dt = softplus(dt + dt_bias)`:
//! `S ← exp(dt·A)·S + dt · x Bᵀ`, `y = S C + D·x`. Then `y · silu(z)` is RMS-normalised group
//! by group and goes through the output projection.

use rill_gguf::GgufFile;
use rill_kernels::ops;

use super::RecurrentScratch;
use crate::config::Mamba2Config;
use crate::forward::{fit, Pass};
use crate::kv_cache::KvCache;
use crate::linear::linear;
use crate::profile::{Laps, Stage};
use crate::weights::{matrix, shaped, vector, Weight};
use crate::ModelError;

/// A Mamba-2 layer's weights.
#[derive(Debug, Clone)]
pub struct Mamba2Weights {
    /// `d_model → 2·d_inner + 2·groups·d_state + heads`: `z`, `x`, `B`, `C`, `dt`.
    pub in_proj: Weight,
    /// The convolution's kernels, channel by channel (`channels × kernel`), and biases.
    pub conv: Vec<f32>,
    pub conv_bias: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `-exp(A_log)` per head.
    pub a: Vec<f32>,
    pub d: Vec<f32>,
    /// The grouped norm's weight (`d_inner`, group after group).
    pub norm: Vec<f32>,
    /// `d_inner → d_model`.
    pub out: Weight,
}

/// A tensor of `dims` read whole into f32.
fn floats(file: &GgufFile, name: &str, dims: &[usize]) -> Result<Vec<f32>, ModelError> {
    let (info, ty) = shaped(file, name, dims)?;
    let mut out = vec![0.0; dims.iter().product()];
    rill_kernels::dequantize_row(ty, file.tensor_data(info), &mut out)?;
    Ok(out)
}

impl Mamba2Weights {
    pub(crate) fn load(
        file: &GgufFile,
        il: usize,
        d: usize,
        c: &Mamba2Config,
    ) -> Result<Mamba2Weights, ModelError> {
        let name = |s: &str| format!("blk.{il}.{s}");
        let channels = c.conv_channels();
        Ok(Mamba2Weights {
            in_proj: matrix(file, &name("ssm_in.weight"), d, c.in_proj_rows())?,
            conv: floats(file, &name("ssm_conv1d.weight"), &[c.conv_kernel, channels])?,
            conv_bias: vector(file, &name("ssm_conv1d.bias"), channels)?,
            dt_bias: vector(file, &name("ssm_dt.bias"), c.n_heads)?,
            a: floats(file, &name("ssm_a"), &[1, c.n_heads])?,
            d: floats(file, &name("ssm_d"), &[1, c.n_heads])?,
            norm: floats(
                file,
                &name("ssm_norm.weight"),
                &[c.d_inner / c.n_groups, c.n_groups],
            )?,
            out: matrix(file, &name("ssm_out.weight"), c.d_inner, d)?,
        })
    }

    pub(crate) fn matrices(&self) -> Vec<&Weight> {
        vec![&self.in_proj, &self.out]
    }

    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Weight> {
        vec![&mut self.in_proj, &mut self.out]
    }

    pub(crate) fn vector_len(&self) -> usize {
        self.conv.len()
            + self.conv_bias.len()
            + self.dt_bias.len()
            + self.a.len()
            + self.d.len()
            + self.norm.len()
    }
}

/// Layer `il` over `h` (`t_rows × d_model`), writing `o`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mamba2_layer(
    pass: &Pass,
    w: &Mamba2Weights,
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
    let c = cfg
        .mamba2
        .as_ref()
        .ok_or_else(|| ModelError::MissingMetadata("ssm.state_size (a Mamba-2 layer)".into()))?;
    let t_rows = batch.len();
    let (di, nh, hd, ng, ds) = (c.d_inner, c.n_heads, c.head_dim(), c.n_groups, c.d_state);
    let (rows, channels) = (c.in_proj_rows(), c.conv_channels());
    let proj = fit(&mut scratch.mixed, t_rows * rows);
    linear(
        pool,
        precision,
        file,
        &w.in_proj,
        h,
        t_rows,
        proj,
        quant_scratch,
    )?;
    laps.lap(Stage::Qkv);

    // dt per row and head: softplus(dt + bias), and the decay exp(dt · A).
    let dts = fit(&mut scratch.beta, t_rows * nh);
    let decays = fit(&mut scratch.alpha, t_rows * nh);
    for t in 0..t_rows {
        for hh in 0..nh {
            let dt = ops::softplus(proj[t * rows + 2 * di + 2 * ng * ds + hh] + w.dt_bias[hh]);
            dts[t * nh + hh] = dt;
            decays[t * nh + hh] = (dt * w.a[hh]).exp();
        }
    }

    let mut states = super::layer_states(kv, il, &scratch.seqs, &mut scratch.lookup)?;
    let io = (rows, di, channels);
    let bias = &w.conv_bias;
    super::convolve_rows(
        &scratch.seqs,
        &mut states,
        proj,
        io,
        &w.conv,
        c.conv_kernel,
        |_, x| {
            for (v, &b) in x.iter_mut().zip(bias) {
                *v = ops::silu(*v + b);
            }
        },
    );

    // The scan: one task per head (in group `h / (heads / groups)`).
    let heads = fit(&mut scratch.heads, nh * t_rows * hd);
    let (proj, dts, decays) = (&*proj, &*dts, &*decays);
    let heads_per_group = nh / ng;
    super::scan_heads(
        pool,
        &scratch.seqs,
        &mut states,
        (nh, hd * ds),
        heads,
        (t_rows, hd),
        || (),
        |hh, t, _, state, y, _| {
            let g = hh / heads_per_group;
            let row = &proj[t * rows..(t + 1) * rows];
            let x = &row[di + hh * hd..di + (hh + 1) * hd];
            let b = &row[2 * di + g * ds..2 * di + (g + 1) * ds];
            let cc = &row[2 * di + ng * ds + g * ds..2 * di + ng * ds + (g + 1) * ds];
            let (decay, dt) = (decays[t * nh + hh], dts[t * nh + hh]);
            ops::ssd_step(state, x, b, cc, decay, dt, w.d[hh], y);
        },
    );
    drop(states);

    // y · silu(z), normalised group by group, back to row-major order.
    let out = fit(&mut scratch.out, t_rows * di);
    let heads = &*heads;
    let group_len = di / ng;
    pool.for_rows_mut(t_rows, 16, [&mut *out], [di], |t, [row]| {
        for hh in 0..nh {
            row[hh * hd..(hh + 1) * hd]
                .copy_from_slice(&heads[(hh * t_rows + t) * hd..(hh * t_rows + t + 1) * hd]);
        }
        let z = &proj[t * rows..t * rows + di];
        for (v, &g) in row.iter_mut().zip(z) {
            *v *= ops::silu(g);
        }
        for (part, wg) in row
            .chunks_exact_mut(group_len)
            .zip(w.norm.chunks_exact(group_len))
        {
            ops::rms_norm_inplace(part, wg, cfg.rms_eps);
        }
    });
    laps.lap(Stage::Attention);
    linear(pool, precision, file, &w.out, out, t_rows, o, quant_scratch)?;
    laps.lap(Stage::AttnOut);
    Ok(())
}
