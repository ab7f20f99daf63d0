//! Dequantizing KV-cache rows (Q8_0, Q4_0 blocks) into f32. Attention over a quantized cache
//! reads every key and value through these, so they are vectorized (AVX2, chosen at run time)
//! with scalar twins. Bit-exact either way: each element is a small integer times the block's f16
//! scale, one correctly rounded f32 product.

use half::f16;

const Q8_0_BYTES: usize = 34;
const Q4_0_BYTES: usize = 18;

/// Q8_0 blocks (an f16 scale, 32 i8) into f32: `out` gets 32 values per whole block of `src`.
pub fn dequantize_q8_0_rows(src: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2_fma_f16c() {
        // SAFETY: the features are checked; the kernel touches whole blocks of both slices only.
        return unsafe { avx2::q8_0(src, out) };
    }
    dequantize_q8_0_rows_scalar(src, out)
}

/// Scalar twin of [`dequantize_q8_0_rows`].
pub fn dequantize_q8_0_rows_scalar(src: &[u8], out: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_0_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        for (y, &q) in y.iter_mut().zip(&b[2..34]) {
            *y = f32::from(q as i8) * d;
        }
    }
}

/// Q4_0 blocks (an f16 scale, 16 bytes of nibbles offset by 8: low nibbles the first 16
/// elements, high the last 16) into f32.
pub fn dequantize_q4_0_rows(src: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2_fma_f16c() {
        // SAFETY: as above.
        return unsafe { avx2::q4_0(src, out) };
    }
    dequantize_q4_0_rows_scalar(src, out)
}

/// Scalar twin of [`dequantize_q4_0_rows`].
pub fn dequantize_q4_0_rows_scalar(src: &[u8], out: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_0_BYTES).zip(out.chunks_exact_mut(32)) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        let (lo, hi) = y.split_at_mut(16);
        for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&b[2..18]) {
            *l = f32::from((q & 0x0F) as i8 - 8) * d;
            *h = f32::from((q >> 4) as i8 - 8) * d;
        }
    }
}

/// f16 cache rows into f32 (`out` gets `src.len()` values): exact, whatever the path.
pub fn widen_f16(src: &[f16], out: &mut [f32]) {
    assert!(out.len() >= src.len(), "widen_f16: output too short");
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2_fma_f16c() {
        // SAFETY: the CPU has F16C; lengths checked above.
        return unsafe { avx2::widen_f16(src, out) };
    }
    widen_f16_scalar(src, out)
}

/// Scalar twin of [`widen_f16`].
pub fn widen_f16_scalar(src: &[f16], out: &mut [f32]) {
    out.iter_mut().zip(src).for_each(|(o, x)| *o = x.to_f32());
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use half::f16;

    /// Eight i8 at `p` times `d`, stored at `y`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn eight(bytes: __m128i, d: __m256, y: *mut f32) {
        let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
        _mm256_storeu_ps(y, _mm256_mul_ps(f, d));
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen_f16(src: &[f16], out: &mut [f32]) {
        let (ps, po) = (src.as_ptr() as *const __m128i, out.as_mut_ptr());
        let body = src.len() / 8 * 8;
        for i in (0..body).step_by(8) {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(ps.byte_add(2 * i)));
            _mm256_storeu_ps(po.add(i), x);
        }
        super::widen_f16_scalar(&src[body..], &mut out[body..]);
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0(src: &[u8], out: &mut [f32]) {
        for (b, y) in src
            .chunks_exact(super::Q8_0_BYTES)
            .zip(out.chunks_exact_mut(32))
        {
            let d = _mm256_set1_ps(f16::from_le_bytes([b[0], b[1]]).to_f32());
            let q = b.as_ptr().add(2);
            let y = y.as_mut_ptr();
            for k in 0..4 {
                let bytes = _mm_loadl_epi64(q.add(8 * k) as *const __m128i);
                eight(bytes, d, y.add(8 * k));
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_0(src: &[u8], out: &mut [f32]) {
        let mask = _mm_set1_epi8(0x0F);
        let eight_i8 = _mm_set1_epi8(8);
        for (b, y) in src
            .chunks_exact(super::Q4_0_BYTES)
            .zip(out.chunks_exact_mut(32))
        {
            let d = _mm256_set1_ps(f16::from_le_bytes([b[0], b[1]]).to_f32());
            let qs = _mm_loadu_si128(b.as_ptr().add(2) as *const __m128i);
            let lo = _mm_sub_epi8(_mm_and_si128(qs, mask), eight_i8);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), mask), eight_i8);
            let y = y.as_mut_ptr();
            eight(lo, d, y);
            eight(_mm_srli_si128(lo, 8), d, y.add(8));
            eight(hi, d, y.add(16));
            eight(_mm_srli_si128(hi, 8), d, y.add(24));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::QuantType;

    /// Random blocks with every scale and code pattern: the SIMD and scalar forms agree bit for
    /// bit, and both equal the reference dequantizer.
    #[test]
    fn kv_dequantizers_are_bit_exact() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for (ty, bytes, simd, scalar) in [
            (
                QuantType::Q8_0,
                Q8_0_BYTES,
                dequantize_q8_0_rows as fn(&[u8], &mut [f32]),
                dequantize_q8_0_rows_scalar as fn(&[u8], &mut [f32]),
            ),
            (
                QuantType::Q4_0,
                Q4_0_BYTES,
                dequantize_q4_0_rows,
                dequantize_q4_0_rows_scalar,
            ),
        ] {
            for blocks in [1usize, 2, 7, 16] {
                let mut src: Vec<u8> = (0..blocks * bytes).map(|_| next() as u8).collect();
                for b in 0..blocks {
                    // Finite scales, subnormal to large.
                    let d =
                        f16::from_f32(((next() % 2000) as f32 - 1000.0) * 1e-3 * (b as f32 + 1.0));
                    src[b * bytes..b * bytes + 2].copy_from_slice(&d.to_le_bytes());
                }
                let (mut a, mut s, mut r) = (
                    vec![0f32; blocks * 32],
                    vec![0f32; blocks * 32],
                    vec![0f32; blocks * 32],
                );
                simd(&src, &mut a);
                scalar(&src, &mut s);
                crate::dequantize_row(ty, &src, &mut r).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a), bits(&s), "{ty:?} x{blocks}: SIMD against scalar");
                assert_eq!(
                    bits(&s),
                    bits(&r),
                    "{ty:?} x{blocks}: against the reference"
                );
            }
        }
    }

    /// Every f16 bit pattern (NaNs, infinities, subnormals) widens to the scalar conversion's
    /// bits, at every length and offset the 8-wide body and the tail split.
    #[test]
    fn widening_f16_is_exact() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut got = vec![0f32; all.len()];
        let mut want = got.clone();
        widen_f16(&all, &mut got);
        widen_f16_scalar(&all, &mut want);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
        for len in 0..20 {
            let (mut a, mut b) = (vec![0f32; len], vec![0f32; len]);
            widen_f16(&all[3..3 + len], &mut a);
            widen_f16_scalar(&all[3..3 + len], &mut b);
            assert_eq!(bits(&a), bits(&b), "len {len}");
        }
    }
}
