//! Upper bounds on the two-pass output head's logits: per head row, the first pass's estimate
//! plus the copy's error bound against the hidden state (`rill-model`'s `two_pass_head`).

use crate::error::check_len;
use crate::KernelError;

/// Rows whose error codes sit side by side, block by block.
pub const BOUND_GROUP: usize = 16;

/// Relative room on the codes' sum for its f32 rounding (at most a few hundred terms).
const SUM_ROOM: f32 = 1.0 + 1.0 / 65536.0;

/// The inputs of [`head_upper_bounds`] for `rows` head rows of `blocks` error blocks each.
pub struct HeadBounds<'a> {
    /// The first pass's value of each row.
    pub estimate: &'a [f32],
    /// Per group of [`BOUND_GROUP`] rows (the last one padded), per block, the group's codes:
    /// `codes[(g · blocks + b) · 16 + r]` is row `16g + r`'s code for block `b`.
    pub codes: &'a [u8],
    /// Per row, what one code is worth.
    pub unit: &'a [f32],
    /// Per row, the weight of the whole-row term.
    pub norm: &'a [f32],
    /// Per block, the hidden state's norm over it.
    pub block_norms: &'a [f32],
    /// The whole-row term per unit of `norm`.
    pub per_norm: f32,
}

/// `upper[r] = estimate[r] + ((unit[r] · Σ_b code[r][b] · block_norms[b]) · (1 + 2⁻¹⁶) +
/// norm[r] · per_norm)`, the sum taken over the blocks in order with a rounding per product and
/// per addition (no fused multiply-add), so that every path gives the same bits.
pub fn head_upper_bounds(b: &HeadBounds, upper: &mut [f32]) -> Result<(), KernelError> {
    check(b, upper)?;
    #[cfg(target_arch = "x86_64")]
    if crate::wide_tiles() {
        // SAFETY: the CPU has AVX512-F (implied by the wide tiles).
        unsafe { simd::bounds_avx512(b, upper) };
        return Ok(());
    } else if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2.
        unsafe { simd::bounds_avx2(b, upper) };
        return Ok(());
    }
    bounds_scalar(b, upper, 0);
    Ok(())
}

/// Scalar twin of [`head_upper_bounds`].
pub fn head_upper_bounds_scalar(b: &HeadBounds, upper: &mut [f32]) -> Result<(), KernelError> {
    check(b, upper)?;
    bounds_scalar(b, upper, 0);
    Ok(())
}

fn check(b: &HeadBounds, upper: &[f32]) -> Result<(), KernelError> {
    let rows = b.estimate.len();
    let blocks = b.block_norms.len();
    check_len("head bound rows", rows, upper.len())?;
    check_len("head bound units", rows, b.unit.len())?;
    check_len("head bound norms", rows, b.norm.len())?;
    let codes = rows
        .div_ceil(BOUND_GROUP)
        .checked_mul(blocks * BOUND_GROUP)
        .ok_or(KernelError::Overflow)?;
    check_len("head bound codes", codes, b.codes.len())
}

/// Rows from `first` (a multiple of the group) on.
fn bounds_scalar(b: &HeadBounds, upper: &mut [f32], first: usize) {
    let blocks = b.block_norms.len();
    for (r, out) in upper.iter_mut().enumerate().skip(first) {
        let (g, lane) = (r / BOUND_GROUP, r % BOUND_GROUP);
        let mut acc = 0f32;
        for (k, &h) in b.block_norms.iter().enumerate() {
            let code = b.codes[(g * blocks + k) * BOUND_GROUP + lane] as f32;
            acc += code * h;
        }
        let weighted = acc * b.unit[r] * SUM_ROOM;
        *out = b.estimate[r] + (weighted + b.norm[r] * b.per_norm);
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{bounds_scalar, HeadBounds, BOUND_GROUP, SUM_ROOM};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn bounds_avx512(b: &HeadBounds, upper: &mut [f32]) {
        let blocks = b.block_norms.len();
        let whole = upper.len() / BOUND_GROUP;
        let room = _mm512_set1_ps(SUM_ROOM);
        let per_norm = _mm512_set1_ps(b.per_norm);
        for g in 0..whole {
            let mut acc = _mm512_setzero_ps();
            let codes = b.codes.as_ptr().add(g * blocks * BOUND_GROUP);
            for k in 0..blocks {
                let c = _mm_loadu_si128(codes.add(k * BOUND_GROUP) as *const __m128i);
                let c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c));
                let h = _mm512_set1_ps(*b.block_norms.get_unchecked(k));
                acc = _mm512_add_ps(acc, _mm512_mul_ps(c, h));
            }
            let r = g * BOUND_GROUP;
            let unit = _mm512_loadu_ps(b.unit.as_ptr().add(r));
            let weighted = _mm512_mul_ps(_mm512_mul_ps(acc, unit), room);
            let norm = _mm512_loadu_ps(b.norm.as_ptr().add(r));
            let term = _mm512_add_ps(weighted, _mm512_mul_ps(norm, per_norm));
            let est = _mm512_loadu_ps(b.estimate.as_ptr().add(r));
            _mm512_storeu_ps(upper.as_mut_ptr().add(r), _mm512_add_ps(est, term));
        }
        bounds_scalar(b, upper, whole * BOUND_GROUP);
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn bounds_avx2(b: &HeadBounds, upper: &mut [f32]) {
        let blocks = b.block_norms.len();
        let whole = upper.len() / BOUND_GROUP;
        let room = _mm256_set1_ps(SUM_ROOM);
        let per_norm = _mm256_set1_ps(b.per_norm);
        for g in 0..whole {
            let codes = b.codes.as_ptr().add(g * blocks * BOUND_GROUP);
            for half in 0..2 {
                let mut acc = _mm256_setzero_ps();
                for k in 0..blocks {
                    let p = codes.add(k * BOUND_GROUP + half * 8) as *const __m128i;
                    let c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(p)));
                    let h = _mm256_set1_ps(*b.block_norms.get_unchecked(k));
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(c, h));
                }
                let r = g * BOUND_GROUP + half * 8;
                let unit = _mm256_loadu_ps(b.unit.as_ptr().add(r));
                let weighted = _mm256_mul_ps(_mm256_mul_ps(acc, unit), room);
                let norm = _mm256_loadu_ps(b.norm.as_ptr().add(r));
                let term = _mm256_add_ps(weighted, _mm256_mul_ps(norm, per_norm));
                let est = _mm256_loadu_ps(b.estimate.as_ptr().add(r));
                _mm256_storeu_ps(upper.as_mut_ptr().add(r), _mm256_add_ps(est, term));
            }
        }
        bounds_scalar(b, upper, whole * BOUND_GROUP);
    }
}
