//! AVX2 dot products of the grid i-quants and the ternary types with Q8_K activations.
//!
//! Per 32-element sub-block the weights are built in a register from their grid entries (one
//! table load per 8 or 4 elements) with the signs applied as byte masks, multiplied with the
//! activations by `vpmaddubsw` (magnitudes times signed activations, at most 2·63·127 per pair,
//! so nothing saturates) and `vpmaddwd` with the 16-element scales. The block's integer sum is
//! exact, so each result is bit-identical to [`super::scalar`]'s twin, which combines blocks in
//! the same f32 order: `sum += isum · (d_x · d_y)`.
//!
//! # Safety
//! Every function requires AVX2 and rows of the lengths [`crate::vec_dot`] validated.

use crate::dot::GemmCall;
use std::arch::x86_64::*;

use crate::grid_quants::{iq1_m_d, BYTE_MASKS, KSIGN_MASKS};
use crate::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant_types::BlockQ8K;
use crate::{QuantType, QK_K};

#[inline(always)]
unsafe fn u16_at(p: *const u8) -> u32 {
    u32::from((p as *const u16).read_unaligned())
}

#[inline(always)]
unsafe fn u32_at(p: *const u8) -> u32 {
    (p as *const u32).read_unaligned()
}

#[inline(always)]
pub(in crate::dot) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Four 8-byte entries, entry 0 in the lowest lanes.
#[inline(always)]
unsafe fn entries64(e: [u64; 4]) -> __m256i {
    _mm256_set_epi64x(e[3] as i64, e[2] as i64, e[1] as i64, e[0] as i64)
}

/// `x` with the bytes selected by mask `m` (0xFF) negated.
#[inline(always)]
unsafe fn negate_masked(x: __m256i, m: __m256i) -> __m256i {
    _mm256_sub_epi8(_mm256_xor_si256(x, m), m)
}

/// The 16-element scales of a sub-block as 16 i16 lanes: `lo` for the first 16, `hi` after.
#[inline(always)]
unsafe fn scales(lo: u32, hi: u32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// A grid type's register form: weights and scales of sub-block `ib`, and the block's factor.
pub(super) trait GridSimd {
    const TY: QuantType;
    /// Each 16 elements of a sub-block have a scale of their own (otherwise the two are one).
    const HALVES: bool = false;
    /// The block's f32 factor `d` (see `grid_quants::IntBlock`).
    unsafe fn d(b: *const u8) -> f32;
    /// The 32 signed weights of sub-block `ib` and the scales of its first and second 16.
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32));
}

pub(super) struct Iq2Xxs;
impl GridSimd for Iq2Xxs {
    const TY: QuantType = QuantType::IQ2_XXS;
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b) * 0.125
    }
    #[inline(always)]
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32)) {
        let o = b.add(2 + 8 * ib);
        let aux = u32_at(o.add(4));
        let g = entries64(std::array::from_fn(|l| IQ2XXS_GRID[*o.add(l) as usize]));
        let m = entries64(std::array::from_fn(|l| {
            KSIGN_MASKS[((aux >> (7 * l)) & 127) as usize]
        }));
        let s = 2 * (aux >> 28) + 1;
        (negate_masked(g, m), (s, s))
    }
}

pub(super) struct Iq2Xs;
impl GridSimd for Iq2Xs {
    const TY: QuantType = QuantType::IQ2_XS;
    const HALVES: bool = true;
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b) * 0.125
    }
    #[inline(always)]
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32)) {
        let q: [u32; 4] = std::array::from_fn(|l| u16_at(b.add(2 + 8 * ib + 2 * l)));
        let g = entries64(std::array::from_fn(|l| IQ2XS_GRID[(q[l] & 511) as usize]));
        let m = entries64(std::array::from_fn(|l| KSIGN_MASKS[(q[l] >> 9) as usize]));
        let sc = u32::from(*b.add(66 + ib));
        (negate_masked(g, m), (2 * (sc & 15) + 1, 2 * (sc >> 4) + 1))
    }
}

pub(super) struct Iq2S;
impl GridSimd for Iq2S {
    const TY: QuantType = QuantType::IQ2_S;
    const HALVES: bool = true;
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b) * 0.125
    }
    #[inline(always)]
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32)) {
        let qh = *b.add(66 + ib) as usize;
        let g = entries64(std::array::from_fn(|l| {
            IQ2S_GRID[*b.add(2 + 4 * ib + l) as usize | ((qh >> (2 * l)) & 3) << 8]
        }));
        let m = entries64(std::array::from_fn(|l| {
            BYTE_MASKS[*b.add(34 + 4 * ib + l) as usize]
        }));
        let sc = u32::from(*b.add(74 + ib));
        (negate_masked(g, m), (2 * (sc & 15) + 1, 2 * (sc >> 4) + 1))
    }
}

pub(super) struct Iq3Xxs;
impl GridSimd for Iq3Xxs {
    const TY: QuantType = QuantType::IQ3_XXS;
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b) * 0.25
    }
    #[inline(always)]
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32)) {
        let q = b.add(2 + 8 * ib);
        let e = |k: usize| IQ3XXS_GRID[*q.add(k) as usize] as i32;
        let g = _mm256_set_epi32(e(7), e(6), e(5), e(4), e(3), e(2), e(1), e(0));
        let aux = u32_at(b.add(66 + 4 * ib));
        let m = entries64(std::array::from_fn(|l| {
            KSIGN_MASKS[((aux >> (7 * l)) & 127) as usize]
        }));
        let s = 2 * (aux >> 28) + 1;
        (negate_masked(g, m), (s, s))
    }
}

pub(super) struct Iq3S;
impl GridSimd for Iq3S {
    const TY: QuantType = QuantType::IQ3_S;
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b)
    }
    #[inline(always)]
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32)) {
        let qh = *b.add(66 + ib) as usize;
        let e = |k: usize| IQ3S_GRID[*b.add(2 + 8 * ib + k) as usize | ((qh >> k) & 1) << 8] as i32;
        let g = _mm256_set_epi32(e(7), e(6), e(5), e(4), e(3), e(2), e(1), e(0));
        let m = entries64(std::array::from_fn(|l| {
            BYTE_MASKS[*b.add(74 + 4 * ib + l) as usize]
        }));
        let sc = u32::from(*b.add(106 + ib / 2) >> (4 * (ib % 2))) & 15;
        let s = 2 * sc + 1;
        (negate_masked(g, m), (s, s))
    }
}

/// IQ1's `8 · grid + shift` from grid bytes of -1, 0, 1 and per-byte shifts of ±1.
#[inline(always)]
unsafe fn iq1_weights(g: __m256i, shift: __m256i) -> __m256i {
    // Byte-wise `<< 3`: the 16-bit shift carries three bits from each low byte into its
    // neighbour, which the mask clears.
    let g8 = _mm256_and_si256(_mm256_slli_epi16(g, 3), _mm256_set1_epi8(0xF8u8 as i8));
    _mm256_add_epi8(g8, shift)
}

/// The u64 of eight bytes of +1 or -1.
#[inline(always)]
fn shift64(minus: bool) -> u64 {
    if minus {
        u64::MAX
    } else {
        0x0101_0101_0101_0101
    }
}

pub(super) struct Iq1S;
impl GridSimd for Iq1S {
    const TY: QuantType = QuantType::IQ1_S;
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b) * 0.125
    }
    #[inline(always)]
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32)) {
        let qh = u16_at(b.add(34 + 2 * ib)) as usize;
        let g = entries64(std::array::from_fn(|l| {
            IQ1S_GRID[*b.add(2 + 4 * ib + l) as usize | ((qh >> (3 * l)) & 7) << 8]
        }));
        let shift = _mm256_set1_epi64x(shift64(qh & 0x8000 != 0) as i64);
        let s = 2 * ((qh as u32 >> 12) & 7) + 1;
        (iq1_weights(g, shift), (s, s))
    }
}

pub(super) struct Iq1M;
impl GridSimd for Iq1M {
    const TY: QuantType = QuantType::IQ1_M;
    const HALVES: bool = true;
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        iq1_m_d(std::slice::from_raw_parts(b, 56)) * 0.125
    }
    #[inline(always)]
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32)) {
        let nib = |l: usize| (*b.add(32 + 2 * ib + l / 2) >> (4 * (l % 2))) as usize & 15;
        let g = entries64(std::array::from_fn(|l| {
            IQ1S_GRID[*b.add(4 * ib + l) as usize | (nib(l) & 7) << 8]
        }));
        let shift = entries64(std::array::from_fn(|l| shift64(nib(l) & 8 != 0)));
        let sub_scale = |s: usize| (u16_at(b.add(48 + 2 * (s / 4))) >> (3 * (s % 4))) & 7;
        let (lo, hi) = (sub_scale(2 * ib), sub_scale(2 * ib + 1));
        (iq1_weights(g, shift), (2 * lo + 1, 2 * hi + 1))
    }
}

pub(super) struct Tq2;
impl GridSimd for Tq2 {
    const TY: QuantType = QuantType::TQ2_0;
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b.add(64))
    }
    #[inline(always)]
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32)) {
        let q = _mm256_loadu_si256(b.add(32 * (ib / 4)) as *const __m256i);
        let codes = _mm256_and_si256(
            _mm256_srl_epi16(q, _mm_cvtsi32_si128((2 * (ib % 4)) as i32)),
            _mm256_set1_epi8(3),
        );
        (_mm256_sub_epi8(codes, _mm256_set1_epi8(1)), (1, 1))
    }
}

/// Bytes of `q` times bytes of `c`, modulo 256 (AVX2 multiplies 16-bit lanes only: the even
/// and the odd bytes are multiplied apart).
#[inline(always)]
unsafe fn mul_bytes(q: __m256i, c: __m256i) -> __m256i {
    let low = _mm256_set1_epi16(0x00FF);
    let even = _mm256_and_si256(_mm256_mullo_epi16(q, _mm256_and_si256(c, low)), low);
    let odd = _mm256_mullo_epi16(_mm256_andnot_si256(low, q), _mm256_srli_epi16(c, 8));
    _mm256_or_si256(even, odd)
}

/// A TQ1_0 trit minus one from its fixed-point byte `v`: `((3 v) >> 8) - 1`, i.e. -1 below 86,
/// 0 below 171, else 1.
#[inline(always)]
unsafe fn trit(v: __m256i) -> __m256i {
    let ge = |k: u8| _mm256_cmpeq_epi8(_mm256_max_epu8(v, _mm256_set1_epi8(k as i8)), v);
    _mm256_sub_epi8(_mm256_sub_epi8(_mm256_set1_epi8(-1), ge(86)), ge(171))
}

pub(super) struct Tq1;
impl GridSimd for Tq1 {
    const TY: QuantType = QuantType::TQ1_0;
    #[inline(always)]
    unsafe fn d(b: *const u8) -> f32 {
        f16_at(b.add(52))
    }
    #[inline(always)]
    unsafe fn sub(b: *const u8, ib: usize) -> (__m256i, (u32, u32)) {
        const POW3: [i8; 5] = [1, 3, 9, 27, 81];
        // Elements 0..160: trit `ib` of qs[0..32]; 160..240: trits of qs[32..48], 16 a power;
        // 240..256: trits of qh[0..4], 4 a power.
        let (q, c) = if ib < 5 {
            (
                _mm256_loadu_si256(b as *const __m256i),
                _mm256_set1_epi8(POW3[ib]),
            )
        } else {
            let qs1 = _mm_loadu_si128(b.add(32) as *const __m128i);
            if ib < 7 {
                let n = 2 * (ib - 5);
                (
                    _mm256_broadcastsi128_si256(qs1),
                    _mm256_set_m128i(_mm_set1_epi8(POW3[n + 1]), _mm_set1_epi8(POW3[n])),
                )
            } else {
                let qh = _mm_set1_epi32(u32_at(b.add(48)) as i32);
                let pow = _mm_set_epi32(0x1b1b_1b1b, 0x0909_0909, 0x0303_0303, 0x0101_0101);
                (
                    _mm256_set_m128i(qh, qs1),
                    _mm256_set_m128i(pow, _mm_set1_epi8(81)),
                )
            }
        };
        (trit(mul_bytes(q, c)), (1, 1))
    }
}

/// `Σ scale · w · y` over 32 elements, added to eight i32 lanes.
#[inline(always)]
unsafe fn madd32(acc: __m256i, w: __m256i, sc: __m256i, y: *const u8) -> __m256i {
    madd32_magnitudes(acc, _mm256_sign_epi8(w, w), w, sc, y)
}

/// [`madd32`] with the weights' magnitudes `|w|` already made (a tile reuses them).
#[inline(always)]
unsafe fn madd32_magnitudes(
    acc: __m256i,
    magnitudes: __m256i,
    w: __m256i,
    sc: __m256i,
    y: *const u8,
) -> __m256i {
    let yv = _mm256_loadu_si256(y as *const __m256i);
    let p = _mm256_maddubs_epi16(magnitudes, _mm256_sign_epi8(yv, w));
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc))
}

#[inline(always)]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

#[inline(always)]
unsafe fn dot<T: GridSimd>(w: &[u8], a: &[u8], n: usize) -> f32 {
    let bb = T::TY.block_bytes();
    let mut sumf = 0.0f32;
    for i in 0..n / QK_K {
        let x = w.as_ptr().add(i * bb);
        let y = a.as_ptr().add(i * BlockQ8K::BYTES);
        let mut acc = _mm256_setzero_si256();
        for ib in 0..8 {
            let (wv, (lo, hi)) = T::sub(x, ib);
            acc = madd32(acc, wv, scales(lo, hi), y.add(BlockQ8K::QS + 32 * ib));
        }
        let dy = (y as *const f32).read_unaligned();
        sumf += hsum_epi32(acc) as f32 * (T::d(x) * dy);
    }
    sumf
}

macro_rules! grid_kernels {
    ($($name:ident => $t:ty;)*) => {$(
        #[doc = concat!("AVX2 kernel of `", stringify!($t), "` weights · Q8_K activations.")]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name(w: &[u8], a: &[u8], n: usize) -> f32 {
            dot::<$t>(w, a, n)
        }
    )*};
}

grid_kernels! {
    iq2_xxs_q8_k => Iq2Xxs;
    iq2_xs_q8_k => Iq2Xs;
    iq2_s_q8_k => Iq2S;
    iq3_xxs_q8_k => Iq3Xxs;
    iq3_s_q8_k => Iq3S;
    iq1_s_q8_k => Iq1S;
    iq1_m_q8_k => Iq1M;
    tq2_0_q8_k => Tq2;
    tq1_0_q8_k => Tq1;
}

/// Tokens whose sums a row keeps at a time in [`gemm`].
const GEMM_TOKENS: usize = 64;

/// Tiled: `out[t * ldo + r] = dot(row r, act row t)` for `r < nr` (rows `ldw` bytes apart at
/// `w`) and `t < nt` (Q8_K activation rows `lda` bytes apart at `a`). Each row's blocks are
/// built into registers once (what [`dot`] builds per pair) and met by up to
/// [`GEMM_TOKENS`] tokens, with [`dot`]'s arithmetic: the same exact integer sums and the same
/// f32 steps, so every output has the single-pair kernel's bits.
#[inline(always)]
unsafe fn gemm<T: GridSimd>(c: &GemmCall) {
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
    let (bb, nb) = (T::TY.block_bytes(), n / QK_K);
    let mut sums = [0f32; GEMM_TOKENS];
    let mut t0 = 0;
    while t0 < nt {
        let tn = GEMM_TOKENS.min(nt - t0);
        for r in 0..nr {
            let row = w.add(r * ldw);
            sums[..tn].fill(0.0);
            for i in 0..nb {
                let x = row.add(i * bb);
                let mut weights = [_mm256_setzero_si256(); 8];
                let mut magnitudes = [_mm256_setzero_si256(); 8];
                let mut sub_scales = [_mm256_setzero_si256(); 8];
                for ib in 0..8 {
                    let (wv, (lo, hi)) = T::sub(x, ib);
                    weights[ib] = wv;
                    magnitudes[ib] = _mm256_sign_epi8(wv, wv);
                    sub_scales[ib] = scales(lo, hi);
                }
                let d = T::d(x);
                // Four tokens at a time: four independent sums per weight register, their
                // exact totals reduced together, and the four f32 steps in one register (the
                // same IEEE operations lane by lane: `sum + isum · (d · dy)`).
                let quads = tn / 4 * 4;
                for t in (0..quads).step_by(4) {
                    let y: [*const u8; 4] =
                        std::array::from_fn(|k| a.add((t0 + t + k) * lda + i * BlockQ8K::BYTES));
                    let mut acc = [_mm256_setzero_si256(); 4];
                    for ib in 0..8 {
                        for k in 0..4 {
                            acc[k] = madd32_magnitudes(
                                acc[k],
                                magnitudes[ib],
                                weights[ib],
                                sub_scales[ib],
                                y[k].add(BlockQ8K::QS + 32 * ib),
                            );
                        }
                    }
                    let h = _mm256_hadd_epi32(
                        _mm256_hadd_epi32(acc[0], acc[1]),
                        _mm256_hadd_epi32(acc[2], acc[3]),
                    );
                    let isums =
                        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                    let dy = _mm_set_ps(
                        (y[3] as *const f32).read_unaligned(),
                        (y[2] as *const f32).read_unaligned(),
                        (y[1] as *const f32).read_unaligned(),
                        (y[0] as *const f32).read_unaligned(),
                    );
                    let scale = _mm_mul_ps(_mm_set1_ps(d), dy);
                    let at = sums.as_mut_ptr().add(t);
                    let step = _mm_mul_ps(_mm_cvtepi32_ps(isums), scale);
                    _mm_storeu_ps(at, _mm_add_ps(_mm_loadu_ps(at), step));
                }
                for (t, sum) in sums.iter_mut().enumerate().take(tn).skip(quads) {
                    let y = a.add((t0 + t) * lda + i * BlockQ8K::BYTES);
                    let mut acc = _mm256_setzero_si256();
                    for ib in 0..8 {
                        let at = y.add(BlockQ8K::QS + 32 * ib);
                        acc =
                            madd32_magnitudes(acc, magnitudes[ib], weights[ib], sub_scales[ib], at);
                    }
                    let dy = (y as *const f32).read_unaligned();
                    *sum += hsum_epi32(acc) as f32 * (d * dy);
                }
            }
            for (t, &sum) in sums.iter().enumerate().take(tn) {
                *out.add((t0 + t) * ldo + r) = sum;
            }
        }
        t0 += tn;
    }
}

macro_rules! grid_gemm_kernels {
    ($($name:ident => $t:ty;)*) => {$(
        gemm_entry!(
            #[doc = concat!("Tiled AVX2 kernel of `", stringify!($t), "` rows · Q8_K activations.")]
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(crate) $name,
            gemm::<$t>
        );
    )*};
}

grid_gemm_kernels! {
    gemm_iq2_xxs => Iq2Xxs;
    gemm_iq2_xs => Iq2Xs;
    gemm_iq2_s => Iq2S;
    gemm_iq3_xxs => Iq3Xxs;
    gemm_iq3_s => Iq3S;
    gemm_iq1_s => Iq1S;
    gemm_iq1_m => Iq1M;
    gemm_tq2_0 => Tq2;
    gemm_tq1_0 => Tq1;
}
