//! AVX2 dot products of IQ4_XS (the table-indexed 4-bit type with 256-element super-blocks; IQ4_NL
//! and MXFP4 are `blocks_q32/` types) with 8-bit
//! activations. A block's 16 bytes of indices become 32 signed levels with one table lookup per
//! half (`pshufb` on the 16-entry table); the products with the activations are formed exactly in
//! integers (`maddubs` on |w| and sign(w)·a, widened by `madd`), and each block's integer sum is
//! scaled and accumulated in f32 in the scalar twin's order, so these give its bits exactly.
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA and F16C and slices at least as long as the
//! block count implied by `n` (validated by the public entry points).

use crate::dot::GemmCall;
use std::arch::x86_64::*;

use super::blocks_float::f16v;
use crate::dequant::{iq4_xs_scale, IQ4_LEVELS};
use crate::quant_types::BlockQ8K;
use crate::QK_K;

/// The 32 signed levels of 16 index bytes at `qs` (low nibbles first, as the elements are).
#[inline(always)]
unsafe fn levels(qs: *const u8, table: __m128i) -> __m256i {
    let q = _mm_loadu_si128(qs as *const __m128i);
    let mask = _mm_set1_epi8(0x0F);
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, mask));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), mask));
    _mm256_set_m128i(hi, lo)
}

#[inline(always)]
unsafe fn table(levels: &[i8; 16]) -> __m128i {
    _mm_loadu_si128(levels.as_ptr() as *const __m128i)
}

/// One IQ4_XS super-block (at `x`) against `C` tokens' Q8_K blocks (at `ys`): each token's
/// integer sum `Σ_ib scale_ib · Σ w·a`, exact (so in any order). The 32 levels of a sub-block
/// are looked up once for all the tokens; the sub-block scale multiplies the i16 pair sums
/// (`madd`, |w·a pair| ≤ 2·127², |scale| ≤ 32) and eight i32 lanes carry the sum.
#[inline(always)]
unsafe fn iq4_xs_block<const C: usize>(x: *const u8, ys: [*const u8; C], t: __m128i) -> [i32; C] {
    let mut acc = [_mm256_setzero_si256(); C];
    for ib in 0..8 {
        let wq = levels(x.add(8 + 16 * ib), t);
        let wabs = _mm256_sign_epi8(wq, wq);
        let scale = _mm256_set1_epi16(iq4_xs_scale_at(x, ib) as i16);
        for c in 0..C {
            let aq = _mm256_loadu_si256(ys[c].add(BlockQ8K::QS + 32 * ib) as *const __m256i);
            let p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(aq, wq));
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(p, scale));
        }
    }
    let mut sums = [0i32; C];
    for c in 0..C {
        let s = acc[c];
        let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        sums[c] = _mm_cvtsi128_si32(s);
    }
    sums
}

/// [`iq4_xs_scale`] from a raw super-block pointer.
#[inline(always)]
unsafe fn iq4_xs_scale_at(x: *const u8, ib: usize) -> i32 {
    iq4_xs_scale(std::slice::from_raw_parts(x, 136), ib)
}

/// `C` tokens' dots with one IQ4_XS row of `n` elements: per super-block, the exact integer sum
/// scaled as the scalar twin does (`sumf += sumi · (d_w · d_y)`), in super-block order.
#[inline(always)]
unsafe fn iq4_xs_row<const C: usize>(w: *const u8, ys: [*const u8; C], n: usize) -> [f32; C] {
    let t = table(&IQ4_LEVELS);
    let mut sumf = [0.0f32; C];
    for i in 0..n / QK_K {
        let x = w.add(i * 136);
        let yb: [*const u8; C] = std::array::from_fn(|c| ys[c].add(i * BlockQ8K::BYTES));
        let sumi = iq4_xs_block::<C>(x, yb, t);
        let dx = f16v(x);
        for c in 0..C {
            let dy = f32::from_le_bytes(*(yb[c] as *const [u8; 4]));
            sumf[c] += sumi[c] as f32 * (dx * dy);
        }
    }
    sumf
}

/// IQ4_XS weights · Q8_K activations.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn iq4_xs_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    iq4_xs_row::<1>(w.as_ptr(), [a.as_ptr()], n)[0]
}

/// Tokens whose dots with an IQ4_XS row are formed together (the row's levels looked up once).
const IQ4_XS_TOKENS: usize = 8;

/// The tiled IQ4_XS product (a [`GemmKernel`](super::GemmKernel)): every (row, token) value is
/// [`iq4_xs_q8_k`]'s, bit for bit; a row's levels are looked up once per four tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm_iq4_xs(c: &GemmCall) {
    let GemmCall {
        w,
        ldw,
        a,
        lda,
        n,
        nr,
        nt,
        out,
        ldo,
    } = *c;
    for r in 0..nr {
        let row = w.add(r * ldw);
        let mut t0 = 0;
        while t0 + IQ4_XS_TOKENS <= nt {
            let ys: [*const u8; IQ4_XS_TOKENS] = std::array::from_fn(|c| a.add((t0 + c) * lda));
            let v = iq4_xs_row::<IQ4_XS_TOKENS>(row, ys, n);
            for (c, &v) in v.iter().enumerate() {
                *out.add((t0 + c) * ldo + r) = v;
            }
            t0 += IQ4_XS_TOKENS;
        }
        for t in t0..nt {
            *out.add(t * ldo + r) = iq4_xs_row::<1>(row, [a.add(t * lda)], n)[0];
        }
    }
}
