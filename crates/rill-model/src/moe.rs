//! The routed feed-forward (mixture of experts): a router ranks the experts for each row, the
//! chosen ones run on the rows that chose them (rows grouped by expert, so each expert's weights
//! are read once per step whatever the batch), and each row sums its experts' outputs weighted by
//! the router.

use rill_gguf::GgufFile;
use rill_kernels::ops::{self, GateActivation};
use rill_kernels::ThreadPool;

use crate::forward::Precision;
use crate::linear::{linear, linear_group};
use crate::profile::{Laps, Stage};
use crate::{Expert, ModelError, MoeConfig, MoeGating};

/// Adds `bias` to every row of `rows`.
fn add_rows(rows: &mut [f32], bias: &[f32]) {
    for row in rows.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(x, &b)| *x += b);
    }
}

/// How a layer's rows choose their experts.
#[derive(Clone, Copy)]
pub(crate) struct Router<'a> {
    pub weight: &'a crate::Weight,
    pub bias: Option<&'a [f32]>,
    /// Added to the scores the experts are chosen by, not to their weights (LFM2-MoE).
    pub selection_bias: Option<&'a [f32]>,
    /// What the router reads, where it is not the experts' input (Gemma 4: the residual stream
    /// normed apart).
    pub input: Option<&'a [f32]>,
    /// Per expert, a factor on its weight (Gemma 4).
    pub expert_scales: Option<&'a [f32]>,
}

/// Buffers reused across passes (sized for the largest batch seen).
#[derive(Default)]
pub(crate) struct MoeScratch {
    /// Gemma 4: the router's input, and the routed branch's output beside the dense one.
    pub(crate) router_input: Vec<f32>,
    pub(crate) branch: Vec<f32>,
    /// Router logits, then probabilities: rows × experts.
    probs: Vec<f32>,
    /// Each row's chosen experts and weights, `n_used` per row, in the order they are summed.
    chosen: Vec<(u32, f32)>,
    /// Rows of the expert in hand: their inputs, gate and up, outputs.
    rows: Vec<usize>,
    input: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    out: Vec<f32>,
}

fn fit(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// `o` (rows × d) = Σ over each row's chosen experts of weight · expert(`h` row). When
/// profiling, the bytes of the experts some row chose (each once) go to the profile.
#[allow(clippy::too_many_arguments)]
pub(crate) fn routed_ffn(
    pool: &ThreadPool,
    precision: Precision,
    file: &GgufFile,
    moe: &MoeConfig,
    act: GateActivation,
    router: Router,
    experts: &[Expert],
    h: &[f32],
    n_rows: usize,
    o: &mut [f32],
    scratch: &mut MoeScratch,
    quant_scratch: &mut Vec<u8>,
    laps: &mut Laps<'_>,
) -> Result<(), ModelError> {
    let (n_exp, k) = (moe.n_experts, moe.n_used);
    let Router {
        weight,
        bias: router_bias,
        selection_bias,
        input,
        expert_scales,
    } = router;
    let d = weight.cols;
    let f = moe.expert_ffn_dim;
    let probs = fit(&mut scratch.probs, n_rows * n_exp);
    linear(
        pool,
        precision,
        file,
        weight,
        input.unwrap_or(h),
        n_rows,
        probs,
        quant_scratch,
    )?;

    // Route: the k highest (the lower index first on a tie) of the softmax over every expert,
    // renormalised where the model says so, or of the biased logits, then a softmax over them.
    scratch.chosen.clear();
    for row in probs.chunks_exact_mut(n_exp) {
        if let Some(bias) = router_bias {
            row.iter_mut().zip(bias).for_each(|(r, &b)| *r += b);
        }
        match moe.gating {
            MoeGating::SoftmaxThenTop { .. } => ops::softmax_inplace(row),
            MoeGating::SigmoidThenTop { .. } => row
                .iter_mut()
                .for_each(|r| *r = crate::attention_layer::sigmoid(*r)),
            MoeGating::TopThenSoftmax => {}
        }
        // The score each expert is chosen by (its weight, or that plus a selection bias).
        let score = |e: usize| row[e] + selection_bias.map_or(0.0, |b| b[e]);
        let start = scratch.chosen.len();
        for _ in 0..k {
            let best = (0..n_exp)
                .filter(|&e| {
                    !scratch.chosen[start..]
                        .iter()
                        .any(|&(c, _)| c as usize == e)
                })
                .fold(None, |best: Option<usize>, e| match best {
                    Some(b) if score(b) >= score(e) => Some(b),
                    _ => Some(e),
                })
                .unwrap_or(0);
            scratch.chosen.push((best as u32, row[best]));
        }
        let chosen = &mut scratch.chosen[start..];
        match moe.gating {
            MoeGating::SoftmaxThenTop { renormalize: true } => {
                let sum: f32 = chosen.iter().map(|c| c.1).sum();
                chosen.iter_mut().for_each(|c| c.1 /= sum);
            }
            MoeGating::SoftmaxThenTop { renormalize: false } => {}
            MoeGating::SigmoidThenTop { scale } => {
                // As transformers' LFM2-MoE router: the sum kept off zero by 1e-6.
                let sum: f32 = chosen.iter().map(|c| c.1).sum::<f32>() + 1e-6;
                chosen.iter_mut().for_each(|c| c.1 = c.1 / sum * scale);
            }
            MoeGating::TopThenSoftmax => {
                let max = chosen.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
                let sum: f32 = chosen.iter().map(|c| (c.1 - max).exp()).sum();
                chosen
                    .iter_mut()
                    .for_each(|c| c.1 = (c.1 - max).exp() / sum);
            }
        }
        if let Some(scales) = expert_scales {
            chosen.iter_mut().for_each(|c| c.1 *= scales[c.0 as usize]);
        }
    }

    laps.lap(Stage::GateUp);

    // Each expert once, over the rows that chose it; every row adds its experts in ascending
    // expert order, so its sum does not depend on the other rows.
    let o = &mut o[..n_rows * d];
    o.iter_mut().for_each(|v| *v = 0.0);
    for (e, expert) in experts.iter().enumerate() {
        scratch.rows.clear();
        for r in 0..n_rows {
            if scratch.chosen[r * k..(r + 1) * k]
                .iter()
                .any(|&(c, _)| c as usize == e)
            {
                scratch.rows.push(r);
            }
        }
        let m = scratch.rows.len();
        if m == 0 {
            continue;
        }
        if let Some(p) = laps.times() {
            p.weight_bytes += [&expert.gate, &expert.up, &expert.down]
                .iter()
                .map(|w| w.bytes_read(precision) as u64)
                .sum::<u64>();
        }
        let input = fit(&mut scratch.input, m * d);
        for (i, &r) in scratch.rows.iter().enumerate() {
            input[i * d..(i + 1) * d].copy_from_slice(&h[r * d..(r + 1) * d]);
        }
        let gate = fit(&mut scratch.gate, m * f);
        let up = fit(&mut scratch.up, m * f);
        linear_group(
            pool,
            precision,
            file,
            &mut [(&expert.gate, &mut *gate), (&expert.up, &mut *up)],
            input,
            m,
            quant_scratch,
        )?;
        if let Some([gate_bias, up_bias, _]) = &expert.biases {
            add_rows(gate, gate_bias);
            add_rows(up, up_bias);
        }
        laps.lap(Stage::GateUp);
        match precision {
            Precision::Exact => ops::gated_activation(gate, up, act),
            Precision::Fast => ops::gated_activation_fast(gate, up, act),
        }
        laps.lap(Stage::Activation);
        let out = fit(&mut scratch.out, m * d);
        linear(
            pool,
            precision,
            file,
            &expert.down,
            gate,
            m,
            out,
            quant_scratch,
        )?;
        if let Some([_, _, down_bias]) = &expert.biases {
            add_rows(out, down_bias);
        }
        for (i, &r) in scratch.rows.iter().enumerate() {
            let weight = scratch.chosen[r * k..(r + 1) * k]
                .iter()
                .find(|&&(c, _)| c as usize == e)
                .map_or(0.0, |c| c.1);
            let dst = &mut o[r * d..(r + 1) * d];
            ops::axpy_f32(dst, weight, &out[i * d..(i + 1) * d]);
        }
        laps.lap(Stage::Down);
    }
    Ok(())
}

/// `o += sigmoid(gate · h) · shared(h)` for every row (Qwen3.5-MoE's shared expert).
pub(crate) fn shared_expert(
    pass: &crate::forward::Pass,
    shared: &crate::weights::SharedExpert,
    h: &[f32],
    o: &mut [f32],
    scratch: &mut MoeScratch,
    quant_scratch: &mut Vec<u8>,
) -> Result<(), ModelError> {
    let (n_rows, d) = (pass.batch.len(), pass.cfg.d_model);
    let out = fit(&mut scratch.out, n_rows * d);
    let bufs = (&mut scratch.gate, &mut scratch.up);
    dense_expert(pass, &shared.expert, h, bufs, out, quant_scratch)?;
    for t in 0..n_rows {
        let hr = &h[t * d..(t + 1) * d];
        let logit: f64 = hr
            .iter()
            .zip(&shared.gate)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum();
        let g = crate::attention_layer::sigmoid(logit as f32);
        for (ov, &sv) in o[t * d..(t + 1) * d]
            .iter_mut()
            .zip(&out[t * d..(t + 1) * d])
        {
            *ov += g * sv;
        }
    }
    Ok(())
}

/// `out` (`rows × d_model`) = `down(act(gate · h) ⊙ (up · h))` for every row of the pass: one
/// dense gated feed-forward (`gate`, `up`: its buffers), without biases.
pub(crate) fn dense_expert(
    pass: &crate::forward::Pass,
    e: &Expert,
    h: &[f32],
    (gate, up): (&mut Vec<f32>, &mut Vec<f32>),
    out: &mut [f32],
    quant_scratch: &mut Vec<u8>,
) -> Result<(), ModelError> {
    let crate::forward::Pass {
        pool,
        precision,
        file,
        cfg,
        batch,
        ..
    } = *pass;
    let (n_rows, f) = (batch.len(), e.gate.rows);
    let gate = fit(gate, n_rows * f);
    let up = fit(up, n_rows * f);
    linear_group(
        pool,
        precision,
        file,
        &mut [(&e.gate, &mut *gate), (&e.up, &mut *up)],
        h,
        n_rows,
        quant_scratch,
    )?;
    match precision {
        Precision::Exact => ops::gated_activation(gate, up, cfg.activation),
        Precision::Fast => ops::gated_activation_fast(gate, up, cfg.activation),
    }
    linear(
        pool,
        precision,
        file,
        &e.down,
        gate,
        n_rows,
        out,
        quant_scratch,
    )?;
    Ok(())
}

/// Gemma 4's dense branch beside the experts, and the experts' and router's inputs: `o` =
/// `rms(dense(h), post_norm)` for the pre-normed `h`; then `h` = `rms(x, routed_pre_norm)` (the
/// experts' input) and the scratch's router input = `rms(x) · router_scale / √d`.
pub(crate) fn dense_beside(
    pass: &crate::forward::Pass,
    b: &crate::weights::DenseBeside,
    x: &[f32],
    (h, o): (&mut [f32], &mut [f32]),
    scratch: &mut MoeScratch,
    quant_scratch: &mut Vec<u8>,
) -> Result<(), ModelError> {
    let (pool, cfg) = (pass.pool, pass.cfg);
    let (n_rows, d, eps) = (pass.batch.len(), cfg.d_model, cfg.rms_eps);
    let bufs = (&mut scratch.gate, &mut scratch.up);
    dense_expert(pass, &b.expert, h, bufs, o, quant_scratch)?;
    let router_input = fit(&mut scratch.router_input, n_rows * d);
    let root = 1.0 / (d as f32).sqrt();
    let rows = [&mut o[..n_rows * d], &mut h[..n_rows * d], router_input];
    crate::forward::for_rows(pool, n_rows, rows, [d; 3], |t, [or, hr, rr]| {
        ops::rms_norm_inplace(or, &b.post_norm, eps);
        let xr = &x[t * d..(t + 1) * d];
        ops::rms_norm(xr, &b.routed_pre_norm, eps, hr);
        rr.copy_from_slice(xr);
        ops::rms_norm_unweighted_inplace(rr, eps);
        rr.iter_mut()
            .zip(&b.router_scale)
            .for_each(|(v, &s)| *v = *v * s * root);
    });
    Ok(())
}
