//! Attention's inner loops over cached keys and values: f16 (or f32) dot products with one or
//! several query heads and weighted sums of values, per position or over a run of cached rows,
//! each SIMD kernel with its scalar twin.

use half::f16;

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

/// Whether the attention runs take 512-bit registers for heads of `dim` elements (the same
/// lanes and sums as the 256-bit ones, so the same bits): where the CPU has them. Measured
/// (concurrent A/B): Gemma 3's 256-element heads prefill 1.06x and decode 1.04x faster. SmolLM2's
/// 64-element heads first decoded 0.95x as fast, between 256-bit matrix products; with the
/// products in 512-bit tiles they prefill at depth 4096 1.1-1.4x as fast (alternating runs:
/// 124 → 135 and 117 → 163 tok/s), decoding unchanged within noise (202-248 against 236-249
/// tok/s at depth 0, 49-55 against 48-54 at 4096).
#[cfg(target_arch = "x86_64")]
#[inline]
fn wide_attention(dim: usize) -> bool {
    dim >= 64 && crate::wide_tiles()
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
    let heads = out.len() / values.dim.max(1);
    assert!(out.len() == heads * values.dim, "bad multi-head run shapes");
    axpy_heads_run_strip(out, values.dim, heads, w, w_stride, values)
}

/// [`axpy_heads_run`] for a strip of the heads' elements: `values.dim` elements of each of
/// `heads` outputs whose starts are `out_stride` apart in `out` (`values` the same strip of
/// each cached row). A strip starting at a multiple of 16 elements of its heads gets the bits
/// those elements get from the whole run.
pub fn axpy_heads_run_strip<T: RowElem>(
    out: &mut [f32],
    out_stride: usize,
    heads: usize,
    w: &[f32],
    w_stride: usize,
    values: Rows<'_, T>,
) {
    values.check();
    assert!(
        (1..=MAX_HEADS).contains(&heads)
            && out_stride >= values.dim
            && out.len() >= (heads - 1) * out_stride + values.dim
            && (values.rows == 0 || w.len() >= (heads - 1) * w_stride + values.rows),
        "bad multi-head run shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if wide_attention(values.dim) {
        // SAFETY: `wide_tiles` implies AVX2, FMA, F16C and AVX512-F; shapes checked above.
        return unsafe { simd::axpy_heads_run_wide(out, (out_stride, heads), w, w_stride, values) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2, FMA and F16C; shapes checked above.
        return unsafe { simd::axpy_heads_run(out, (out_stride, heads), w, w_stride, values) };
    }
    axpy_heads_run_strip_scalar(out, out_stride, heads, w, w_stride, values)
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
    axpy_heads_run_strip_scalar(out, n, heads, w, w_stride, values)
}

/// Scalar twin of [`axpy_heads_run_strip`].
pub fn axpy_heads_run_strip_scalar<T: RowElem>(
    out: &mut [f32],
    out_stride: usize,
    heads: usize,
    w: &[f32],
    w_stride: usize,
    values: Rows<'_, T>,
) {
    let n = values.dim;
    for k in 0..values.rows {
        let value = values.row(k);
        for g in 0..heads {
            let wg = w[g * w_stride + k];
            let o = &mut out[g * out_stride..g * out_stride + n];
            for (o, x) in o.iter_mut().zip(value) {
                *o += wg * x.to_f32();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod simd;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{axpy_f32, axpy_f32_scalar};

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
}
