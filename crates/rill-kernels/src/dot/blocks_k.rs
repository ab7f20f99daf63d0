//! Register-tiled AVX2 kernels for Q4_K and Q6_K weights with Q8_K activations (256-element
//! super-blocks), computing an R × C tile of outputs (R weight rows × C activation rows) per
//! call, and the single-pair [`vec_dot`](crate::vec_dot) kernels as the 1 × 1 case of the same
//! code.
//!
//! # Canonical arithmetic (what makes the results batch invariant)
//!
//! Every (row, token) pair is computed with exactly the same sequence of operations whatever the
//! tile shape, so its value does not depend on which tile it lands in, on the batch size or on
//! the thread split:
//!
//! * per super-block, the 256 scaled integer products are summed into 8 i32 lanes (lane `l` =
//!   elements `4l..4l+4` of each 32-element chunk, sub-block scales applied; exact) and converted
//!   to f32;
//! * `acc = fma(dy · dx, q, acc)` into one 8-lane accumulator per pair, in super-block order,
//!   with `dy · dx` an f32 product;
//! * Q4_K: the min term `summ += (dy · dmin) · Σ_j min_j · (bsum_2j + bsum_2j+1)` (exact integer
//!   sum, then an f32 multiply and an f32 add per super-block, in order);
//! * the result is `hsum(acc)` (minus `summ` for Q4_K), with a fixed reduction tree.
//!
//! [`crate::dot::twins`] reproduces this bit for bit in portable code.
//!
//! Q4_K's whole 8-token tiles run in 512-bit registers where the CPU has AVX512-F/BW
//! ([`gemm_q4_k_wide`]): two tokens' lanes interleaved per register, the same integers, the same
//! per-lane FMA, the same min terms.
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA and F16C, and pointers valid for the rows,
//! super-blocks and outputs they are told to touch.

use super::blocks_float::{f16v, f32v};
use super::blocks_q32::{hsum4_paired, hsum_ps, idx, DUP, PAIR, Z64};
use crate::dot::GemmCall;
use crate::quant_types::BlockQ8K;
use crate::QK_K;
use std::arch::x86_64::*;

/// Activation (Q8_K) super-block bytes.
const AB: usize = BlockQ8K::BYTES;

#[inline(always)]
unsafe fn loadu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn loadu128(p: *const u8) -> __m128i {
    _mm_loadu_si128(p as *const __m128i)
}

/// Sum of the four i32 lanes (exact, any order).
#[inline(always)]
unsafe fn hsum_epi32(v: __m128i) -> i32 {
    let s = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

/// A 256-element super-block weight format with its R × C microkernel.
pub(crate) trait KQuant {
    /// Weight super-block bytes.
    const WB: usize;
    /// `out[c * ldo + r] = dot(w row r, act row c)` over `nb` super-blocks, row `r` at
    /// `w + r * ldw`, activation row `c` at `a + c * lda`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn micro<const R: usize, const C: usize>(
        w: *const u8,
        ldw: usize,
        a: *const u8,
        lda: usize,
        nb: usize,
        out: *mut f32,
        ldo: usize,
    );
}

pub(crate) struct Q4K;
pub(crate) struct Q6K;

/// Sub-block scales broadcast for `madd`, laid out in memory: LLVM otherwise keeps them in
/// registers and runs out of them in the larger tiles.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Bcast([__m256i; 8]);

impl KQuant for Q4K {
    const WB: usize = 144;

    #[inline(always)]
    unsafe fn micro<const R: usize, const C: usize>(
        w: *const u8,
        ldw: usize,
        a: *const u8,
        lda: usize,
        nb: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut summ = [[0f32; C]; R];
        let mut scv = [Bcast([_mm256_setzero_si256(); 8]); R];
        for i in 0..nb {
            if R == RD && C == 1 {
                // Decode streams the matrix once: fetch the rows two tiles ahead.
                super::blocks_q32::prefetch_ahead(w, 2 * R * ldw + i * R * Self::WB, R * Self::WB);
            }
            let mut dy = [0f32; C];
            let mut bsp = [_mm_setzero_si128(); C];
            for c in 0..C {
                let y = a.add(c * lda + i * AB);
                dy[c] = f32v(y);
                let bs = y.add(BlockQ8K::BSUMS);
                // Pair sums bsum[2j] + bsum[2j + 1], j = 0..8 (they fit in i16).
                bsp[c] = _mm_hadd_epi16(loadu128(bs), loadu128(bs.add(16)));
            }
            let mut d = [[0f32; C]; R];
            for r in 0..R {
                let x = w.add(r * ldw + i * Self::WB);
                let dx = f16v(x);
                let dmx = f16v(x.add(2));
                let mins = q4k_scales(x.add(4), &mut scv[r].0);
                for c in 0..C {
                    d[r][c] = dy[c] * dx;
                    let dmin = dy[c] * dmx;
                    let m = hsum_epi32(_mm_madd_epi16(mins, bsp[c]));
                    summ[r][c] += dmin * m as f32;
                }
            }
            let scp: *const Bcast = std::hint::black_box(scv.as_ptr());
            let mut sumi = [[_mm256_setzero_si256(); C]; R];
            for j in 0..4 {
                for (r, sumi_r) in sumi.iter_mut().enumerate() {
                    let bits = loadu(w.add(r * ldw + i * Self::WB + 16 + 32 * j));
                    let ql = _mm256_and_si256(bits, m4);
                    let qh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                    let s = &(*scp.add(r)).0;
                    for (c, sumi_rc) in sumi_r.iter_mut().enumerate() {
                        let q8 = a.add(c * lda + i * AB + BlockQ8K::QS + 64 * j);
                        let pl = _mm256_maddubs_epi16(ql, loadu(q8));
                        let ph = _mm256_maddubs_epi16(qh, loadu(q8.add(32)));
                        let pl = _mm256_madd_epi16(s[2 * j], pl);
                        let ph = _mm256_madd_epi16(s[2 * j + 1], ph);
                        *sumi_rc = _mm256_add_epi32(*sumi_rc, _mm256_add_epi32(pl, ph));
                    }
                }
            }
            fma_tile(&mut acc, &d, &sumi);
        }
        for r in 0..R {
            for c in 0..C {
                *out.add(c * ldo + r) = hsum_ps(acc[r][c]) - summ[r][c];
            }
        }
    }
}

impl KQuant for Q6K {
    const WB: usize = 210;

    /// The -32 offset is applied as `maddubs(q, y) - maddubs(32, y)` so the 6-bit quants can
    /// stay unsigned for `maddubs`; the second term depends on the token only and is formed once
    /// per tile and super-block (inline in the one-token tiles). Both are exact in i16.
    #[inline(always)]
    unsafe fn micro<const R: usize, const C: usize>(
        w: *const u8,
        ldw: usize,
        a: *const u8,
        lda: usize,
        nb: usize,
        out: *mut f32,
        ldo: usize,
    ) {
        let m32 = _mm256_set1_epi8(32);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut scv = [Bcast([_mm256_setzero_si256(); 8]); R];
        let mut off = [Bcast([_mm256_setzero_si256(); 8]); C];
        for i in 0..nb {
            if R == RD && C == 1 {
                // Decode streams the matrix once: fetch the rows two tiles ahead.
                super::blocks_q32::prefetch_ahead(w, 2 * R * ldw + i * R * Self::WB, R * Self::WB);
            }
            let mut dy = [0f32; C];
            for (c, (dy_c, off_c)) in dy.iter_mut().zip(off.iter_mut()).enumerate() {
                let y = a.add(c * lda + i * AB);
                *dy_c = f32v(y);
                let q8 = y.add(BlockQ8K::QS);
                if C > 1 {
                    for (k, v) in off_c.0.iter_mut().enumerate() {
                        *v = _mm256_maddubs_epi16(m32, loadu(q8.add(32 * k)));
                    }
                }
            }
            let mut d = [[0f32; C]; R];
            for (r, (d_r, s)) in d.iter_mut().zip(scv.iter_mut()).enumerate() {
                let x = w.add(r * ldw + i * Self::WB);
                let dx = f16v(x.add(208));
                for (d_rc, &dy_c) in d_r.iter_mut().zip(&dy) {
                    *d_rc = dy_c * dx;
                }
                q6_scales(x.add(192), &mut s.0);
            }
            let scp: *const Bcast = std::hint::black_box(scv.as_ptr());
            let offp: *const Bcast = std::hint::black_box(off.as_ptr());
            let mut sumi = [[_mm256_setzero_si256(); C]; R];
            for nn in 0..2 {
                let q8 = a.add(i * AB + BlockQ8K::QS + 128 * nn);
                let x = w.add(i * Self::WB);
                let (scp, offp) = (scp.cast::<__m256i>(), offp.cast::<__m256i>());
                q6_step::<R, C, 0>(x, ldw, q8, lda, nn, scp, offp, &mut sumi);
                q6_step::<R, C, 1>(x, ldw, q8, lda, nn, scp, offp, &mut sumi);
                q6_step::<R, C, 2>(x, ldw, q8, lda, nn, scp, offp, &mut sumi);
                q6_step::<R, C, 3>(x, ldw, q8, lda, nn, scp, offp, &mut sumi);
            }
            fma_tile(&mut acc, &d, &sumi);
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for (c, &acc_rc) in acc_r.iter().enumerate() {
                *out.add(c * ldo + r) = hsum_ps(acc_rc);
            }
        }
    }
}

/// `acc[r][c] = fma(d[r][c], f32(sumi[r][c]), acc[r][c])`. The accumulators go through an
/// opaque pointer so that they live in memory between super-blocks: kept in registers, they
/// push the integer sums of the larger tiles out into spills inside the inner loop.
#[inline(always)]
unsafe fn fma_tile<const R: usize, const C: usize>(
    acc: &mut [[__m256; C]; R],
    d: &[[f32; C]; R],
    sumi: &[[__m256i; C]; R],
) {
    let acc = &mut *std::hint::black_box(acc as *mut [[__m256; C]; R]);
    for ((acc_r, d_r), sumi_r) in acc.iter_mut().zip(d).zip(sumi) {
        for ((acc_rc, &d_rc), &sumi_rc) in acc_r.iter_mut().zip(d_r).zip(sumi_r) {
            *acc_rc = _mm256_fmadd_ps(_mm256_set1_ps(d_rc), _mm256_cvtepi32_ps(sumi_rc), *acc_rc);
        }
    }
}

/// The 6-bit scales and mins of a Q4_K super-block (12 bytes at `p`): scale `j` broadcast as
/// i16 into `sc[j]`, and the 8 mins returned as i16 lanes. Same values as
/// [`scale_min_k4`](crate::dequant::scale_min_k4), unpacked with llama.cpp's word masks.
#[inline(always)]
unsafe fn q4k_scales(p: *const u8, sc: &mut [__m256i; 8]) -> __m128i {
    let v = q4k_scale_bytes(p);
    let sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v));
    for (j, s) in sc.iter_mut().enumerate() {
        let m = (((2 * j + 1) << 8) | (2 * j)) as i16;
        *s = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(m));
    }
    _mm_cvtepu8_epi16(_mm_unpackhi_epi64(v, v))
}

/// [`q4k_scales`] with the scales broadcast over 512-bit registers.
#[inline(always)]
unsafe fn q4k_scales_wide(p: *const u8, sc: &mut [__m512i; 8]) -> __m128i {
    let v = q4k_scale_bytes(p);
    let sc16 = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(v));
    for (j, s) in sc.iter_mut().enumerate() {
        let m = (((2 * j + 1) << 8) | (2 * j)) as i16;
        *s = _mm512_shuffle_epi8(sc16, _mm512_set1_epi16(m));
    }
    _mm_cvtepu8_epi16(_mm_unpackhi_epi64(v, v))
}

/// The 8 scales (bytes 0..8) and 8 mins (bytes 8..16) of a Q4_K super-block, 6 bits each.
#[inline(always)]
unsafe fn q4k_scale_bytes(p: *const u8) -> __m128i {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u = p as *const u32;
    let (u0, u1, u2) = (
        u.read_unaligned(),
        u.add(1).read_unaligned(),
        u.add(2).read_unaligned(),
    );
    // Bytes 0..8: scales 0..8; bytes 8..16: mins 0..8.
    let scales = u0 & KMASK1;
    let scales_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let mins = u1 & KMASK1;
    let mins_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    _mm_set_epi32(mins_hi as i32, mins as i32, scales_hi as i32, scales as i32)
}

/// The 16 i8 scales of a Q6_K super-block (at `p`) as 8 pair vectors: `sc[p]` holds scale `2p` in its low 16 bytes and
/// `2p + 1` in its high 16, as i16.
#[inline(always)]
unsafe fn q6_scales(p: *const u8, sc: &mut [__m256i; 8]) {
    let s16 = _mm256_cvtepi8_epi16(loadu128(p));
    let halves = [
        _mm256_permute2x128_si256(s16, s16, 0x00),
        _mm256_permute2x128_si256(s16, s16, 0x11),
    ];
    for (q, s) in sc.iter_mut().enumerate() {
        let k = 4 * (q % 4) as i16;
        let lo = _mm_set1_epi16(((k + 1) << 8) | k);
        let hi = _mm_set1_epi16(((k + 3) << 8) | (k + 2));
        *s = _mm256_shuffle_epi8(halves[q / 4], _mm256_set_m128i(hi, lo));
    }
}

/// Quants `32k..32k + 32` of the `nn`-th half of the Q6_K super-block at `x`, in 0..64.
#[inline(always)]
unsafe fn q6_unpack<const K: usize>(x: *const u8, nn: usize) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(3);
    let qh = loadu(x.add(128 + 32 * nn));
    let l = loadu(x.add(64 * nn + 32 * (K & 1)));
    let lo = if K < 2 {
        _mm256_and_si256(l, m4)
    } else {
        _mm256_and_si256(_mm256_srli_epi16(l, 4), m4)
    };
    let h = match K {
        0 => _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
        1 => _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_slli_epi16(m2, 2)), 2),
        2 => _mm256_and_si256(qh, _mm256_slli_epi16(m2, 4)),
        _ => _mm256_srli_epi16(_mm256_and_si256(qh, _mm256_slli_epi16(m2, 6)), 2),
    };
    _mm256_or_si256(lo, h)
}

/// One 32-element chunk (`K` of half `nn`) of a Q6_K tile: `sumi[r][c] += madd(scale, q · y -
/// 32 · y)`, with the broadcast scales at `scp[8r + 4nn + K]` and the `32 · y` pair sums at
/// `offp[8c + 4nn + K]` (formed here when there is a single token, as nothing shares them).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn q6_step<const R: usize, const C: usize, const K: usize>(
    x: *const u8,
    ldw: usize,
    q8: *const u8,
    lda: usize,
    nn: usize,
    scp: *const __m256i,
    offp: *const __m256i,
    sumi: &mut [[__m256i; C]; R],
) {
    for (r, sumi_r) in sumi.iter_mut().enumerate() {
        let qk = q6_unpack::<K>(x.add(r * ldw), nn);
        let s = *scp.add(8 * r + 4 * nn + K);
        for (c, sumi_rc) in sumi_r.iter_mut().enumerate() {
            let yk = loadu(q8.add(c * lda + 32 * K));
            let o = if C == 1 {
                _mm256_maddubs_epi16(_mm256_set1_epi8(32), yk)
            } else {
                *offp.add(8 * c + 4 * nn + K)
            };
            let p = _mm256_sub_epi16(_mm256_maddubs_epi16(qk, yk), o);
            *sumi_rc = _mm256_add_epi32(*sumi_rc, _mm256_madd_epi16(s, p));
        }
    }
}

/// Token pairs per 512-bit Q4_K tile.
const PK: usize = 4;

/// Lays out the Q8_K activations of tokens `0..2 * pairs` (rows `lda` bytes apart, `nb`
/// super-blocks) for [`q4k_micro_wide`]: the 32 quants `32k..32k + 32` of pair `p`'s
/// super-block `i` are the unit `(p * nb + i) * 8 + k` of `dst`, the two tokens' 4-byte groups
/// interleaved (token `h`'s group `g` at position `2g + h`).
#[inline(always)]
unsafe fn pair_q8k(a: *const u8, lda: usize, pairs: usize, nb: usize, dst: *mut Z64) {
    let pair = idx(PAIR);
    for p in 0..pairs {
        let a0 = a.add(2 * p * lda + BlockQ8K::QS);
        let a1 = a0.add(lda);
        for i in 0..nb {
            for k in 0..8 {
                let off = i * AB + 32 * k;
                let y0 = _mm512_castsi256_si512(loadu(a0.add(off)));
                let y1 = _mm512_castsi256_si512(loadu(a1.add(off)));
                let v = _mm512_permutex2var_epi32(y0, pair, y1);
                _mm512_store_si512(dst.add((p * nb + i) * 8 + k).cast(), v);
            }
        }
    }
}

/// The Q4_K R × 2P tile in 512-bit registers: the same values, bit for bit, as
/// [`Q4K::micro`]. Each register holds a pair's two tokens' 8 lanes interleaved, so the integer
/// sums, their conversion and the FMA serve two tokens at once; the min terms stay per token,
/// as there. Activations come paired by [`pair_q8k`] (`ya`) and are read as they are (`a`) for
/// their scales and block sums.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
#[allow(clippy::needless_range_loop)] // tokens, pairs and rows index several arrays at once
unsafe fn q4k_micro_wide<const R: usize, const P: usize>(
    w: *const u8,
    ldw: usize,
    a: *const u8,
    lda: usize,
    ya: *const Z64,
    nb: usize,
    out: *mut f32,
    ldo: usize,
) {
    const { assert!(P <= 4) };
    let (m4, dup) = (_mm256_set1_epi8(0x0F), idx(DUP));
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    let mut summ = [[[0f32; 2]; P]; R];
    let mut scv = [[_mm512_setzero_si512(); 8]; R];
    for i in 0..nb {
        let mut dy = [[0f32; 2]; P];
        let mut bsp = [[_mm_setzero_si128(); 2]; P];
        for p in 0..P {
            for h in 0..2 {
                let y = a.add((2 * p + h) * lda + i * AB);
                dy[p][h] = f32v(y);
                let bs = y.add(BlockQ8K::BSUMS);
                bsp[p][h] = _mm_hadd_epi16(loadu128(bs), loadu128(bs.add(16)));
            }
        }
        let mut d = [[0f64; P]; R];
        for r in 0..R {
            let x = w.add(r * ldw + i * Q4K::WB);
            let dx = f16v(x);
            let dmx = f16v(x.add(2));
            let mins = q4k_scales_wide(x.add(4), &mut scv[r]);
            for p in 0..P {
                let mut pair = [0f32; 2];
                for h in 0..2 {
                    pair[h] = dy[p][h] * dx;
                    let dmin = dy[p][h] * dmx;
                    let m = hsum_epi32(_mm_madd_epi16(mins, bsp[p][h]));
                    summ[r][p][h] += dmin * m as f32;
                }
                d[r][p] = f64::from_bits(
                    (u64::from(pair[1].to_bits()) << 32) | u64::from(pair[0].to_bits()),
                );
            }
        }
        let scp: *const [__m512i; 8] = std::hint::black_box(scv.as_ptr());
        let mut sumi = [[_mm512_setzero_si512(); P]; R];
        for j in 0..4 {
            let mut ql = [_mm512_setzero_si512(); R];
            let mut qh = [_mm512_setzero_si512(); R];
            for r in 0..R {
                let bits = loadu(w.add(r * ldw + i * Q4K::WB + 16 + 32 * j));
                let l = _mm256_and_si256(bits, m4);
                let h = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                ql[r] = _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(l));
                qh[r] = _mm512_permutexvar_epi32(dup, _mm512_castsi256_si512(h));
            }
            for p in 0..P {
                let unit = ya.add((p * nb + i) * 8 + 2 * j);
                let yl = _mm512_load_si512(unit.cast());
                let yh = _mm512_load_si512(unit.add(1).cast());
                for r in 0..R {
                    let s = &*scp.add(r);
                    let pl = _mm512_madd_epi16(s[2 * j], _mm512_maddubs_epi16(ql[r], yl));
                    let ph = _mm512_madd_epi16(s[2 * j + 1], _mm512_maddubs_epi16(qh[r], yh));
                    sumi[r][p] = _mm512_add_epi32(sumi[r][p], _mm512_add_epi32(pl, ph));
                }
            }
        }
        for r in 0..R {
            for p in 0..P {
                let dv = _mm512_castpd_ps(_mm512_set1_pd(d[r][p]));
                acc[r][p] = _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(sumi[r][p]), acc[r][p]);
            }
        }
    }
    for r in 0..R {
        let mut quad = [_mm512_setzero_ps(); 4];
        quad[..P].copy_from_slice(&acc[r]);
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), hsum4_paired(quad));
        for p in 0..P {
            for h in 0..2 {
                *out.add((2 * p + h) * ldo + r) = lanes[4 * p + h] - summ[r][p][h];
            }
        }
    }
}

thread_local! {
    /// Per-thread paired activations of the 512-bit Q4_K tiles.
    static PAIRED_K: std::cell::RefCell<Vec<Z64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`gemm`] for Q4_K with whole 2·[`PK`]-token tiles in 512-bit registers (see
/// [`q4k_micro_wide`]); the other tokens as [`gemm`] does them. The same bits.
#[inline(always)]
unsafe fn gemm_q4k_wide(c: &GemmCall) {
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
    let nb = n / QK_K;
    let tiles = if crate::cpu::wide_tiles() {
        nt / (2 * PK)
    } else {
        0
    };
    if tiles > 0 {
        let mut buf = PAIRED_K.with(|cell| cell.take());
        let need = PK * nb * 8;
        if buf.len() < need {
            buf.resize(need.next_power_of_two(), Z64([0; 64]));
        }
        let ya = buf.as_mut_ptr();
        for tile in 0..tiles {
            let t = tile * 2 * PK;
            let (at, ot) = (a.add(t * lda), out.add(t * ldo));
            pair_q8k(at, lda, PK, nb, ya);
            let mut r = 0;
            while r + RM <= nr {
                q4k_micro_wide::<RM, PK>(w.add(r * ldw), ldw, at, lda, ya, nb, ot.add(r), ldo);
                r += RM;
            }
            while r < nr {
                q4k_micro_wide::<1, PK>(w.add(r * ldw), ldw, at, lda, ya, nb, ot.add(r), ldo);
                r += 1;
            }
        }
        PAIRED_K.with(|cell| cell.replace(buf));
    }
    let t = tiles * 2 * PK;
    gemm::<Q4K, RM, CM>(&GemmCall {
        a: a.add(t * lda),
        nt: nt - t,
        out: out.add(t * ldo),
        ..*c
    });
}

gemm_entry!(
    /// Tiled Q4_K matrix × activations over a rectangle (see [`GemmKernel`](super::GemmKernel)),
    /// whole 8-token tiles in 512-bit registers (AVX512-F/BW): the same bits as [`gemm_q4_k`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub gemm_q4_k_wide, gemm_q4k_wide
);

/// Rows per tile and tokens per tile of the main microkernel (2 × 4 and the shapes around it
/// measured within noise of each other on a shared 2-vCPU Xeon).
const RM: usize = 2;
const CM: usize = 4;
/// Rows per tile when there is a single token left (decode with one activation part): two rows
/// measured faster than one or four.
const RD: usize = 2;

/// `out[t * ldo + r] = dot(w row r, act row t)` for `r < nr`, `t < nt`, rows `ldw` bytes apart
/// and activation rows `lda` bytes apart, over `n` elements.
#[inline(always)]
unsafe fn gemm<K: KQuant, const RM: usize, const CM: usize>(c: &GemmCall) {
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
    let nb = n / QK_K;
    let mut t = 0;
    while t + CM <= nt {
        let (at, ot) = (a.add(t * lda), out.add(t * ldo));
        let mut r = 0;
        while r + RM <= nr {
            K::micro::<RM, CM>(w.add(r * ldw), ldw, at, lda, nb, ot.add(r), ldo);
            r += RM;
        }
        while r < nr {
            K::micro::<1, CM>(w.add(r * ldw), ldw, at, lda, nb, ot.add(r), ldo);
            r += 1;
        }
        t += CM;
    }
    // Two tokens (or the two activation parts of one) share each unpacked weight vector.
    if t + 2 <= nt {
        let (at, ot) = (a.add(t * lda), out.add(t * ldo));
        let mut r = 0;
        while r + RM <= nr {
            K::micro::<RM, 2>(w.add(r * ldw), ldw, at, lda, nb, ot.add(r), ldo);
            r += RM;
        }
        while r < nr {
            K::micro::<1, 2>(w.add(r * ldw), ldw, at, lda, nb, ot.add(r), ldo);
            r += 1;
        }
        t += 2;
    }
    while t < nt {
        let (at, ot) = (a.add(t * lda), out.add(t * ldo));
        let mut r = 0;
        while r + RD <= nr {
            K::micro::<RD, 1>(w.add(r * ldw), ldw, at, lda, nb, ot.add(r), ldo);
            r += RD;
        }
        while r < nr {
            K::micro::<1, 1>(w.add(r * ldw), ldw, at, lda, nb, ot.add(r), ldo);
            r += 1;
        }
        t += 1;
    }
}

macro_rules! k_kernels {
    ($($pair:ident, $gemm:ident, $k:ty;)*) => {$(
        /// Single-pair dot product: the 1 × 1 tile.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub unsafe fn $pair(w: &[u8], a: &[u8], n: usize) -> f32 {
            debug_assert!(w.len() >= n / QK_K * <$k>::WB && a.len() >= n / QK_K * AB);
            let mut v = 0.0f32;
            <$k>::micro::<1, 1>(w.as_ptr(), 0, a.as_ptr(), 0, n / QK_K, &mut v, 0);
            v
        }

        gemm_entry!(
            /// Tiled matrix × activations over a rectangle (see [`GemmKernel`](super::GemmKernel)).
            #[target_feature(enable = "avx2,fma,f16c")]
            pub $gemm, gemm::<$k, RM, CM>
        );
    )*};
}

k_kernels! {
    q4_k_q8_k, gemm_q4_k, Q4K;
    q6_k_q8_k, gemm_q6_k, Q6K;
}
