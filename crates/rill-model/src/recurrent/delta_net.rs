//! Gated DeltaNet (Qwen3.5's linear-attention layers).
//!
//! Per token: one projection gives the convolution's input (queries, keys and values of every
//! head), others the output gate `z` and, per value head, `β` and `α`. After a causal
//! depthwise convolution (SiLU), each key and query head is L2-normalised, queries scaled by
//! `1/√d_k`; each value head `h` reads key head `h mod n_k` (the converter stores value heads
//! tiled over key heads) and updates its `d_k × d_v` state by the gated delta rule with decay
//! `exp(A · softplus(α + dt_bias))` and rate `sigmoid(β)`; its output goes through an RMSNorm
//! gated by `silu(z)`, then the output projection.

use rill_gguf::GgufFile;
use rill_kernels::ops;

use super::RecurrentScratch;
use crate::attention_layer::sigmoid;
use crate::config::DeltaNetConfig;
use crate::forward::{fit, Pass};
use crate::kv_cache::KvCache;
use crate::linear::{linear, linear_group};
use crate::profile::{Laps, Stage};
use crate::weights::{matrix, shaped, vector, Weight};
use crate::ModelError;

/// A Gated DeltaNet layer's weights.
#[derive(Debug, Clone)]
pub struct DeltaNetWeights {
    /// `d_model → 2·n_k·d_k + n_v·d_v`: queries, keys, values (the convolution's channels).
    pub qkv: Weight,
    /// `d_model → n_v·d_v`: the output gate.
    pub z: Weight,
    /// `d_model → n_v`: the update rate's logits.
    pub beta: Weight,
    /// `d_model → n_v`: the decay's input.
    pub alpha: Weight,
    /// The convolution's kernels, channel by channel (`channels × kernel`).
    pub conv: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// `-exp(A_log)` per value head.
    pub a: Vec<f32>,
    /// The gated norm's weight (`d_v`, shared by the heads).
    pub norm: Vec<f32>,
    /// `n_v·d_v → d_model`.
    pub out: Weight,
}

impl DeltaNetWeights {
    pub(crate) fn load(
        file: &GgufFile,
        il: usize,
        d: usize,
        c: &DeltaNetConfig,
    ) -> Result<DeltaNetWeights, ModelError> {
        let name = |s: &str| format!("blk.{il}.{s}");
        let channels = c.conv_channels();
        let value_dim = c.n_v_heads * c.d_v;
        let (info, ty) = shaped(file, &name("ssm_conv1d.weight"), &[c.conv_kernel, channels])?;
        let mut conv = vec![0.0; c.conv_kernel * channels];
        rill_kernels::dequantize_row(ty, file.tensor_data(info), &mut conv)?;
        Ok(DeltaNetWeights {
            qkv: matrix(file, &name("attn_qkv.weight"), d, channels)?,
            z: matrix(file, &name("attn_gate.weight"), d, value_dim)?,
            beta: matrix(file, &name("ssm_beta.weight"), d, c.n_v_heads)?,
            alpha: matrix(file, &name("ssm_alpha.weight"), d, c.n_v_heads)?,
            conv,
            dt_bias: vector(file, &name("ssm_dt.bias"), c.n_v_heads)?,
            a: vector(file, &name("ssm_a"), c.n_v_heads)?,
            norm: vector(file, &name("ssm_norm.weight"), c.d_v)?,
            out: matrix(file, &name("ssm_out.weight"), value_dim, d)?,
        })
    }

    pub(crate) fn matrices(&self) -> Vec<&Weight> {
        vec![&self.qkv, &self.z, &self.beta, &self.alpha, &self.out]
    }

    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Weight> {
        vec![
            &mut self.qkv,
            &mut self.z,
            &mut self.beta,
            &mut self.alpha,
            &mut self.out,
        ]
    }

    pub(crate) fn vector_len(&self) -> usize {
        self.conv.len() + self.dt_bias.len() + self.a.len() + self.norm.len()
    }
}

/// Layer `il` over `h` (`t_rows × d_model`), writing `o`; the batch's rows grouped by sequence
/// in `scratch.seqs` (see `group_rows`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn delta_net_layer(
    pass: &Pass,
    w: &DeltaNetWeights,
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
        .delta_net
        .as_ref()
        .ok_or_else(|| ModelError::MissingMetadata("ssm.state_size (a DeltaNet layer)".into()))?;
    let t_rows = batch.len();
    let channels = c.conv_channels();
    let (nk, nv, dk, dv) = (c.n_k_heads, c.n_v_heads, c.d_k, c.d_v);
    let value_dim = nv * dv;
    let mixed = fit(&mut scratch.mixed, t_rows * channels);
    let z = fit(&mut scratch.z, t_rows * value_dim);
    let beta = fit(&mut scratch.beta, t_rows * nv);
    let alpha = fit(&mut scratch.alpha, t_rows * nv);
    linear_group(
        pool,
        precision,
        file,
        &mut [
            (&w.qkv, &mut *mixed),
            (&w.z, &mut *z),
            (&w.beta, &mut *beta),
            (&w.alpha, &mut *alpha),
        ],
        h,
        t_rows,
        quant_scratch,
    )?;
    laps.lap(Stage::Qkv);

    // Per row: gates, then (after each sequence's convolution) normalised heads.
    for t in 0..t_rows {
        for hv in 0..nv {
            let (b, a) = (&mut beta[t * nv + hv], &mut alpha[t * nv + hv]);
            *b = sigmoid(*b);
            *a = (w.a[hv] * ops::softplus(*a + w.dt_bias[hv])).exp();
        }
    }

    let mut states = super::layer_states(kv, il, &scratch.seqs, &mut scratch.lookup)?;
    let io = (channels, 0, channels);
    super::convolve_rows(
        &scratch.seqs,
        &mut states,
        mixed,
        io,
        &w.conv,
        c.conv_kernel,
        |_, x| x.iter_mut().for_each(|v| *v = ops::silu(*v)),
    );
    let q_scale = 1.0 / (dk as f32).sqrt();
    pool.for_rows_mut(t_rows, 16, [&mut *mixed], [channels], |_, [x]| {
        let (qk, _) = x.split_at_mut(2 * nk * dk);
        for head in qk.chunks_exact_mut(dk) {
            ops::l2_normalize(head, 1e-6);
        }
        qk[..nk * dk].iter_mut().for_each(|v| *v *= q_scale);
    });

    // The recurrence: one task per value head (reading key head `h mod n_k`).
    let heads = fit(&mut scratch.heads, nv * t_rows * dv);
    let (mixed, beta, alpha) = (&*mixed, &*beta, &*alpha);
    let qk = |t: usize, kh: usize| {
        let x = &mixed[t * channels..(t + 1) * channels];
        (
            &x[kh * dk..(kh + 1) * dk],
            &x[(nk + kh) * dk..(nk + kh + 1) * dk],
        )
    };
    super::scan_heads(
        pool,
        &scratch.seqs,
        &mut states,
        (nv, dk * dv),
        heads,
        (t_rows, dv),
        || ops::DeltaCarry::new(dv),
        |hv, t, next, state, o, carry| {
            let kh = hv % nk;
            let (q, kk) = qk(t, kh);
            let x = &mixed[t * channels..(t + 1) * channels];
            let v = &x[2 * nk * dk + hv * dv..2 * nk * dk + (hv + 1) * dv];
            let gates = (alpha[t * nv + hv], beta[t * nv + hv]);
            let next = next.map(|tn| (qk(tn, kh).1, alpha[tn * nv + hv]));
            ops::delta_rule_step(state, (q, kk, v), gates, o, carry, next);
        },
    );
    drop(states);

    // Gated norm per head, back to row-major order.
    let out = fit(&mut scratch.out, t_rows * value_dim);
    let heads = &*heads;
    pool.for_rows_mut(t_rows, 16, [&mut *out], [value_dim], |t, [row]| {
        for hv in 0..nv {
            let dst = &mut row[hv * dv..(hv + 1) * dv];
            dst.copy_from_slice(&heads[(hv * t_rows + t) * dv..(hv * t_rows + t + 1) * dv]);
            let zh = &z[t * value_dim + hv * dv..t * value_dim + (hv + 1) * dv];
            ops::gated_rms_norm(dst, zh, &w.norm, cfg.rms_eps);
        }
    });
    laps.lap(Stage::Attention);
    linear(pool, precision, file, &w.out, out, t_rows, o, quant_scratch)?;
    laps.lap(Stage::AttnOut);
    Ok(())
}
