//! The grid i-quants, the ternary types, Q2_K and Q3_K against Q8_K activations, tiled for
//! AVX512-VNNI: tokens in the lanes. A grid type's weights cannot be looked up by a byte shuffle
//! (its grids have 256 to 2048 entries), so each call first unpacks its rows, eight at a time,
//! into plain bytes (`q + 128`, see [`unpack`]), and transposes its tokens' activation quants
//! so that one 512-bit register holds four consecutive quants of sixteen tokens. One `vpdpbusd`
//! of a row's four unpacked bytes, broadcast, against such a register then adds into sixteen
//! (row, token) sums at once; the unpacking is paid once per row for every token of the call.
//! Decode unpacks each block into registers and meets its one token there ([`dot`]).
//!
//! # Arithmetic: the scalar twins'
//!
//! Each block's integer sum `Σ_j scale_j · Σ q · y` is exact: a 16- or 32-element sum starts
//! from `-128 · Σ y` (the Q8_K block's sums), which the biased bytes complete to `Σ q · y`, and
//! one 32-bit multiply applies its scale (Q2_K's mins meet the Q8_K sums exactly too). Then
//! `sum += f32(isum) · (d · dy)` per block in order (Q2_K: minus `f32(Σ min · Σ y) · (dmin ·
//! dy)`), as [`super::blocks_grid`]'s kernels and the scalar twins compute it, so every output has
//! their bits.
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA, F16C and AVX512-F/BW/VNNI/VL, and pointers
//! valid for the rows, activation rows and outputs they are told to touch.

mod unpack;

use crate::dot::GemmCall;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::blocks_grid::{Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, Tq1, Tq2};
use crate::attention::transpose16_epi32;
use crate::quant_types::BlockQ8K;
use crate::QK_K;
use unpack::{Unpack, Q2K, Q3K};

/// Rows unpacked together.
const ROWS: usize = 8;

/// Rows and sixteen-token groups met together where there are enough groups: twelve
/// independent sums (and twelve exact block sums) in registers.
const WIDE_ROWS: usize = 4;
const WIDE_GROUPS: usize = 3;

/// Below this many tokens (decode) the unpacking would not pay: each row's blocks go into
/// registers and meet the token there ([`dot`], the same bits).
const MIN_TOKENS: usize = 2;

/// One super-block of sixteen tokens, as the inner loop reads it.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct TokenBlock {
    /// Register `k` holds quants `4k..4k + 4` of each token (token `t` in lane `t`).
    quants: [[i32; 16]; 64],
    /// Per 16 quants, `-128 · Σ y` of each token.
    starts: [[i32; 16]; 16],
    /// Each token's `dy`.
    d: [f32; 16],
    /// Per pair of 16 quants `p`, each token's `Σ y` of both as i16 pairs (for mins; unset for
    /// weights without).
    sum_pairs: [[i32; 16]; 8],
}

/// One row's unpacked super-block.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct RowBlock {
    /// `q + 128` of the 256 weights.
    codes: [u8; QK_K],
    /// The scale of each 16 weights.
    scales: [i32; 16],
    /// The block's factor `d`.
    d: f32,
    /// Mins as [`Unpacked`] has them, and their factor.
    min_pairs: [i32; 8],
    dmin: f32,
}

thread_local! {
    static TOKENS: RefCell<Vec<TokenBlock>> = const { RefCell::new(Vec::new()) };
    static ROWS_BUF: RefCell<Vec<RowBlock>> = const { RefCell::new(Vec::new()) };
}

/// Lays out tokens `16 v .. 16 v + 16` (fewer in the last group: the missing lanes are zeros,
/// which add nothing) of `nt` Q8_K rows for every super-block; their sums of 16 as pairs only
/// for weights with `mins`.
#[inline(always)]
unsafe fn transpose_tokens(
    a: *const u8,
    lda: usize,
    nt: usize,
    nsb: usize,
    mins: bool,
    out: &mut [TokenBlock],
) {
    for v in 0..nt.div_ceil(16) {
        let tokens = 16.min(nt - 16 * v);
        for sb in 0..nsb {
            let block = &mut out[v * nsb + sb];
            let y = |t: usize| a.add((16 * v + t) * lda + sb * BlockQ8K::BYTES);
            for part in 0..4 {
                let mut rows = [_mm512_setzero_si512(); 16];
                for (t, row) in rows.iter_mut().enumerate().take(tokens) {
                    *row = _mm512_loadu_si512(y(t).add(BlockQ8K::QS + 64 * part) as *const _);
                }
                let cols = transpose16_epi32(rows);
                for (k, col) in cols.iter().enumerate() {
                    _mm512_store_si512(block.quants[16 * part + k].as_mut_ptr() as *mut _, *col);
                }
            }
            for g in 0..16 {
                for t in 0..16 {
                    block.starts[g][t] = if t < tokens {
                        let sums = y(t).add(BlockQ8K::BSUMS + 2 * g) as *const i16;
                        -128 * i32::from(sums.read_unaligned())
                    } else {
                        0
                    };
                }
            }
            for (p, pairs) in block.sum_pairs.iter_mut().enumerate().filter(|_| mins) {
                for (t, pair) in pairs.iter_mut().enumerate() {
                    *pair = if t < tokens {
                        let sums = y(t).add(BlockQ8K::BSUMS + 4 * p) as *const u32;
                        sums.read_unaligned() as i32
                    } else {
                        0
                    };
                }
            }
            for t in 0..16 {
                block.d[t] = if t < tokens {
                    (y(t).add(BlockQ8K::D) as *const f32).read_unaligned()
                } else {
                    0.0
                };
            }
        }
    }
}

/// Unpacks `rows` rows (`ldw` bytes apart at `w`) of `nsb` super-blocks each.
#[inline(always)]
unsafe fn unpack_rows<T: Unpack>(
    w: *const u8,
    ldw: usize,
    rows: usize,
    nsb: usize,
    out: &mut [RowBlock],
) {
    for r in 0..rows {
        for sb in 0..nsb {
            let unpacked = T::unpack(w.add(r * ldw + sb * T::TY.block_bytes()));
            let block = &mut out[r * nsb + sb];
            for (m, codes) in unpacked.codes.iter().enumerate() {
                _mm512_store_si512(block.codes.as_mut_ptr().add(64 * m) as *mut _, *codes);
            }
            _mm512_store_si512(block.scales.as_mut_ptr() as *mut _, unpacked.scales);
            block.d = unpacked.d;
            _mm256_storeu_si256(block.min_pairs.as_mut_ptr() as *mut _, unpacked.min_pairs);
            block.dmin = unpacked.dmin;
        }
    }
}

/// One row against one token (decode): each super-block unpacked into registers and met by
/// the token's quants, four `vpdpbusd`s a block; the same exact sums and f32 steps.
#[inline(always)]
unsafe fn dot<T: Unpack>(x: *const u8, y: *const u8, nsb: usize) -> f32 {
    // Lane `L` of register `m` holds elements `64 m + 4 L ..`: the scale of 16 weights `4 m + L / 4`.
    let quarter = _mm512_srli_epi32::<2>(_mm512_setr_epi32(
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
    ));
    let mut lane_scale = [quarter; 4];
    for (m, lanes) in lane_scale.iter_mut().enumerate() {
        *lanes = _mm512_add_epi32(quarter, _mm512_set1_epi32(4 * m as i32));
    }
    let mut sum = 0f32;
    for sb in 0..nsb {
        let u = T::unpack(x.add(sb * T::TY.block_bytes()));
        let yb = y.add(sb * BlockQ8K::BYTES);
        // Each 16 quants' `-128 · Σ y` meets its scale, and the biased products theirs.
        let sums = _mm512_cvtepi16_epi32(_mm256_loadu_si256(yb.add(BlockQ8K::BSUMS) as *const _));
        let mut acc = if T::UNIT_SCALES {
            _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<7>(sums))
        } else {
            _mm512_mullo_epi32(_mm512_mullo_epi32(sums, _mm512_set1_epi32(-128)), u.scales)
        };
        for (m, codes) in u.codes.iter().enumerate() {
            let quants = _mm512_loadu_si512(yb.add(BlockQ8K::QS + 64 * m) as *const _);
            if T::UNIT_SCALES {
                // The same exact integers without the multiplies by one.
                acc = _mm512_dpbusd_epi32(acc, *codes, quants);
                continue;
            }
            let part = _mm512_dpbusd_epi32(_mm512_setzero_si512(), *codes, quants);
            let scale = _mm512_permutexvar_epi32(lane_scale[m], u.scales);
            acc = _mm512_add_epi32(acc, _mm512_mullo_epi32(part, scale));
        }
        let isum = _mm512_reduce_add_epi32(acc);
        let dy = (yb.add(BlockQ8K::D) as *const f32).read_unaligned();
        let mut term = isum as f32 * (u.d * dy);
        if T::HAS_MIN {
            let mins = u.min_pairs;
            let pairs = _mm256_loadu_si256(yb.add(BlockQ8K::BSUMS) as *const _);
            let msum = _mm256_dpwssd_epi32(_mm256_setzero_si256(), mins, pairs);
            let msum = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(msum));
            term -= msum as f32 * (u.dmin * dy);
        }
        sum += term;
    }
    sum
}

/// `R` unpacked rows against `V` groups of sixteen tokens (`tokens[v * nsb + sb]`), over `nsb`
/// super-blocks: each lane's sums in the single-pair kernel's order. `R · V` independent sums
/// keep the `vpdpbusd`s' latency covered, and each broadcast of a row's bytes meets `V` groups.
#[inline(always)]
unsafe fn rows_by_tokens<T: Unpack, const R: usize, const V: usize>(
    rows: &[RowBlock],
    nsb: usize,
    tokens: &[TokenBlock],
) -> [[__m512; V]; R] {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for sb in 0..nsb {
        let tb: [&TokenBlock; V] = std::array::from_fn(|v| &tokens[v * nsb + sb]);
        let rb: [&RowBlock; R] = std::array::from_fn(|r| &rows[r * nsb + sb]);
        let mut isum = [[_mm512_setzero_si512(); V]; R];
        for j in 0..8 {
            // Halves: elements 0..16 of the sub-block, then 16..32, each with its scale.
            let parts: &[(usize, usize)] = if T::HALVES {
                &[(0, 4), (4, 8)]
            } else {
                &[(0, 8)]
            };
            for (h, &(k0, k1)) in parts.iter().enumerate() {
                let mut first = [_mm512_setzero_si512(); V];
                for v in 0..V {
                    let starts = tb[v].starts.as_ptr() as *const __m512i;
                    first[v] = if T::HALVES {
                        *starts.add(2 * j + h)
                    } else {
                        _mm512_add_epi32(*starts.add(2 * j), *starts.add(2 * j + 1))
                    };
                }
                let mut sums = [first; R];
                for k in k0..k1 {
                    let mut quants = [_mm512_setzero_si512(); V];
                    for v in 0..V {
                        quants[v] = _mm512_load_si512(tb[v].quants[8 * j + k].as_ptr() as *const _);
                    }
                    for r in 0..R {
                        let at = rb[r].codes.as_ptr().add(32 * j + 4 * k) as *const i32;
                        let codes = _mm512_set1_epi32(at.read_unaligned());
                        for v in 0..V {
                            sums[r][v] = _mm512_dpbusd_epi32(sums[r][v], codes, quants[v]);
                        }
                    }
                }
                for r in 0..R {
                    let scale = _mm512_set1_epi32(rb[r].scales[2 * j + h]);
                    for v in 0..V {
                        let scaled = _mm512_mullo_epi32(sums[r][v], scale);
                        isum[r][v] = _mm512_add_epi32(isum[r][v], scaled);
                    }
                }
            }
        }
        for v in 0..V {
            let dy = _mm512_load_ps(tb[v].d.as_ptr());
            for r in 0..R {
                let scale = _mm512_mul_ps(_mm512_set1_ps(rb[r].d), dy);
                let mut term = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[r][v]), scale);
                if T::HAS_MIN {
                    // `(dy · dmin) · f32(Σ min · Σ y)`, off the scaled sum, as the twin has it.
                    let mut msum = _mm512_setzero_si512();
                    for (p, &pair) in rb[r].min_pairs.iter().enumerate() {
                        let sums = _mm512_load_si512(tb[v].sum_pairs[p].as_ptr() as *const _);
                        msum = _mm512_dpwssd_epi32(msum, _mm512_set1_epi32(pair), sums);
                    }
                    let min_scale = _mm512_mul_ps(_mm512_set1_ps(rb[r].dmin), dy);
                    let min_term = _mm512_mul_ps(_mm512_cvtepi32_ps(msum), min_scale);
                    term = _mm512_sub_ps(term, min_term);
                }
                acc[r][v] = _mm512_add_ps(acc[r][v], term);
            }
        }
    }
    acc
}

/// Stores lane `t` of row `r`'s register for group `v` at `out[(16 v + t) * ldo + r]`, for the
/// `nt` tokens there are.
#[inline(always)]
unsafe fn store<const R: usize, const V: usize>(
    acc: [[__m512; V]; R],
    nt: usize,
    out: *mut f32,
    ldo: usize,
) {
    for (r, groups) in acc.iter().enumerate() {
        for (v, group) in groups.iter().enumerate() {
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), *group);
            let tokens = nt.saturating_sub(16 * v).min(16);
            for (t, &x) in lanes.iter().enumerate().take(tokens) {
                *out.add((16 * v + t) * ldo + r) = x;
            }
        }
    }
}

#[inline(always)]
unsafe fn gemm<T: Unpack>(c: &GemmCall) {
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
    let nsb = n / QK_K;
    if nt < MIN_TOKENS {
        for t in 0..nt {
            for r in 0..nr {
                *out.add(t * ldo + r) = dot::<T>(w.add(r * ldw), a.add(t * lda), nsb);
            }
        }
        return;
    }
    let groups = nt.div_ceil(16);
    // Take the buffers out of their thread-locals rather than working inside `with` closures:
    // a closure would not inherit this function's target features.
    let mut tokens = TOKENS.with(|cell| cell.take());
    let mut rows = ROWS_BUF.with(|cell| cell.take());
    if tokens.len() < groups * nsb {
        tokens.resize(groups * nsb, std::mem::zeroed());
    }
    if rows.len() < ROWS * nsb {
        rows.resize(ROWS * nsb, std::mem::zeroed());
    }
    transpose_tokens(a, lda, nt, nsb, T::HAS_MIN, &mut tokens);
    let mut r0 = 0;
    while r0 < nr {
        let chunk = ROWS.min(nr - r0);
        unpack_rows::<T>(w.add(r0 * ldw), ldw, chunk, nsb, &mut rows);
        let mut v = 0;
        while v < groups {
            let at = out.add(16 * v * ldo + r0);
            let rest = nt - 16 * v;
            if chunk == ROWS && groups - v >= WIDE_GROUPS {
                let wide = &tokens[v * nsb..(v + WIDE_GROUPS) * nsb];
                for half in 0..ROWS / WIDE_ROWS {
                    let (rb, at) = (&rows[half * WIDE_ROWS * nsb..], at.add(half * WIDE_ROWS));
                    let acc = rows_by_tokens::<T, WIDE_ROWS, WIDE_GROUPS>(rb, nsb, wide);
                    store(acc, rest, at, ldo);
                }
                v += WIDE_GROUPS;
                continue;
            }
            // One group; a partial chunk of rows goes four, two and one at a time.
            let group = &tokens[v * nsb..(v + 1) * nsb];
            let mut r = 0;
            while r < chunk {
                let (rb, at) = (&rows[r * nsb..], at.add(r));
                r += match chunk - r {
                    ROWS.. => {
                        store(rows_by_tokens::<T, ROWS, 1>(rb, nsb, group), rest, at, ldo);
                        ROWS
                    }
                    4.. => {
                        store(rows_by_tokens::<T, 4, 1>(rb, nsb, group), rest, at, ldo);
                        4
                    }
                    2.. => {
                        store(rows_by_tokens::<T, 2, 1>(rb, nsb, group), rest, at, ldo);
                        2
                    }
                    _ => {
                        store(rows_by_tokens::<T, 1, 1>(rb, nsb, group), rest, at, ldo);
                        1
                    }
                };
            }
            v += 1;
        }
        r0 += chunk;
    }
    TOKENS.with(|cell| cell.replace(tokens));
    ROWS_BUF.with(|cell| cell.replace(rows));
}

macro_rules! grid_vnni_kernels {
    ($($gemm:ident, $pair:ident => $t:ty;)*) => {$(
        gemm_entry!(
            #[doc = concat!("VNNI tile of `", stringify!($t), "` rows · Q8_K activations.")]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
            pub(crate) $gemm,
            gemm::<$t>
        );

        #[doc = concat!("VNNI kernel of one `", stringify!($t), "` row · one Q8_K row.")]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
        pub(crate) unsafe fn $pair(w: &[u8], a: &[u8], n: usize) -> f32 {
            dot::<$t>(w.as_ptr(), a.as_ptr(), n / QK_K)
        }
    )*};
}

grid_vnni_kernels! {
    gemm_iq2_xxs_vnni, iq2_xxs_q8_k_vnni => Iq2Xxs;
    gemm_iq2_xs_vnni, iq2_xs_q8_k_vnni => Iq2Xs;
    gemm_iq2_s_vnni, iq2_s_q8_k_vnni => Iq2S;
    gemm_iq3_xxs_vnni, iq3_xxs_q8_k_vnni => Iq3Xxs;
    gemm_iq3_s_vnni, iq3_s_q8_k_vnni => Iq3S;
    gemm_iq1_s_vnni, iq1_s_q8_k_vnni => Iq1S;
    gemm_iq1_m_vnni, iq1_m_q8_k_vnni => Iq1M;
    gemm_tq2_0_vnni, tq2_0_q8_k_vnni => Tq2;
    gemm_tq1_0_vnni, tq1_0_q8_k_vnni => Tq1;
    gemm_q2_k_vnni, q2_k_q8_k_vnni => Q2K;
    gemm_q3_k_vnni, q3_k_q8_k_vnni => Q3K;
}
