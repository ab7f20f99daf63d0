//! Elementwise operations and attention: RMSNorm, rotary embeddings, gate activations, softmax,
//! and single-query attention over keys and values read through [`KvView`] (so the paged KV
//! cache's layout stays the cache's business).

use half::f16;

/// RMS normalisation: `out[i] = x[i] / sqrt(mean(x²) + eps) * weight[i]`.
///
/// The mean is accumulated in f64 so the result is as close to exact as f32 allows; the cost is
/// negligible next to the matrix products.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// [`rms_norm`] in place.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, &w) in x.iter_mut().zip(weight) {
        *v = *v * scale * w;
    }
}

fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum_sq: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = sum_sq / x.len().max(1) as f64;
    (1.0 / (mean + f64::from(eps)).sqrt()) as f32
}

/// How a rotary embedding pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimensions (2i, 2i+1) rotate together (llama as stored in GGUF: the converter permuted Q/K).
    Adjacent,
    /// Dimensions (i, i + d/2) rotate together (GPT-NeoX, Gemma).
    NeoX,
}

/// Fills `cos`/`sin` (each `rot_dim / 2` long) with the rotation of position `pos`:
/// angle_i = pos / (base^(2i / rot_dim) * factor_i), where the optional per-frequency factors
/// are Llama 3's `rope_freqs`. Angles are computed in f64 so long positions stay exact.
pub fn rope_angles(
    pos: f64,
    base: f64,
    rot_dim: usize,
    freq_factors: Option<&[f32]>,
    cos: &mut [f32],
    sin: &mut [f32],
) {
    let half = rot_dim / 2;
    for i in 0..half {
        let factor = freq_factors
            .and_then(|f| f.get(i))
            .map_or(1.0, |&f| f64::from(f));
        let inv_freq = 1.0 / (base.powf((2 * i) as f64 / rot_dim as f64) * factor);
        let angle = pos * inv_freq;
        cos[i] = angle.cos() as f32;
        sin[i] = angle.sin() as f32;
    }
}

/// Rotates one head in place by precomputed angles (`cos.len()` pairs; dimensions beyond
/// `2 * cos.len()` are left as they are, for partial rotary embeddings).
pub fn rope_apply(head: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    match style {
        RopeStyle::Adjacent => {
            for i in 0..half {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos[i] - b * sin[i];
                head[2 * i + 1] = a * sin[i] + b * cos[i];
            }
        }
        RopeStyle::NeoX => {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos[i] - b * sin[i];
                head[i + half] = a * sin[i] + b * cos[i];
            }
        }
    }
}

/// SiLU, `x * sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU with the tanh approximation (PyTorch's `gelu(approximate="tanh")`).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// The gate activation of a gated feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateActivation {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GeGLU: `gelu_tanh(gate) * up`.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: with `g = min(gate, 7)`, `g · sigmoid(1.702 g) ·
    /// (clamp(up, ±7) + 1)`.
    SwigluClamped,
}

/// gpt-oss's SwiGLU constants.
const CLAMP_LIMIT: f32 = 7.0;
const CLAMP_ALPHA: f32 = 1.702;

/// `gate[i] = act(gate[i]) * up[i]`, fused so the intermediate is written once, with libm's
/// `exp`/`tanh` and GELU's textbook form `½x(1 + tanh u)`: the reference path's arithmetic.
pub fn gated_activation(gate: &mut [f32], up: &[f32], act: GateActivation) {
    match act {
        GateActivation::Silu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = silu(*g) * u;
            }
        }
        GateActivation::GeluTanh => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = gelu_tanh(*g) * u;
            }
        }
        GateActivation::SwigluClamped => {
            for (g, &u) in gate.iter_mut().zip(up) {
                let x = g.min(CLAMP_LIMIT);
                let sigmoid = 1.0 / (1.0 + (-CLAMP_ALPHA * x).exp());
                *g = x * sigmoid * (u.clamp(-CLAMP_LIMIT, CLAMP_LIMIT) + 1.0);
            }
        }
    }
}

/// [`gated_activation`] for the fast path, eight lanes at a time. Both activations are
/// `x · sigmoid(k(x))` (SiLU: `k = x`; GELU-tanh: `k = 2√(2/π)(x + 0.044715x³)`, since
/// `½(1 + tanh u) = sigmoid(2u)`), with one polynomial `exp` (within 2 ulp of libm's). For
/// negative inputs this is more accurate than the textbook form, whose `1 + tanh u` cancels.
pub fn gated_activation_fast(gate: &mut [f32], up: &[f32], act: GateActivation) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::gated_activation(gate, up, act) };
    }
    gated_activation_scalar(gate, up, act)
}

/// Scalar twin of [`gated_activation_fast`]: the same operations (fused multiply-adds included)
/// per element, so it gives the same bits.
pub fn gated_activation_scalar(gate: &mut [f32], up: &[f32], act: GateActivation) {
    for (g, &u) in gate.iter_mut().zip(up) {
        // max then min, as the SIMD lanes do (the same bits for every input, NaN included).
        #[allow(clippy::manual_clamp)]
        let (x, u) = match act {
            GateActivation::SwigluClamped => (
                g.min(CLAMP_LIMIT),
                u.max(-CLAMP_LIMIT).min(CLAMP_LIMIT) + 1.0,
            ),
            _ => (*g, u),
        };
        *g = gate_scalar(x, act) * u;
    }
}

/// `x · sigmoid(k(x))` for one element (see [`gated_activation_fast`]).
#[inline]
fn gate_scalar(x: f32, act: GateActivation) -> f32 {
    let k = match act {
        GateActivation::Silu => x,
        GateActivation::GeluTanh => {
            let x3 = x * x * x;
            GELU_2C * GELU_A.mul_add(x3, x)
        }
        GateActivation::SwigluClamped => CLAMP_ALPHA * x,
    };
    x / (1.0 + exp_poly(-k))
}

/// `2√(2/π)` and the cubic coefficient of GELU's tanh approximation.
const GELU_2C: f32 = 1.595_769;
const GELU_A: f32 = 0.044_715;

/// Cephes-style `expf`: `2^n · e^r` with `|r| ≤ ln2/2` and a degree-6 polynomial for `e^r`,
/// inputs clamped to where f32 neither overflows nor loses every bit. The scalar form of the
/// SIMD version's lanes, operation for operation.
#[inline]
fn exp_poly(x: f32) -> f32 {
    let x = x.clamp(EXP_LO, EXP_HI);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let e = (p * r).mul_add(r, r) + 1.0;
    e * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

const EXP_HI: f32 = 88.0;
const EXP_LO: f32 = -87.0;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Coefficients of `(e^r - 1 - r) / r²`, highest degree first.
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// Softmax in place.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// [`softmax_inplace`] for the fast path: the polynomial `exp` eight lanes at a time and an
/// f32 sum in a fixed order (so a row's result depends on that row alone).
pub fn softmax_inplace_fast(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::softmax_inplace(x) };
    }
    softmax_inplace_fast_scalar(x)
}

/// `x[i] = exp(x[i] - max)` with the fast path's polynomial `exp`, eight lanes at a time, and
/// the sum of the results in a fixed order (so it depends on `x` alone): the body of
/// [`softmax_inplace_fast`], and the tiled attention's per-block step.
pub fn exp_shifted_sum(x: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::exp_shifted_sum(x, max) };
    }
    exp_shifted_sum_scalar(x, max)
}

/// Scalar twin of [`exp_shifted_sum`]: the same lanes, order and reduction tree.
pub fn exp_shifted_sum_scalar(x: &mut [f32], max: f32) -> f32 {
    let body = x.len() / 8 * 8;
    let mut sums = [0f32; 8];
    for (k, v) in x[..body].iter_mut().enumerate() {
        *v = exp_poly(*v - max);
        sums[k % 8] += *v;
    }
    let mut sum = sum8(&sums);
    for v in &mut x[body..] {
        *v = exp_poly(*v - max);
        sum += *v;
    }
    sum
}

/// Scalar twin of [`softmax_inplace_fast`]: the same lanes, order and reduction tree.
pub fn softmax_inplace_fast_scalar(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = exp_shifted_sum_scalar(x, max);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Fixed-order sum of eight lanes: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
#[inline]
fn sum8(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// Natural-log softmax of `logits` into `out`.
pub fn log_softmax(logits: &[f32], out: &mut [f32]) {
    let norm = log_normalizer(logits);
    for (o, &v) in out.iter_mut().zip(logits) {
        *o = v - norm;
    }
}

/// `ln Σ exp(logits)`, computed stably (shifted by the maximum, summed in f64): a logit minus
/// this is its log-probability.
pub fn log_normalizer(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&v| f64::from(v - max).exp()).sum();
    max + sum.ln() as f32
}

/// `dot(a, b)` for f16 `a` (cached keys) and f32 `b` (a query head), accumulated in f32.
#[inline]
pub fn dot_f16_f32(a: &[f16], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::dot_f16_f32(a, b) };
    }
    dot_f16_f32_scalar(a, b)
}

/// Scalar twin of [`dot_f16_f32`] (the same two-way split of lanes is not reproduced: results
/// agree to rounding).
pub fn dot_f16_f32_scalar(a: &[f16], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, &y)| x.to_f32() * y).sum()
}

/// `out += w * v` for f16 `v` (cached values).
#[inline]
pub fn axpy_f16(out: &mut [f32], w: f32, v: &[f16]) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::axpy_f16(out, w, v) };
    }
    axpy_f16_scalar(out, w, v)
}

/// Scalar twin of [`axpy_f16`].
pub fn axpy_f16_scalar(out: &mut [f32], w: f32, v: &[f16]) {
    for (o, x) in out.iter_mut().zip(v) {
        *o += w * x.to_f32();
    }
}

use crate::attention::scatter_heads;
pub use crate::attention::{
    attend, attend_heads, key_dots_run_by_position, value_axpys_run_by_position, KvView, ScoreShape,
};

/// Most query heads one multi-head attention kernel call serves.
pub const MAX_HEADS: usize = 4;

/// `out[g] = dot(a, b[g * n..(g + 1) * n])` for the `out.len()` (≤ [`MAX_HEADS`]) query heads
/// sharing the cached key `a` (`n = a.len()`): each result is bit-identical to
/// [`dot_f16_f32`] on that head, but the key is loaded and converted once for all of them.
#[inline]
pub fn dot_f16_f32_heads(a: &[f16], b: &[f32], out: &mut [f32]) {
    let n = a.len();
    assert!(
        out.len() <= MAX_HEADS && b.len() >= n * out.len(),
        "bad multi-head shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C; shapes checked above.
        return unsafe { simd::dot_f16_f32_heads(a, b, out) };
    }
    dot_f16_f32_heads_scalar(a, b, out)
}

/// Scalar twin of [`dot_f16_f32_heads`]: [`dot_f16_f32_scalar`] per head.
pub fn dot_f16_f32_heads_scalar(a: &[f16], b: &[f32], out: &mut [f32]) {
    let n = a.len();
    for (g, o) in out.iter_mut().enumerate() {
        *o = dot_f16_f32_scalar(a, &b[g * n..(g + 1) * n]);
    }
}

/// `out[g * n..(g + 1) * n] += w[g] * v` for the `w.len()` (≤ [`MAX_HEADS`]) query heads
/// sharing the cached value `v` (`n = v.len()`): bit-identical to [`axpy_f16`] per head, with
/// the value converted once.
#[inline]
pub fn axpy_f16_heads(out: &mut [f32], w: &[f32], v: &[f16]) {
    let n = v.len();
    assert!(
        w.len() <= MAX_HEADS && out.len() >= n * w.len(),
        "bad multi-head shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C; shapes checked above.
        return unsafe { simd::axpy_f16_heads(out, w, v) };
    }
    axpy_f16_heads_scalar(out, w, v)
}

/// Scalar twin of [`axpy_f16_heads`]: [`axpy_f16_scalar`] per head.
pub fn axpy_f16_heads_scalar(out: &mut [f32], w: &[f32], v: &[f16]) {
    let n = v.len();
    for (g, &wg) in w.iter().enumerate() {
        axpy_f16_scalar(&mut out[g * n..(g + 1) * n], wg, v);
    }
}

/// An element type cached keys and values are read as by the run kernels: f16 (converted
/// on load) or f32 (a quantized cache's rows, dequantized).
#[cfg(target_arch = "x86_64")]
pub trait RowElem: Copy + simd::Lane {
    fn to_f32(self) -> f32;
}

/// An element type cached keys and values are read as by the run kernels.
#[cfg(not(target_arch = "x86_64"))]
pub trait RowElem: Copy {
    fn to_f32(self) -> f32;
}

impl RowElem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl RowElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

/// `rows` cached vectors of `dim` elements each, `stride` elements apart in `data` (a run of
/// consecutive positions of one KV head inside one cache block).
#[derive(Clone, Copy, Debug)]
pub struct Rows<'a, T> {
    pub data: &'a [T],
    pub stride: usize,
    pub rows: usize,
    pub dim: usize,
}

/// A run of an f16 cache.
pub type F16Rows<'a> = Rows<'a, f16>;

impl<T> Rows<'_, T> {
    fn check(&self) {
        assert!(
            self.rows == 0 || self.data.len() >= (self.rows - 1) * self.stride + self.dim,
            "cached rows out of bounds"
        );
    }

    fn row(&self, k: usize) -> &[T] {
        &self.data[k * self.stride..k * self.stride + self.dim]
    }
}

/// Whether the attention runs take 512-bit registers for heads of `dim` elements: where the
/// CPU has them and the heads are long enough to pay for them. Measured (concurrent A/B):
/// Gemma 3's 256-element heads prefill 1.06x and decode 1.04x faster; SmolLM2's 64-element
/// heads decode 0.95x as fast (a few 512-bit instructions between 256-bit matrix products).
#[cfg(target_arch = "x86_64")]
#[inline]
fn wide_attention(dim: usize) -> bool {
    dim >= 128 && crate::wide_tiles()
}

/// `out[g * out_stride + k] = dot(keys row k, q_g)` for the `heads` (≤ [`MAX_HEADS`]) query
/// heads back to back in `q`, with the loop over the run inside one call. For f16 keys each
/// value is bit-identical to [`dot_f16_f32_heads`] on that key (and so to [`dot_f16_f32`]);
/// f32 keys go through the same lanes and sums.
pub fn dot_heads_run<T: RowElem>(
    keys: Rows<'_, T>,
    q: &[f32],
    heads: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    keys.check();
    assert!(
        (1..=MAX_HEADS).contains(&heads)
            && q.len() >= heads * keys.dim
            && (keys.rows == 0 || out.len() >= (heads - 1) * out_stride + keys.rows),
        "bad multi-head run shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if wide_attention(keys.dim) {
        // SAFETY: `wide_tiles` implies AVX2, FMA, F16C and AVX512-F; shapes checked above.
        return unsafe { simd::dot_heads_run_wide(keys, q, heads, out, out_stride) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C; shapes checked above.
        return unsafe { simd::dot_heads_run(keys, q, heads, out, out_stride) };
    }
    dot_heads_run_scalar(keys, q, heads, out, out_stride)
}

/// Scalar twin of [`dot_heads_run`] (a plain sum per head: results agree to rounding).
pub fn dot_heads_run_scalar<T: RowElem>(
    keys: Rows<'_, T>,
    q: &[f32],
    heads: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let n = keys.dim;
    let mut dots = [0f32; MAX_HEADS];
    for k in 0..keys.rows {
        let key = keys.row(k);
        for (g, d) in dots[..heads].iter_mut().enumerate() {
            *d = key
                .iter()
                .zip(&q[g * n..(g + 1) * n])
                .map(|(x, &y)| x.to_f32() * y)
                .sum();
        }
        scatter_heads(&dots[..heads], out, out_stride, k);
    }
}

/// `out_g += Σ_k w[g * w_stride + k] · values row k` for the `heads` (≤ [`MAX_HEADS`]) outputs
/// back to back in `out`, position by position in `k` order: bit-identical to
/// [`axpy_f16_heads`] called for `k = 0, 1, ...` in turn (f16 values), but each block of
/// outputs stays in registers over the whole run instead of being loaded and stored once per
/// position.
pub fn axpy_heads_run<T: RowElem>(
    out: &mut [f32],
    w: &[f32],
    w_stride: usize,
    values: Rows<'_, T>,
) {
    values.check();
    let heads = out.len() / values.dim.max(1);
    assert!(
        (1..=MAX_HEADS).contains(&heads)
            && out.len() == heads * values.dim
            && (values.rows == 0 || w.len() >= (heads - 1) * w_stride + values.rows),
        "bad multi-head run shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if wide_attention(values.dim) {
        // SAFETY: `wide_tiles` implies AVX2, FMA, F16C and AVX512-F; shapes checked above.
        return unsafe { simd::axpy_heads_run_wide(out, w, w_stride, values) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C; shapes checked above.
        return unsafe { simd::axpy_heads_run(out, w, w_stride, values) };
    }
    axpy_heads_run_scalar(out, w, w_stride, values)
}

/// Scalar twin of [`axpy_heads_run`].
pub fn axpy_heads_run_scalar<T: RowElem>(
    out: &mut [f32],
    w: &[f32],
    w_stride: usize,
    values: Rows<'_, T>,
) {
    let n = values.dim.max(1);
    let heads = out.len() / n;
    for k in 0..values.rows {
        let value = values.row(k);
        for g in 0..heads {
            let wg = w[g * w_stride + k];
            for (o, x) in out[g * n..(g + 1) * n].iter_mut().zip(value) {
                *o += wg * x.to_f32();
            }
        }
    }
}

/// `out += w * v`.
#[inline]
pub fn axpy_f32(out: &mut [f32], w: f32, v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { simd::axpy_f32(out, w, v) };
    }
    axpy_f32_scalar(out, w, v)
}

/// Scalar twin of [`axpy_f32`].
pub fn axpy_f32_scalar(out: &mut [f32], w: f32, v: &[f32]) {
    for (o, &x) in out.iter_mut().zip(v) {
        *o += w * x;
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use half::f16;

    /// Loading cached elements as f32 lanes (inlined into the AVX2 / AVX-512 functions).
    pub trait Lane: Copy {
        /// Eight elements from `p`.
        unsafe fn load8(p: *const Self) -> __m256;
        /// Sixteen elements from `p` (AVX512-F callers only).
        unsafe fn load16(p: *const Self) -> __m512;
        /// One element.
        unsafe fn scalar(p: *const Self) -> f32;
    }

    impl Lane for f16 {
        #[inline(always)]
        unsafe fn load8(p: *const f16) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
        }
        #[inline(always)]
        unsafe fn load16(p: *const f16) -> __m512 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
        }
        #[inline(always)]
        unsafe fn scalar(p: *const f16) -> f32 {
            (*p).to_f32()
        }
    }

    impl Lane for f32 {
        #[inline(always)]
        unsafe fn load8(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn load16(p: *const f32) -> __m512 {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn scalar(p: *const f32) -> f32 {
            *p
        }
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_f32(a: &[f16], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr() as *const u16, b.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            let a0 = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
            let a1 = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i + 8) as *const __m128i));
            acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(pb.add(i + 8)), acc1);
            i += 16;
        }
        if i + 8 <= n {
            let a0 = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
            acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(pb.add(i)), acc0);
            i += 8;
        }
        let mut sum = hsum(_mm256_add_ps(acc0, acc1));
        while i < n {
            sum += a[i].to_f32() * b[i];
            i += 1;
        }
        sum
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f16(out: &mut [f32], w: f32, v: &[f16]) {
        let n = out.len().min(v.len());
        let (po, pv) = (out.as_mut_ptr(), v.as_ptr() as *const u16);
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(pv.add(i) as *const __m128i));
            _mm256_storeu_ps(
                po.add(i),
                _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(po.add(i))),
            );
            i += 8;
        }
        while i < n {
            out[i] += w * v[i].to_f32();
            i += 1;
        }
    }

    /// [`dot_f16_f32`] for up to `MAX_HEADS` heads at once, per head the same operations in
    /// the same order.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `b` holds `out.len()` heads of `a.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16_f32_heads(a: &[f16], b: &[f32], out: &mut [f32]) {
        match out.len() {
            1 => heads::<1>(a, b, out),
            2 => heads::<2>(a, b, out),
            3 => heads::<3>(a, b, out),
            _ => heads::<4>(a, b, out),
        }
    }

    #[inline(always)]
    unsafe fn heads<const G: usize>(a: &[f16], b: &[f32], out: &mut [f32]) {
        heads_ptr::<G, f16>(a.as_ptr(), a.len(), b.as_ptr(), out.as_mut_ptr(), 1)
    }

    /// `out[g * os] = dot(a, b_g)` over `n` elements, `b` holding `G` heads of `n`.
    #[inline(always)]
    unsafe fn heads_ptr<const G: usize, E: Lane>(
        pa: *const E,
        n: usize,
        pb: *const f32,
        out: *mut f32,
        os: usize,
    ) {
        let mut acc0 = [_mm256_setzero_ps(); G];
        let mut acc1 = [_mm256_setzero_ps(); G];
        let mut i = 0;
        while i + 16 <= n {
            let a0 = E::load8(pa.add(i));
            let a1 = E::load8(pa.add(i + 8));
            for (g, (c0, c1)) in acc0.iter_mut().zip(acc1.iter_mut()).enumerate() {
                let q = pb.add(g * n + i);
                *c0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(q), *c0);
                *c1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(q.add(8)), *c1);
            }
            i += 16;
        }
        dot_tail::<G, E>(pa, n, pb, out, os, acc0, acc1, i);
    }

    /// The end of [`heads_ptr`] from element `i` on (fewer than 16 left): eight more into
    /// `acc0` if there are, the horizontal sums, the scalar tail.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn dot_tail<const G: usize, E: Lane>(
        pa: *const E,
        n: usize,
        pb: *const f32,
        out: *mut f32,
        os: usize,
        mut acc0: [__m256; G],
        acc1: [__m256; G],
        mut i: usize,
    ) {
        if i + 8 <= n {
            let a0 = E::load8(pa.add(i));
            for (g, c0) in acc0.iter_mut().enumerate() {
                *c0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(pb.add(g * n + i)), *c0);
            }
            i += 8;
        }
        let mut sums = [0f32; 4];
        if G == 1 {
            sums[0] = hsum(_mm256_add_ps(acc0[0], acc1[0]));
        } else {
            let mut v = [_mm256_setzero_ps(); 4];
            for g in 0..G {
                v[g] = _mm256_add_ps(acc0[g], acc1[g]);
            }
            sums = hsum4(v);
        }
        for (g, &total) in sums.iter().enumerate().take(G) {
            let mut sum = total;
            for k in i..n {
                sum += E::scalar(pa.add(k)) * *pb.add(g * n + k);
            }
            *out.add(g * os) = sum;
        }
    }

    /// [`hsum`] of four registers at once, each sum bit-identical to `hsum` of that register
    /// (the same additions: lane `l` with `l + 4`, then those with their neighbour two away,
    /// then the last two), in about half the instructions of four calls.
    #[inline(always)]
    unsafe fn hsum4(v: [__m256; 4]) -> [f32; 4] {
        // (a0+a4 .. a3+a7 | b0+b4 .. b3+b7), and the same for c, d.
        let p = _mm256_add_ps(
            _mm256_permute2f128_ps(v[0], v[1], 0x20),
            _mm256_permute2f128_ps(v[0], v[1], 0x31),
        );
        let q = _mm256_add_ps(
            _mm256_permute2f128_ps(v[2], v[3], 0x20),
            _mm256_permute2f128_ps(v[2], v[3], 0x31),
        );
        // (s0+s2, s1+s3) of a and c | of b and d.
        let w = _mm256_add_ps(
            _mm256_shuffle_ps(p, q, 0b01_00_01_00),
            _mm256_shuffle_ps(p, q, 0b11_10_11_10),
        );
        // (a, c, a, c | b, d, b, d).
        let z = _mm256_add_ps(
            _mm256_shuffle_ps(w, w, 0b10_00_10_00),
            _mm256_shuffle_ps(w, w, 0b11_01_11_01),
        );
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), z);
        [lanes[0], lanes[4], lanes[1], lanes[5]]
    }

    /// [`heads_ptr`] with each head's two accumulators as the halves of one 512-bit register
    /// (AVX512-F): the same lanes, the same FMAs, half the instructions.
    #[inline(always)]
    unsafe fn heads_ptr_wide<const G: usize, E: Lane>(
        pa: *const E,
        n: usize,
        pb: *const f32,
        out: *mut f32,
        os: usize,
    ) {
        let mut acc = [_mm512_setzero_ps(); G];
        let mut i = 0;
        while i + 16 <= n {
            let a = E::load16(pa.add(i));
            for (g, c) in acc.iter_mut().enumerate() {
                *c = _mm512_fmadd_ps(a, _mm512_loadu_ps(pb.add(g * n + i)), *c);
            }
            i += 16;
        }
        let (acc0, acc1) = split_halves(acc);
        dot_tail::<G, E>(pa, n, pb, out, os, acc0, acc1, i);
    }

    /// [`heads_ptr_wide`] for `K` keys `ks` elements apart at once: each (key, head) register
    /// takes the same FMAs in the same order, so every dot keeps its bits, while a query
    /// head's 16 elements, loaded once, meet all `K` keys (one key at a time, the loads
    /// outnumber the FMAs).
    #[inline(always)]
    unsafe fn keys_ptr_wide<const K: usize, const G: usize, E: Lane>(
        pa: *const E,
        ks: usize,
        n: usize,
        pb: *const f32,
        out: *mut f32,
        os: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); G]; K];
        let mut i = 0;
        while i + 16 <= n {
            let mut a = [_mm512_setzero_ps(); K];
            for (k, a) in a.iter_mut().enumerate() {
                *a = E::load16(pa.add(k * ks + i));
            }
            for g in 0..G {
                let q = _mm512_loadu_ps(pb.add(g * n + i));
                for (acc, a) in acc.iter_mut().zip(&a) {
                    acc[g] = _mm512_fmadd_ps(*a, q, acc[g]);
                }
            }
            i += 16;
        }
        for (k, acc) in acc.iter().enumerate() {
            let (acc0, acc1) = split_halves(*acc);
            dot_tail::<G, E>(pa.add(k * ks), n, pb, out.add(k), os, acc0, acc1, i);
        }
    }

    /// The low and high 8 lanes of each register.
    #[inline(always)]
    unsafe fn split_halves<const G: usize>(v: [__m512; G]) -> ([__m256; G], [__m256; G]) {
        let mut lo = [_mm256_setzero_ps(); G];
        let mut hi = [_mm256_setzero_ps(); G];
        for g in 0..G {
            lo[g] = _mm512_castps512_ps256(v[g]);
            hi[g] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[g]), 1));
        }
        (lo, hi)
    }

    /// [`super::dot_heads_run`] in 512-bit registers ([`heads_ptr_wide`]): the same
    /// bits.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, F16C and AVX512-F; shapes as checked by the caller.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub unsafe fn dot_heads_run_wide<E: Lane>(
        keys: super::Rows<'_, E>,
        q: &[f32],
        heads: usize,
        out: &mut [f32],
        os: usize,
    ) {
        key_run::<true, E>(keys, q, heads, out, os)
    }

    /// [`super::axpy_heads_run`] in 512-bit registers ([`value_run_wide`]): the same bits.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, F16C and AVX512-F; shapes as checked by the caller.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub unsafe fn axpy_heads_run_wide<E: Lane>(
        out: &mut [f32],
        w: &[f32],
        ws: usize,
        values: super::Rows<'_, E>,
    ) {
        value_runs::<true, E>(out, w, ws, values)
    }

    /// [`value_run`] with each block of 16 outputs in one 512-bit register per head, four
    /// blocks at a time while there are (each position's weights, broadcast once, then meet
    /// four blocks of its values; every output register takes the same FMAs in the same
    /// order either way).
    #[inline(always)]
    unsafe fn value_run_wide<const G: usize, E: Lane>(
        po: *mut f32,
        pw: *const f32,
        ws: usize,
        pv: *const E,
        vs: usize,
        rows: usize,
        n: usize,
    ) {
        let mut i = 0;
        while i + 64 <= n {
            value_blocks_wide::<4, G, E>(po.add(i), pw, ws, pv.add(i), vs, rows, n);
            i += 64;
        }
        while i + 16 <= n {
            value_blocks_wide::<1, G, E>(po.add(i), pw, ws, pv.add(i), vs, rows, n);
            i += 16;
        }
        value_tail::<G, E>(po, pw, ws, pv, vs, rows, n, i);
    }

    /// `S` blocks of 16 outputs (from `po`, heads `n` apart) with every position of the run
    /// added: `out += w · value`, one FMA per position in position order.
    #[inline(always)]
    unsafe fn value_blocks_wide<const S: usize, const G: usize, E: Lane>(
        po: *mut f32,
        pw: *const f32,
        ws: usize,
        pv: *const E,
        vs: usize,
        rows: usize,
        n: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); G]; S];
        for (s, acc) in acc.iter_mut().enumerate() {
            for (g, a) in acc.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(po.add(g * n + 16 * s));
            }
        }
        for k in 0..rows {
            let mut x = [_mm512_setzero_ps(); S];
            for (s, x) in x.iter_mut().enumerate() {
                *x = E::load16(pv.add(k * vs + 16 * s));
            }
            for g in 0..G {
                let w = _mm512_set1_ps(*pw.add(g * ws + k));
                for (acc, x) in acc.iter_mut().zip(&x) {
                    acc[g] = _mm512_fmadd_ps(w, *x, acc[g]);
                }
            }
        }
        for (s, acc) in acc.iter().enumerate() {
            for (g, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(po.add(g * n + 16 * s), *a);
            }
        }
    }

    /// [`super::dot_heads_run`]: [`heads_ptr`] per key of the run.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; shapes as checked by the caller.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_heads_run<E: Lane>(
        keys: super::Rows<'_, E>,
        q: &[f32],
        heads: usize,
        out: &mut [f32],
        os: usize,
    ) {
        key_run::<false, E>(keys, q, heads, out, os)
    }

    /// Every key of the run against the `heads` query heads: [`heads_ptr`], or
    /// [`heads_ptr_wide`] when `WIDE` (only inlined into functions compiled with AVX512-F).
    #[inline(always)]
    unsafe fn key_run<const WIDE: bool, E: Lane>(
        keys: super::Rows<'_, E>,
        q: &[f32],
        heads: usize,
        out: &mut [f32],
        os: usize,
    ) {
        #[inline(always)]
        unsafe fn one<const G: usize, const WIDE: bool, E: Lane>(
            a: *const E,
            n: usize,
            pq: *const f32,
            o: *mut f32,
            os: usize,
        ) {
            if WIDE {
                heads_ptr_wide::<G, E>(a, n, pq, o, os)
            } else {
                heads_ptr::<G, E>(a, n, pq, o, os)
            }
        }
        #[inline(always)]
        unsafe fn four<const G: usize, E: Lane>(
            a: *const E,
            ks: usize,
            n: usize,
            pq: *const f32,
            o: *mut f32,
            os: usize,
        ) {
            keys_ptr_wide::<4, G, E>(a, ks, n, pq, o, os)
        }
        let (pk, pq, po) = (keys.data.as_ptr(), q.as_ptr(), out.as_mut_ptr());
        let (n, ks) = (keys.dim, keys.stride);
        let mut first = 0;
        if WIDE {
            while first + 4 <= keys.rows {
                let (a, o) = (pk.add(first * ks), po.add(first));
                match heads {
                    1 => four::<1, E>(a, ks, n, pq, o, os),
                    2 => four::<2, E>(a, ks, n, pq, o, os),
                    3 => four::<3, E>(a, ks, n, pq, o, os),
                    _ => four::<4, E>(a, ks, n, pq, o, os),
                }
                first += 4;
            }
        }
        for k in first..keys.rows {
            let (a, o) = (pk.add(k * ks), po.add(k));
            match heads {
                1 => one::<1, WIDE, E>(a, n, pq, o, os),
                2 => one::<2, WIDE, E>(a, n, pq, o, os),
                3 => one::<3, WIDE, E>(a, n, pq, o, os),
                _ => one::<4, WIDE, E>(a, n, pq, o, os),
            }
        }
    }

    /// [`super::axpy_heads_run`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; shapes as checked by the caller.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_heads_run<E: Lane>(
        out: &mut [f32],
        w: &[f32],
        ws: usize,
        values: super::Rows<'_, E>,
    ) {
        value_runs::<false, E>(out, w, ws, values)
    }

    /// The weighted values of the run added into the heads' outputs: [`value_run`], or
    /// [`value_run_wide`] when `WIDE` (only inlined into functions compiled with AVX512-F).
    #[inline(always)]
    unsafe fn value_runs<const WIDE: bool, E: Lane>(
        out: &mut [f32],
        w: &[f32],
        ws: usize,
        values: super::Rows<'_, E>,
    ) {
        #[inline(always)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn one<const G: usize, const WIDE: bool, E: Lane>(
            po: *mut f32,
            pw: *const f32,
            ws: usize,
            pv: *const E,
            vs: usize,
            rows: usize,
            n: usize,
        ) {
            if WIDE {
                value_run_wide::<G, E>(po, pw, ws, pv, vs, rows, n)
            } else {
                value_run::<G, E>(po, pw, ws, pv, vs, rows, n)
            }
        }
        let heads = out.len() / values.dim;
        let (po, pw) = (out.as_mut_ptr(), w.as_ptr());
        let pv = values.data.as_ptr();
        let (n, vs, rows) = (values.dim, values.stride, values.rows);
        match heads {
            1 => one::<1, WIDE, E>(po, pw, ws, pv, vs, rows, n),
            2 => one::<2, WIDE, E>(po, pw, ws, pv, vs, rows, n),
            3 => one::<3, WIDE, E>(po, pw, ws, pv, vs, rows, n),
            _ => one::<4, WIDE, E>(po, pw, ws, pv, vs, rows, n),
        }
    }

    /// Outputs in blocks of 16 (then 8) elements held in registers while every position of
    /// the run is added, each with the same `fma` as [`axpy_f16_heads`]; the last `n % 8`
    /// elements as its scalar tail (multiply, then add).
    #[inline(always)]
    #[allow(clippy::needless_range_loop)] // `g` indexes the accumulators and the head offsets
    unsafe fn value_run<const G: usize, E: Lane>(
        po: *mut f32,
        pw: *const f32,
        ws: usize,
        pv: *const E,
        vs: usize,
        rows: usize,
        n: usize,
    ) {
        let mut i = 0;
        while i + 16 <= n {
            let mut acc0 = [_mm256_setzero_ps(); G];
            let mut acc1 = [_mm256_setzero_ps(); G];
            for g in 0..G {
                acc0[g] = _mm256_loadu_ps(po.add(g * n + i));
                acc1[g] = _mm256_loadu_ps(po.add(g * n + i + 8));
            }
            for k in 0..rows {
                let p = pv.add(k * vs + i);
                let x0 = E::load8(p);
                let x1 = E::load8(p.add(8));
                for g in 0..G {
                    let wg = _mm256_broadcast_ss(&*pw.add(g * ws + k));
                    acc0[g] = _mm256_fmadd_ps(wg, x0, acc0[g]);
                    acc1[g] = _mm256_fmadd_ps(wg, x1, acc1[g]);
                }
            }
            for g in 0..G {
                _mm256_storeu_ps(po.add(g * n + i), acc0[g]);
                _mm256_storeu_ps(po.add(g * n + i + 8), acc1[g]);
            }
            i += 16;
        }
        value_tail::<G, E>(po, pw, ws, pv, vs, rows, n, i);
    }

    /// The end of [`value_run`] from element `i` on (fewer than 16 left).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    #[allow(clippy::needless_range_loop)] // `g` indexes the accumulators and the head offsets
    unsafe fn value_tail<const G: usize, E: Lane>(
        po: *mut f32,
        pw: *const f32,
        ws: usize,
        pv: *const E,
        vs: usize,
        rows: usize,
        n: usize,
        mut i: usize,
    ) {
        if i + 8 <= n {
            let mut acc = [_mm256_setzero_ps(); G];
            for g in 0..G {
                acc[g] = _mm256_loadu_ps(po.add(g * n + i));
            }
            for k in 0..rows {
                let x = E::load8(pv.add(k * vs + i));
                for g in 0..G {
                    let wg = _mm256_broadcast_ss(&*pw.add(g * ws + k));
                    acc[g] = _mm256_fmadd_ps(wg, x, acc[g]);
                }
            }
            for g in 0..G {
                _mm256_storeu_ps(po.add(g * n + i), acc[g]);
            }
            i += 8;
        }
        for k in 0..rows {
            for d in i..n {
                let x = E::scalar(pv.add(k * vs + d));
                for g in 0..G {
                    *po.add(g * n + d) += *pw.add(g * ws + k) * x;
                }
            }
        }
    }

    /// [`axpy_f16`] for up to `MAX_HEADS` heads at once, per head the same operations.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; `out` holds `w.len()` heads of `v.len()`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f16_heads(out: &mut [f32], w: &[f32], v: &[f16]) {
        let n = v.len();
        let (po, pv) = (out.as_mut_ptr(), v.as_ptr() as *const u16);
        let g_count = w.len();
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(pv.add(i) as *const __m128i));
            for (g, &wg) in w.iter().enumerate() {
                let o = po.add(g * n + i);
                _mm256_storeu_ps(
                    o,
                    _mm256_fmadd_ps(_mm256_set1_ps(wg), x, _mm256_loadu_ps(o)),
                );
            }
            i += 8;
        }
        for k in i..n {
            let x = v[k].to_f32();
            for g in 0..g_count {
                out[g * n + k] += w[g] * x;
            }
        }
    }

    /// `exp_poly` on eight lanes, operation for operation.
    #[inline(always)]
    unsafe fn exp8(t: __m256) -> __m256 {
        use super::{EXP_HI, EXP_LO, EXP_P, LN2_HI, LN2_LO};
        let t = _mm256_min_ps(
            _mm256_max_ps(t, _mm256_set1_ps(EXP_LO)),
            _mm256_set1_ps(EXP_HI),
        );
        let nf = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(t, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let neg_n = _mm256_sub_ps(_mm256_setzero_ps(), nf);
        let r = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(LN2_HI), t);
        let r = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let e = _mm256_add_ps(
            _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r),
            _mm256_set1_ps(1.0),
        );
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(nf),
            _mm256_set1_epi32(127),
        )));
        _mm256_mul_ps(e, pow2)
    }

    /// [`super::softmax_inplace_fast`]: lane `l` of the maximum and of the sum takes elements
    /// `l, l + 8, ...`; the tail is added in order after a fixed reduction tree.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn softmax_inplace(x: &mut [f32]) {
        let n = x.len();
        let p = x.as_mut_ptr();
        let mut maxv = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i + 8 <= n {
            maxv = _mm256_max_ps(maxv, _mm256_loadu_ps(p.add(i)));
            i += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), maxv);
        let body = i;
        let max = lanes
            .iter()
            .chain(&x[body..])
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let sum = exp_shifted_sum(x, max);
        let inv = 1.0 / sum;
        let invv = _mm256_set1_ps(inv);
        i = 0;
        while i < body {
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), invv));
            i += 8;
        }
        for v in &mut x[body..] {
            *v *= inv;
        }
    }

    /// [`super::exp_shifted_sum`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn exp_shifted_sum(x: &mut [f32], max: f32) -> f32 {
        let n = x.len();
        let p = x.as_mut_ptr();
        let body = n / 8 * 8;
        let mv = _mm256_set1_ps(max);
        let mut sumv = _mm256_setzero_ps();
        let mut i = 0;
        while i < body {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv));
            _mm256_storeu_ps(p.add(i), e);
            sumv = _mm256_add_ps(sumv, e);
            i += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), sumv);
        let mut sum = super::sum8(&lanes);
        for v in &mut x[body..] {
            *v = super::exp_poly(*v - max);
            sum += *v;
        }
        sum
    }

    /// [`super::gated_activation_fast`], eight lanes at a time, each lane the scalar twin's
    /// operations.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gated_activation(gate: &mut [f32], up: &[f32], act: super::GateActivation) {
        use super::{GateActivation, CLAMP_ALPHA, CLAMP_LIMIT, GELU_2C, GELU_A};
        let n = gate.len().min(up.len());
        let (pg, pu) = (gate.as_mut_ptr(), up.as_ptr());
        let one = _mm256_set1_ps(1.0);
        let limit = _mm256_set1_ps(CLAMP_LIMIT);
        let mut i = 0;
        while i + 8 <= n {
            let mut x = _mm256_loadu_ps(pg.add(i));
            let mut u = _mm256_loadu_ps(pu.add(i));
            let k = match act {
                GateActivation::Silu => x,
                GateActivation::GeluTanh => {
                    let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
                    let inner = _mm256_fmadd_ps(_mm256_set1_ps(GELU_A), x3, x);
                    _mm256_mul_ps(_mm256_set1_ps(GELU_2C), inner)
                }
                GateActivation::SwigluClamped => {
                    // The scalar twin's order: min(x, 7); min(max(u, -7), 7) + 1.
                    x = _mm256_min_ps(x, limit);
                    let low = _mm256_sub_ps(_mm256_setzero_ps(), limit);
                    u = _mm256_add_ps(_mm256_min_ps(_mm256_max_ps(u, low), limit), one);
                    _mm256_mul_ps(_mm256_set1_ps(CLAMP_ALPHA), x)
                }
            };
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), k));
            let y = _mm256_div_ps(x, _mm256_add_ps(one, e));
            _mm256_storeu_ps(pg.add(i), _mm256_mul_ps(y, u));
            i += 8;
        }
        super::gated_activation_scalar(&mut gate[i..n], &up[i..n], act);
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f32(out: &mut [f32], w: f32, v: &[f32]) {
        let n = out.len().min(v.len());
        let (po, pv) = (out.as_mut_ptr(), v.as_ptr());
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_loadu_ps(pv.add(i));
            _mm256_storeu_ps(
                po.add(i),
                _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(po.add(i))),
            );
            i += 8;
        }
        while i < n {
            out[i] += w * v[i];
            i += 1;
        }
    }

    /// Inlined into its AVX2 callers: as a call of its own it took a fifth of a long prompt's
    /// time (one call per cached key and head).
    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_of_constant_is_weight() {
        let x = [3.0f32; 8];
        let w: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let mut out = [0.0; 8];
        rms_norm(&x, &w, 0.0, &mut out);
        for (o, w) in out.iter().zip(&w) {
            assert!((o - w).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_styles_agree_up_to_permutation() {
        let mut cos = [0.0; 4];
        let mut sin = [0.0; 4];
        rope_angles(7.0, 10000.0, 8, None, &mut cos, &mut sin);
        let x: Vec<f32> = (0..8).map(|i| (i as f32 * 0.37).sin()).collect();
        // NeoX on x equals Adjacent on x interleaved as (x0, x4, x1, x5, ...).
        let mut neox = x.clone();
        rope_apply(&mut neox, &cos, &sin, RopeStyle::NeoX);
        let mut inter: Vec<f32> = (0..4).flat_map(|i| [x[i], x[i + 4]]).collect();
        rope_apply(&mut inter, &cos, &sin, RopeStyle::Adjacent);
        for i in 0..4 {
            assert!((neox[i] - inter[2 * i]).abs() < 1e-6);
            assert!((neox[i + 4] - inter[2 * i + 1]).abs() < 1e-6);
        }
    }

    #[test]
    fn softmax_sums_to_one_and_log_softmax_matches() {
        let logits = [1.0f32, -2.0, 0.5, 3.0, 3.0];
        let mut p = logits;
        softmax_inplace(&mut p);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let mut lp = [0.0; 5];
        log_softmax(&logits, &mut lp);
        for (a, b) in p.iter().zip(&lp) {
            assert!((a.ln() - b).abs() < 1e-5);
        }
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// The SIMD f16/f32 vector kernels against their scalar twins, on awkward lengths.
    #[test]
    fn f16_and_axpy_kernels_match_scalar_twins() {
        let mut seed = 7;
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255, 256, 257] {
            let a: Vec<f16> = (0..n)
                .map(|_| f16::from_f32(lcg(&mut seed) * 4.0))
                .collect();
            let b: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let (fast, slow) = (dot_f16_f32(&a, &b), dot_f16_f32_scalar(&a, &b));
            let scale: f32 = a.iter().zip(&b).map(|(x, y)| (x.to_f32() * y).abs()).sum();
            assert!(
                (fast - slow).abs() <= 1e-5 * scale.max(1.0),
                "n={n}: {fast} vs {slow}"
            );

            let w = lcg(&mut seed);
            let mut o1: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let mut o2 = o1.clone();
            axpy_f16(&mut o1, w, &a);
            axpy_f16_scalar(&mut o2, w, &a);
            for (x, y) in o1.iter().zip(&o2) {
                assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "axpy_f16 n={n}");
            }
            let mut o1: Vec<f32> = (0..n).map(|_| lcg(&mut seed)).collect();
            let mut o2 = o1.clone();
            axpy_f32(&mut o1, w, &b);
            axpy_f32_scalar(&mut o2, w, &b);
            for (x, y) in o1.iter().zip(&o2) {
                assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "axpy_f32 n={n}");
            }
        }
    }

    /// The multi-head kernels give each head exactly the single-head kernel's bits (SIMD), and
    /// their scalar twins agree to rounding.
    #[test]
    fn multi_head_kernels_equal_single_head_ones() {
        let mut seed = 11;
        for n in [1usize, 7, 8, 9, 16, 17, 64, 65, 256, 257] {
            for heads in 1..=MAX_HEADS {
                let a: Vec<f16> = (0..n)
                    .map(|_| f16::from_f32(lcg(&mut seed) * 4.0))
                    .collect();
                let q: Vec<f32> = (0..n * heads).map(|_| lcg(&mut seed)).collect();
                let mut dots = vec![0f32; heads];
                dot_f16_f32_heads(&a, &q, &mut dots);
                let mut slow = vec![0f32; heads];
                dot_f16_f32_heads_scalar(&a, &q, &mut slow);
                for g in 0..heads {
                    let one = dot_f16_f32(&a, &q[g * n..(g + 1) * n]);
                    assert_eq!(dots[g].to_bits(), one.to_bits(), "dot n={n} heads={heads}");
                    assert!((slow[g] - one).abs() <= 1e-4 * (1.0 + one.abs()));
                }
                let w: Vec<f32> = (0..heads).map(|_| lcg(&mut seed)).collect();
                let start: Vec<f32> = (0..n * heads).map(|_| lcg(&mut seed)).collect();
                let mut multi = start.clone();
                axpy_f16_heads(&mut multi, &w, &a);
                let mut multi_slow = start.clone();
                axpy_f16_heads_scalar(&mut multi_slow, &w, &a);
                for g in 0..heads {
                    let mut one = start[g * n..(g + 1) * n].to_vec();
                    axpy_f16(&mut one, w[g], &a);
                    for (k, v) in one.iter().enumerate() {
                        assert_eq!(multi[g * n + k].to_bits(), v.to_bits(), "axpy n={n}");
                        assert!((multi_slow[g * n + k] - v).abs() <= 1e-6 * (1.0 + v.abs()));
                    }
                }
            }
        }
    }

    /// The run kernels (a block's worth of cached positions per call) give exactly the bits of
    /// the per-position kernels applied in order, and their scalar twins agree to rounding.
    #[test]
    fn run_kernels_equal_per_position_ones() {
        let mut seed = 13;
        for dim in [1usize, 7, 8, 9, 15, 16, 17, 24, 33, 64, 65, 256, 257] {
            for heads in 1..=MAX_HEADS {
                for rows in [0usize, 1, 2, 5, 16] {
                    let stride = dim + (rows % 3) * 8;
                    let data: Vec<f16> = (0..rows * stride)
                        .map(|_| f16::from_f32(lcg(&mut seed) * 4.0))
                        .collect();
                    let run = F16Rows {
                        data: &data,
                        stride,
                        rows,
                        dim,
                    };
                    let q: Vec<f32> = (0..dim * heads).map(|_| lcg(&mut seed)).collect();
                    let out_stride = rows + 3;
                    let mut fast = vec![0f32; heads * out_stride];
                    dot_heads_run(run, &q, heads, &mut fast, out_stride);
                    let mut slow = vec![0f32; heads * out_stride];
                    dot_heads_run_scalar(run, &q, heads, &mut slow, out_stride);
                    // The same values as f32 rows (a dequantized cache) give the same bits.
                    let data32: Vec<f32> = data.iter().map(|x| x.to_f32()).collect();
                    let run32 = Rows {
                        data: &data32,
                        stride,
                        rows,
                        dim,
                    };
                    let mut fast32 = vec![0f32; heads * out_stride];
                    dot_heads_run(run32, &q, heads, &mut fast32, out_stride);
                    assert_eq!(fast32, fast, "f32 dot run dim={dim}");
                    let mut slow32 = vec![0f32; heads * out_stride];
                    dot_heads_run_scalar(run32, &q, heads, &mut slow32, out_stride);
                    assert_eq!(slow32, slow, "f32 scalar dot run dim={dim}");
                    let mut one = vec![0f32; heads];
                    for k in 0..rows {
                        dot_f16_f32_heads(run.row(k), &q, &mut one);
                        for g in 0..heads {
                            let (f, o) = (fast[g * out_stride + k], one[g]);
                            assert_eq!(f.to_bits(), o.to_bits(), "dot run dim={dim} g={g} k={k}");
                            let s = slow[g * out_stride + k];
                            assert!((s - o).abs() <= 1e-4 * (1.0 + o.abs()));
                        }
                    }

                    let w: Vec<f32> = (0..heads * out_stride).map(|_| lcg(&mut seed)).collect();
                    let start: Vec<f32> = (0..heads * dim).map(|_| lcg(&mut seed)).collect();
                    let mut fast = start.clone();
                    axpy_heads_run(&mut fast, &w, out_stride, run);
                    let mut slow = start.clone();
                    axpy_heads_run_scalar(&mut slow, &w, out_stride, run);
                    let mut fast32 = start.clone();
                    axpy_heads_run(&mut fast32, &w, out_stride, run32);
                    assert_eq!(fast32, fast, "f32 axpy run dim={dim}");
                    let mut slow32 = start.clone();
                    axpy_heads_run_scalar(&mut slow32, &w, out_stride, run32);
                    assert_eq!(slow32, slow, "f32 scalar axpy run dim={dim}");
                    let mut one = start.clone();
                    for k in 0..rows {
                        let wk: Vec<f32> = (0..heads).map(|g| w[g * out_stride + k]).collect();
                        axpy_f16_heads(&mut one, &wk, run.row(k));
                    }
                    for (i, ((f, s), o)) in fast.iter().zip(&slow).zip(&one).enumerate() {
                        assert_eq!(f.to_bits(), o.to_bits(), "axpy run dim={dim} i={i}");
                        assert!((s - o).abs() <= 1e-5 * (1.0 + o.abs()) * (rows as f32 + 1.0));
                    }
                }
            }
        }
    }

    /// The SIMD shifted exponentials and their sum give the scalar twin's bits.
    #[test]
    fn exp_shifted_sum_matches_scalar_twin() {
        let mut seed = 17;
        for n in [0usize, 1, 7, 8, 9, 63, 64, 65, 200] {
            let x: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 30.0).collect();
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (mut fast, mut slow) = (x.clone(), x.clone());
            let (sf, ss) = (
                exp_shifted_sum(&mut fast, max),
                exp_shifted_sum_scalar(&mut slow, max),
            );
            assert_eq!(sf.to_bits(), ss.to_bits(), "sum n={n}");
            assert_eq!(fast, slow, "n={n}");
        }
    }

    /// The SIMD gate activations give the scalar twin's bits, and both stay within a few ulp
    /// of the f64 definitions.
    #[test]
    fn fast_gate_activations_match_twin_and_f64() {
        let mut seed = 5;
        for n in [0usize, 1, 7, 8, 9, 31, 100, 1000] {
            let x: Vec<f32> = (0..n)
                .map(|k| lcg(&mut seed) * if k % 7 == 0 { 120.0 } else { 8.0 })
                .collect();
            let up: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 2.0).collect();
            let acts = [
                GateActivation::Silu,
                GateActivation::GeluTanh,
                GateActivation::SwigluClamped,
            ];
            for act in acts {
                let mut fast = x.clone();
                gated_activation_fast(&mut fast, &up, act);
                let mut twin = x.clone();
                gated_activation_scalar(&mut twin, &up, act);
                for k in 0..n {
                    assert_eq!(fast[k].to_bits(), twin[k].to_bits(), "{act:?} x={}", x[k]);
                    let (mut xd, mut ud) = (f64::from(x[k]), f64::from(up[k]));
                    let kd = match act {
                        GateActivation::Silu => xd,
                        GateActivation::GeluTanh => {
                            2.0 * (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))
                        }
                        GateActivation::SwigluClamped => {
                            xd = xd.min(7.0);
                            ud = ud.clamp(-7.0, 7.0) + 1.0;
                            1.702 * xd
                        }
                    };
                    let truth = xd / (1.0 + (-kd).exp()) * ud;
                    // Rounding `k` in f32 is amplified by exp: a relative error of ~|k| ulp is
                    // the problem's conditioning, not the method's. (Inputs past the clamp give
                    // ~1e-36 instead of a denormal.)
                    let ulps = 8.0 + 2.0 * kd.abs();
                    let tol = ulps * f64::from(f32::EPSILON) * truth.abs() + 1e-34;
                    assert!(
                        (f64::from(fast[k]) - truth).abs() <= tol,
                        "{act:?} x={}: {} vs {truth}",
                        x[k],
                        fast[k]
                    );
                }
            }
        }
    }

    /// The fast softmax gives its scalar twin's bits and stays within a few ulp of the exact one.
    #[test]
    fn fast_softmax_matches_twin_and_exact() {
        let mut seed = 3;
        for n in [1usize, 2, 7, 8, 9, 17, 64, 100, 257] {
            let x: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 20.0).collect();
            let mut fast = x.clone();
            softmax_inplace_fast(&mut fast);
            let mut twin = x.clone();
            softmax_inplace_fast_scalar(&mut twin);
            let mut exact = x.clone();
            softmax_inplace(&mut exact);
            for k in 0..n {
                assert_eq!(fast[k].to_bits(), twin[k].to_bits(), "n={n} k={k}");
                assert!((fast[k] - exact[k]).abs() <= 1e-6 * exact[k].max(1e-30) + 1e-7);
            }
        }
    }

    #[test]
    fn gelu_tanh_known_values() {
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert!((gelu_tanh(-1.0) + 0.158_808).abs() < 1e-5);
        assert_eq!(gelu_tanh(0.0), 0.0);
    }
}
