//! Elementwise operations: RMSNorm, rotary embeddings, gate activations, softmax; attention's
//! inner loops over cached keys and values are in `heads.rs`.

mod encoder;
mod head_bounds;
mod heads;
mod recurrent;

pub use encoder::{erf, gelu_erf, gelu_erf_inplace, layer_norm_inplace};
// `gelu_erf_fast` and its twin live beside the other vectorised activations (they share its exp).
pub use head_bounds::{head_upper_bounds, head_upper_bounds_scalar, HeadBounds, BOUND_GROUP};
#[cfg(target_arch = "x86_64")]
pub(crate) use heads::simd::Lane;
pub use heads::*;
pub use recurrent::{
    causal_conv_step, delta_rule_step, delta_rule_step_scalar, gated_rms_norm, l2_normalize,
    softplus, ssd_step, ssd_step_scalar, DeltaCarry,
};

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

/// [`rms_norm_inplace`] without a weight (Gemma 4's value heads).
pub fn rms_norm_unweighted_inplace(x: &mut [f32], eps: f32) {
    let scale = rms_scale(x, eps);
    x.iter_mut().for_each(|v| *v *= scale);
}

/// `1 / sqrt(mean(x²) + eps)`, the squares (exact in f64) summed in eight lanes (lane `l`
/// takes elements `l, l + 8, ...` in order), the lanes in a fixed tree, then the tail in order:
/// bits that depend on `x` alone, in sums the compiler keeps in vector registers (one chain
/// through every element cost 2.2 cycles an element, 2.2% of SmolLM2's prompt).
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let body = x.len() / 8 * 8;
    let mut lanes = [0f64; 8];
    for chunk in x[..body].chunks_exact(8) {
        for (s, &v) in lanes.iter_mut().zip(chunk) {
            *s += f64::from(v) * f64::from(v);
        }
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    let mut sum_sq = ((a + e) + (b + f)) + ((c + g) + (d + h));
    for &v in &x[body..] {
        sum_sq += f64::from(v) * f64::from(v);
    }
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
    if crate::wide_tiles() {
        // SAFETY: `wide_tiles` implies AVX2, FMA, F16C and AVX512-F.
        return unsafe { simd::gated_activation_wide(gate, up, act) };
    }
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

/// GELU by the error function on the fast path, in place: `x/2 · (1 + erf(x/√2))` with erf by
/// Abramowitz & Stegun 7.1.26 (`1 − t·poly(t)·e^(−z²)`, `t = 1/(1 + p|z|)`; |error| ≤ 1.5e-7)
/// and the vectorised exp. [`encoder::gelu_erf`] is the reference path's, exact to f64.
pub fn gelu_erf_fast(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::gelu_erf(x) };
    }
    gelu_erf_fast_scalar(x)
}

/// Scalar twin of [`gelu_erf_fast`]: the same operations per element, so the same bits.
pub fn gelu_erf_fast_scalar(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu_erf_one(*v));
}

#[inline]
fn gelu_erf_one(v: f32) -> f32 {
    let z = v * std::f32::consts::FRAC_1_SQRT_2;
    let a = z.abs();
    let t = 1.0 / ERF_P.mul_add(a, 1.0);
    let mut p = ERF_A[0];
    for &c in &ERF_A[1..] {
        p = p.mul_add(t, c);
    }
    let y = 1.0 - p * t * exp_poly(-(a * a));
    0.5 * v * (1.0 + y.copysign(z))
}

/// Abramowitz & Stegun 7.1.26: `p`, and `a5..a1` (highest degree first).
const ERF_P: f32 = 0.327_591_1;
const ERF_A: [f32; 5] = [
    1.061_405_4,
    -1.453_152,
    1.421_413_8,
    -0.284_496_74,
    0.254_829_6,
];

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
    if crate::wide_tiles() {
        // SAFETY: `wide_tiles` implies AVX2, FMA, F16C and AVX512-F.
        return unsafe { simd::exp_shifted_sum_wide(x, max) };
    }
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

/// [`exp_shifted_sum`] of up to [`MAX_HEADS`] runs at once (a row's query heads over one key
/// block): run `g` is `x[g * stride..g * stride + n]`, shifted by `shifts[g]`, its sum to
/// `sums[g]`. Each run gets the bits [`exp_shifted_sum`] gives it alone; the 512-bit form
/// interleaves the runs' exponentials, so their sums' chains overlap instead of each call
/// waiting on its own (one call a head took 3.8% of SmolLM2's prompt, three times its
/// arithmetic).
pub fn exp_shifted_sums(x: &mut [f32], stride: usize, n: usize, shifts: &[f32], sums: &mut [f32]) {
    let runs = shifts.len();
    assert!(
        runs <= MAX_HEADS
            && sums.len() >= runs
            && (runs == 0 || (stride >= n && x.len() >= (runs - 1) * stride + n)),
        "bad exp run shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::wide_tiles() {
        // SAFETY: `wide_tiles` implies AVX2, FMA, F16C and AVX512-F; shapes checked above.
        return unsafe { simd::exp_shifted_sums_wide(x, stride, n, shifts, sums) };
    }
    for (g, (&shift, sum)) in shifts.iter().zip(sums.iter_mut()).enumerate() {
        *sum = exp_shifted_sum(&mut x[g * stride..g * stride + n], shift);
    }
}

/// Scalar twin of [`exp_shifted_sums`].
pub fn exp_shifted_sums_scalar(
    x: &mut [f32],
    stride: usize,
    n: usize,
    shifts: &[f32],
    sums: &mut [f32],
) {
    for (g, (&shift, sum)) in shifts.iter().zip(sums.iter_mut()).enumerate() {
        *sum = exp_shifted_sum_scalar(&mut x[g * stride..g * stride + n], shift);
    }
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

    /// `exp_poly` on a register of lanes, operation for operation, in the intrinsics named
    /// (the 256- and 512-bit forms are the same steps: each lane's bits are the scalar's).
    macro_rules! exp_lanes {
        ($(#[$doc:meta])* $name:ident, $v:ty, $set1:ident, $min:ident, $max:ident,
         $round:ident, $mul:ident, $sub:ident, $zero:ident, $fmadd:ident, $add:ident,
         $cast:ident, $shl:ident, $add_i:ident, $cvt:ident, $set1_i:ident) => {
            $(#[$doc])*
            #[inline(always)]
            unsafe fn $name(t: $v) -> $v {
                use super::{EXP_HI, EXP_LO, EXP_P, LN2_HI, LN2_LO};
                let t = $min($max(t, $set1(EXP_LO)), $set1(EXP_HI));
                let nf = $round::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>($mul(
                    t,
                    $set1(std::f32::consts::LOG2_E),
                ));
                let neg_n = $sub($zero(), nf);
                let r = $fmadd(neg_n, $set1(LN2_HI), t);
                let r = $fmadd(neg_n, $set1(LN2_LO), r);
                let mut p = $set1(EXP_P[0]);
                for &c in &EXP_P[1..] {
                    p = $fmadd(p, r, $set1(c));
                }
                let e = $add($fmadd($mul(p, r), r, r), $set1(1.0));
                let pow2 = $cast($shl::<23>($add_i($cvt(nf), $set1_i(127))));
                $mul(e, pow2)
            }
        };
    }

    exp_lanes!(
        /// `exp_poly` on eight lanes.
        exp8, __m256, _mm256_set1_ps, _mm256_min_ps, _mm256_max_ps, _mm256_round_ps,
        _mm256_mul_ps, _mm256_sub_ps, _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_add_ps,
        _mm256_castsi256_ps, _mm256_slli_epi32, _mm256_add_epi32, _mm256_cvtps_epi32,
        _mm256_set1_epi32
    );

    exp_lanes!(
        /// `exp_poly` on sixteen lanes.
        exp16, __m512, _mm512_set1_ps, _mm512_min_ps, _mm512_max_ps, _mm512_roundscale_ps,
        _mm512_mul_ps, _mm512_sub_ps, _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_add_ps,
        _mm512_castsi512_ps, _mm512_slli_epi32, _mm512_add_epi32, _mm512_cvtps_epi32,
        _mm512_set1_epi32
    );

    /// One register of gate values `x` and up values `u` through [`super::gate_scalar`]'s
    /// operations in every lane (the clamped SwiGLU's bounds first): the body of the gate
    /// activations at each width.
    macro_rules! gate_lanes {
        ($(#[$doc:meta])* $name:ident, $v:ty, $exp:ident, $set1:ident, $min:ident, $max:ident,
         $mul:ident, $sub:ident, $add:ident, $div:ident, $zero:ident, $fmadd:ident) => {
            $(#[$doc])*
            #[inline(always)]
            unsafe fn $name(mut x: $v, mut u: $v, act: super::GateActivation) -> $v {
                use super::{GateActivation, CLAMP_ALPHA, CLAMP_LIMIT, GELU_2C, GELU_A};
                let (one, limit) = ($set1(1.0), $set1(CLAMP_LIMIT));
                let k = match act {
                    GateActivation::Silu => x,
                    GateActivation::GeluTanh => {
                        let x3 = $mul($mul(x, x), x);
                        $mul($set1(GELU_2C), $fmadd($set1(GELU_A), x3, x))
                    }
                    GateActivation::SwigluClamped => {
                        // The scalar twin's order: min(x, 7); min(max(u, -7), 7) + 1.
                        x = $min(x, limit);
                        let low = $sub($zero(), limit);
                        u = $add($min($max(u, low), limit), one);
                        $mul($set1(CLAMP_ALPHA), x)
                    }
                };
                let e = $exp($sub($zero(), k));
                $mul($div(x, $add(one, e)), u)
            }
        };
    }

    gate_lanes!(
        /// The gate activation on eight lanes.
        gate8, __m256, exp8, _mm256_set1_ps, _mm256_min_ps, _mm256_max_ps, _mm256_mul_ps,
        _mm256_sub_ps, _mm256_add_ps, _mm256_div_ps, _mm256_setzero_ps, _mm256_fmadd_ps
    );

    gate_lanes!(
        /// The gate activation on sixteen lanes.
        gate16, __m512, exp16, _mm512_set1_ps, _mm512_min_ps, _mm512_max_ps, _mm512_mul_ps,
        _mm512_sub_ps, _mm512_add_ps, _mm512_div_ps, _mm512_setzero_ps, _mm512_fmadd_ps
    );

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

    /// [`super::exp_shifted_sum`] with the exponentials sixteen lanes at a time and the sum in
    /// [`exp_shifted_sum`]'s eight lanes and order (each register's low half, then its high
    /// half): the same bits. The one-run case of [`exp_shifted_sums_wide`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, F16C and AVX512-F.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub unsafe fn exp_shifted_sum_wide(x: &mut [f32], max: f32) -> f32 {
        let mut sum = [0f32];
        exp_runs_wide::<1>(x, x.len(), x.len(), &[max], &mut sum);
        sum[0]
    }

    /// [`super::exp_shifted_sums`]: each run's exponentials sixteen lanes at a time, its sum in
    /// [`exp_shifted_sum`]'s eight lanes and order, the runs' sixteen-lane steps interleaved.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, F16C and AVX512-F; shapes as checked by the caller.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub unsafe fn exp_shifted_sums_wide(
        x: &mut [f32],
        stride: usize,
        n: usize,
        shifts: &[f32],
        sums: &mut [f32],
    ) {
        match shifts.len() {
            0 => {}
            1 => exp_runs_wide::<1>(x, stride, n, shifts, sums),
            2 => exp_runs_wide::<2>(x, stride, n, shifts, sums),
            3 => exp_runs_wide::<3>(x, stride, n, shifts, sums),
            _ => exp_runs_wide::<4>(x, stride, n, shifts, sums),
        }
    }

    /// [`exp_shifted_sums_wide`] for `R` runs.
    #[inline(always)]
    unsafe fn exp_runs_wide<const R: usize>(
        x: &mut [f32],
        stride: usize,
        n: usize,
        shifts: &[f32],
        sums: &mut [f32],
    ) {
        let p = x.as_mut_ptr();
        let wide = n / 16 * 16;
        let mut shift = [_mm512_setzero_ps(); R];
        for (v, &m) in shift.iter_mut().zip(shifts) {
            *v = _mm512_set1_ps(m);
        }
        let mut sumv = [_mm256_setzero_ps(); R];
        let mut i = 0;
        while i < wide {
            for (g, (sv, m)) in sumv.iter_mut().zip(&shift).enumerate() {
                let q = p.add(g * stride + i);
                let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(q), *m));
                _mm512_storeu_ps(q, e);
                let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e)));
                *sv = _mm256_add_ps(*sv, _mm512_castps512_ps256(e));
                *sv = _mm256_add_ps(*sv, high);
            }
            i += 16;
        }
        for (g, sv) in sumv.into_iter().enumerate() {
            // SAFETY: run `g` lies within `x` (checked by the caller); runs do not overlap.
            let run = std::slice::from_raw_parts_mut(p.add(g * stride), n);
            sums[g] = exp_sum_from(run, shifts[g], i, sv);
        }
    }

    /// [`super::exp_shifted_sum`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn exp_shifted_sum(x: &mut [f32], max: f32) -> f32 {
        exp_sum_from(x, max, 0, _mm256_setzero_ps())
    }

    /// The rest of [`super::exp_shifted_sum`] from element `i` on, with the eight lanes'
    /// sums so far in `sumv`: eight elements at a time, the fixed reduction tree, the tail in
    /// order.
    #[inline(always)]
    unsafe fn exp_sum_from(x: &mut [f32], max: f32, mut i: usize, mut sumv: __m256) -> f32 {
        let p = x.as_mut_ptr();
        let body = x.len() / 8 * 8;
        let mv = _mm256_set1_ps(max);
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
        let n = gate.len().min(up.len());
        let (pg, pu) = (gate.as_mut_ptr(), up.as_ptr());
        let mut i = 0;
        while i + 8 <= n {
            let y = gate8(_mm256_loadu_ps(pg.add(i)), _mm256_loadu_ps(pu.add(i)), act);
            _mm256_storeu_ps(pg.add(i), y);
            i += 8;
        }
        super::gated_activation_scalar(&mut gate[i..n], &up[i..n], act);
    }

    /// [`gated_activation`] sixteen lanes at a time (the same operations in every lane: half
    /// the instructions of the exponential per element; the division's rate is the same), the
    /// rest by [`gated_activation`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA, F16C and AVX512-F.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub unsafe fn gated_activation_wide(gate: &mut [f32], up: &[f32], act: super::GateActivation) {
        let n = gate.len().min(up.len());
        let (pg, pu) = (gate.as_mut_ptr(), up.as_ptr());
        let mut i = 0;
        while i + 16 <= n {
            let y = gate16(_mm512_loadu_ps(pg.add(i)), _mm512_loadu_ps(pu.add(i)), act);
            _mm512_storeu_ps(pg.add(i), y);
            i += 16;
        }
        gated_activation(&mut gate[i..n], &up[i..n], act);
    }

    /// [`super::gelu_erf_fast`] on eight lanes, operation for operation; the tail by the twin.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn gelu_erf(x: &mut [f32]) {
        use super::{ERF_A, ERF_P};
        let n = x.len();
        let px = x.as_mut_ptr();
        let (one, half) = (_mm256_set1_ps(1.0), _mm256_set1_ps(0.5));
        let sign = _mm256_set1_ps(-0.0);
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_loadu_ps(px.add(i));
            let z = _mm256_mul_ps(v, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
            let a = _mm256_andnot_ps(sign, z);
            let t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(ERF_P), a, one));
            let mut p = _mm256_set1_ps(ERF_A[0]);
            for &c in &ERF_A[1..] {
                p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(c));
            }
            let e = exp8(_mm256_xor_ps(_mm256_mul_ps(a, a), sign));
            let y = _mm256_sub_ps(one, _mm256_mul_ps(_mm256_mul_ps(p, t), e));
            let erf = _mm256_or_ps(_mm256_andnot_ps(sign, y), _mm256_and_ps(sign, z));
            let out = _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, erf));
            _mm256_storeu_ps(px.add(i), out);
            i += 8;
        }
        super::gelu_erf_fast_scalar(&mut x[i..n]);
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

    /// The SIMD shifted exponentials and their sum give the scalar twin's bits.
    #[test]
    fn exp_shifted_sum_matches_scalar_twin() {
        let mut seed = 17;
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 24, 31, 63, 64, 65, 200] {
            let x: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 30.0).collect();
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut slow = x.clone();
            let ss = exp_shifted_sum_scalar(&mut slow, max);
            // The dispatch's choice, and each SIMD path this CPU has, whatever the switches say.
            let mut paths: Vec<fn(&mut [f32], f32) -> f32> = vec![exp_shifted_sum];
            #[cfg(target_arch = "x86_64")]
            {
                if crate::cpu::avx2_in_hardware() {
                    // SAFETY: the CPU has AVX2, FMA and F16C.
                    paths.push(|x, m| unsafe { simd::exp_shifted_sum(x, m) });
                }
                if crate::cpu::vnni_in_hardware() {
                    // SAFETY: the CPU has AVX2, FMA, F16C and AVX512-F.
                    paths.push(|x, m| unsafe { simd::exp_shifted_sum_wide(x, m) });
                }
            }
            for path in paths {
                let mut fast = x.clone();
                let sf = path(&mut fast, max);
                assert_eq!(sf.to_bits(), ss.to_bits(), "sum n={n}");
                assert_eq!(fast, slow, "n={n}");
            }
        }
    }

    /// Several runs at once give each run the bits it gets alone, for every run count and
    /// length (bodies, eight-lane parts and tails).
    #[test]
    fn exp_shifted_sums_match_scalar_twin() {
        let mut seed = 23;
        for runs in 0..=MAX_HEADS {
            for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 24, 31, 33, 48, 63, 64] {
                let stride = 64;
                let x: Vec<f32> = (0..MAX_HEADS * stride)
                    .map(|_| lcg(&mut seed) * 30.0)
                    .collect();
                let shifts: Vec<f32> = (0..runs)
                    .map(|g| {
                        x[g * stride..g * stride + n]
                            .iter()
                            .copied()
                            .fold(-1e30, f32::max)
                    })
                    .collect();
                let (mut slow, mut fast) = (x.clone(), x.clone());
                let (mut ss, mut sf) = ([0f32; MAX_HEADS], [0f32; MAX_HEADS]);
                exp_shifted_sums_scalar(&mut slow, stride, n, &shifts, &mut ss);
                exp_shifted_sums(&mut fast, stride, n, &shifts, &mut sf);
                assert_eq!(fast, slow, "runs={runs} n={n}");
                assert_eq!(
                    sf.map(f32::to_bits),
                    ss.map(f32::to_bits),
                    "runs={runs} n={n}"
                );
            }
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
    fn gelu_erf_fast_is_its_twin_bit_for_bit_and_close_to_exact() {
        let xs: Vec<f32> = (-40_000..40_000)
            .map(|i| i as f32 / 2_000.0)
            .chain([0.0, -0.0, 1e-30, -1e-30, 3e4, -3e4, f32::MAX, f32::MIN])
            .collect();
        let mut fast = xs.clone();
        gelu_erf_fast(&mut fast);
        let mut twin = xs.clone();
        gelu_erf_fast_scalar(&mut twin);
        for ((x, f), t) in xs.iter().zip(&fast).zip(&twin) {
            assert_eq!(
                f.to_bits(),
                t.to_bits(),
                "gelu_erf_fast({x}): {f} against {t}"
            );
        }
        let worst = xs[..80_000]
            .iter()
            .zip(&fast)
            .map(|(&x, &f)| (f64::from(f) - f64::from(gelu_erf(x))).abs())
            .fold(0.0, f64::max);
        // Measured: 4.8e-7 over [-20, 20] (f32's resolution there).
        assert!(worst < 1e-6, "off by {worst}");
    }

    #[test]
    fn gelu_tanh_known_values() {
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert!((gelu_tanh(-1.0) + 0.158_808).abs() < 1e-5);
        assert_eq!(gelu_tanh(0.0), 0.0);
    }
}
