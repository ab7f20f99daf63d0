//! The grid i-quants and the ternary types against Q8_K activations, tiled for AVX512-VNNI:
//! tokens in the lanes. A grid type's weights cannot be looked up by a byte shuffle (its grids
//! have 256 to 2048 entries), so each call first unpacks its rows, eight at a time, from their
//! grids into plain bytes (`q + 128`, the single-pair kernel's own register form of every
//! sub-block, see `iq_grid.rs`), and transposes its tokens' activation quants so that one
//! 512-bit register holds four consecutive quants of sixteen tokens. One `vpdpbusd` of a row's
//! four unpacked bytes, broadcast, against such a register then adds into sixteen (row, token)
//! sums at once; the unpacking is paid once per row for every token of the call.
//!
//! # Arithmetic: the single-pair kernel's
//!
//! Each block's integer sum `Σ_j scale_j · Σ q · y` is exact: a 16- or 32-element sum starts
//! from `-128 · Σ y` (the Q8_K block's sums), which the biased bytes complete to `Σ q · y`, and
//! one 32-bit multiply applies its scale. Then `sum += f32(isum) · (d · dy)` per block in order,
//! as [`super::iq_grid`]'s kernels and their scalar twins compute it, so every output has their
//! bits (held by the batch-invariance tests over every type).
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA, F16C and AVX512-F/BW/VNNI/VL, and pointers
//! valid for the rows, activation rows and outputs they are told to touch.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::iq_grid::{GridSimd, Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, Tq1, Tq2};
use crate::attention::transpose16_epi32;
use crate::quant_types::BlockQ8K;
use crate::QK_K;

/// Rows unpacked and met by the tokens together: their sums stay in registers.
const ROWS: usize = 8;

/// Below this many tokens (decode) the unpacking would not pay: each row's blocks go into
/// registers and meet the token there (`iq_grid.rs`'s tile, the same bits).
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
}

thread_local! {
    static TOKENS: RefCell<Vec<TokenBlock>> = const { RefCell::new(Vec::new()) };
    static ROWS_BUF: RefCell<Vec<RowBlock>> = const { RefCell::new(Vec::new()) };
}

/// Lays out tokens `16 v .. 16 v + 16` (fewer in the last group: the missing lanes are zeros,
/// which add nothing) of `nt` Q8_K rows for every super-block.
#[inline(always)]
unsafe fn transpose_tokens(
    a: *const u8,
    lda: usize,
    nt: usize,
    nsb: usize,
    out: &mut [TokenBlock],
) {
    for v in 0..nt.div_ceil(16) {
        let tokens = 16.min(nt - 16 * v);
        for sb in 0..nsb {
            let block = &mut out[v * nsb + sb];
            let y = |t: usize| a.add((16 * v + t) * lda + sb * BlockQ8K::BYTES);
            for part in 0..4 {
                let rows: [__m512i; 16] = std::array::from_fn(|t| {
                    if t < tokens {
                        _mm512_loadu_si512(y(t).add(BlockQ8K::QS + 64 * part) as *const _)
                    } else {
                        _mm512_setzero_si512()
                    }
                });
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
unsafe fn unpack_rows<T: GridSimd>(
    w: *const u8,
    ldw: usize,
    rows: usize,
    nsb: usize,
    out: &mut [RowBlock],
) {
    let bias = _mm256_set1_epi8(-128);
    for r in 0..rows {
        for sb in 0..nsb {
            let x = w.add(r * ldw + sb * T::TY.block_bytes());
            let block = &mut out[r * nsb + sb];
            for ib in 0..8 {
                let (weights, (lo, hi)) = T::sub(x, ib);
                let codes = _mm256_add_epi8(weights, bias);
                _mm256_storeu_si256(block.codes.as_mut_ptr().add(32 * ib) as *mut _, codes);
                block.scales[2 * ib] = lo as i32;
                block.scales[2 * ib + 1] = hi as i32;
            }
            block.d = T::d(x);
        }
    }
}

/// `R` unpacked rows against a group of sixteen tokens, over `nsb` super-blocks: each lane's
/// sums in the single-pair kernel's order.
#[inline(always)]
unsafe fn rows_by_tokens<T: GridSimd, const R: usize>(
    rows: &[RowBlock],
    nsb: usize,
    tokens: &[TokenBlock],
) -> [__m512; R] {
    let mut acc = [_mm512_setzero_ps(); R];
    for sb in 0..nsb {
        let tb = &tokens[sb];
        let rb: [&RowBlock; R] = std::array::from_fn(|r| &rows[r * nsb + sb]);
        let mut isum = [_mm512_setzero_si512(); R];
        for j in 0..8 {
            let start = |g: usize| _mm512_load_si512(tb.starts[g].as_ptr() as *const _);
            // Halves: elements 0..16 of the sub-block, then 16..32, each with its scale.
            let parts: &[(usize, usize)] = if T::HALVES {
                &[(0, 4), (4, 8)]
            } else {
                &[(0, 8)]
            };
            for (h, &(k0, k1)) in parts.iter().enumerate() {
                let first = if T::HALVES {
                    start(2 * j + h)
                } else {
                    _mm512_add_epi32(start(2 * j), start(2 * j + 1))
                };
                let mut sums = [first; R];
                for k in k0..k1 {
                    let quants = _mm512_load_si512(tb.quants[8 * j + k].as_ptr() as *const _);
                    for r in 0..R {
                        let at = rb[r].codes.as_ptr().add(32 * j + 4 * k) as *const i32;
                        let codes = _mm512_set1_epi32(at.read_unaligned());
                        sums[r] = _mm512_dpbusd_epi32(sums[r], codes, quants);
                    }
                }
                for r in 0..R {
                    let scale = _mm512_set1_epi32(rb[r].scales[2 * j + h]);
                    isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(sums[r], scale));
                }
            }
        }
        let dy = _mm512_load_ps(tb.d.as_ptr());
        for r in 0..R {
            let scale = _mm512_mul_ps(_mm512_set1_ps(rb[r].d), dy);
            acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_cvtepi32_ps(isum[r]), scale));
        }
    }
    acc
}

/// Stores lane `t < tokens` of each row's register at `out[t * ldo + r]`.
#[inline(always)]
unsafe fn store<const R: usize>(acc: [__m512; R], tokens: usize, out: *mut f32, ldo: usize) {
    for (r, v) in acc.iter().enumerate() {
        let mut lanes = [0f32; 16];
        _mm512_storeu_ps(lanes.as_mut_ptr(), *v);
        for (t, &x) in lanes.iter().enumerate().take(tokens) {
            *out.add(t * ldo + r) = x;
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm<T: GridSimd>(
    w: *const u8,
    ldw: usize,
    a: *const u8,
    lda: usize,
    n: usize,
    nr: usize,
    nt: usize,
    out: *mut f32,
    ldo: usize,
) {
    if nt < MIN_TOKENS {
        return super::iq_grid::gemm::<T>(w, ldw, a, lda, n, nr, nt, out, ldo);
    }
    let nsb = n / QK_K;
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
    transpose_tokens(a, lda, nt, nsb, &mut tokens);
    let mut r0 = 0;
    while r0 < nr {
        let chunk = ROWS.min(nr - r0);
        unpack_rows::<T>(w.add(r0 * ldw), ldw, chunk, nsb, &mut rows);
        for v in 0..groups {
            let group = &tokens[v * nsb..(v + 1) * nsb];
            let at = out.add(16 * v * ldo + r0);
            let valid = 16.min(nt - 16 * v);
            if chunk == ROWS {
                store(rows_by_tokens::<T, ROWS>(&rows, nsb, group), valid, at, ldo);
            } else {
                for r in 0..chunk {
                    let one = &rows[r * nsb..(r + 1) * nsb];
                    store(
                        rows_by_tokens::<T, 1>(one, nsb, group),
                        valid,
                        at.add(r),
                        ldo,
                    );
                }
            }
        }
        r0 += chunk;
    }
    TOKENS.with(|cell| cell.replace(tokens));
    ROWS_BUF.with(|cell| cell.replace(rows));
}

macro_rules! grid_vnni_kernels {
    ($($name:ident => $t:ty;)*) => {$(
        gemm_entry!(
            #[doc = concat!("VNNI tile of `", stringify!($t), "` rows · Q8_K activations.")]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
            pub(crate) $name,
            gemm::<$t>
        );
    )*};
}

grid_vnni_kernels! {
    gemm_iq2_xxs_vnni => Iq2Xxs;
    gemm_iq2_xs_vnni => Iq2Xs;
    gemm_iq2_s_vnni => Iq2S;
    gemm_iq3_xxs_vnni => Iq3Xxs;
    gemm_iq3_s_vnni => Iq3S;
    gemm_iq1_s_vnni => Iq1S;
    gemm_iq1_m_vnni => Iq1M;
    gemm_tq2_0_vnni => Tq2;
    gemm_tq1_0_vnni => Tq1;
}

#[cfg(test)]
mod tests {
    use super::super::GemmKernel;
    use crate::{dot::scalar_kernel, QuantType};

    /// Both tiles of every grid type (this one, where the CPU has VNNI, and `iq_grid.rs`'s
    /// AVX2 tile) give the scalar twin's bits for every (row, token), across token counts
    /// that fill, split and leave partial sixteen-token groups, and row counts with partial
    /// eight-row chunks.
    #[test]
    fn tiles_equal_the_scalar_twin_bit_for_bit() {
        if !crate::cpu::has_avx2_fma_f16c() {
            return;
        }
        use super::super::iq_grid as avx2;
        use super::*;
        type Case = (QuantType, GemmKernel, GemmKernel);
        let cases: [Case; 9] = [
            (QuantType::IQ2_XXS, avx2::gemm_iq2_xxs, gemm_iq2_xxs_vnni),
            (QuantType::IQ2_XS, avx2::gemm_iq2_xs, gemm_iq2_xs_vnni),
            (QuantType::IQ2_S, avx2::gemm_iq2_s, gemm_iq2_s_vnni),
            (QuantType::IQ3_XXS, avx2::gemm_iq3_xxs, gemm_iq3_xxs_vnni),
            (QuantType::IQ3_S, avx2::gemm_iq3_s, gemm_iq3_s_vnni),
            (QuantType::IQ1_S, avx2::gemm_iq1_s, gemm_iq1_s_vnni),
            (QuantType::IQ1_M, avx2::gemm_iq1_m, gemm_iq1_m_vnni),
            (QuantType::TQ1_0, avx2::gemm_tq1_0, gemm_tq1_0_vnni),
            (QuantType::TQ2_0, avx2::gemm_tq2_0, gemm_tq2_0_vnni),
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (n, rows, max_tokens) = (3 * QK_K, 19, 35);
        for (ty, tile, vnni) in cases {
            let rb = ty.row_bytes(n).unwrap();
            let w: Vec<u8> = (0..rows * rb).map(|_| next() as u8).collect();
            let ab = QuantType::Q8_K.row_bytes(n).unwrap();
            let mut a = vec![0u8; max_tokens * ab];
            for row in a.chunks_exact_mut(ab) {
                let x: Vec<f32> = (0..n)
                    .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                    .collect();
                crate::quantize_row_q8_k(&x, row).unwrap();
            }
            let twin = scalar_kernel(ty).unwrap();
            let same = |x: f32, y: f32| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
            let kernels: &[GemmKernel] = if crate::cpu::has_vnni() {
                &[tile, vnni]
            } else {
                &[tile]
            };
            for (k, &kernel) in kernels.iter().enumerate() {
                for nt in [1usize, 2, 3, 16, 17, 35] {
                    let mut out = vec![0f32; nt * rows];
                    // SAFETY: the CPU has the kernel's features; every pointer spans its
                    // rows, tokens and outputs.
                    unsafe {
                        kernel(
                            w.as_ptr(),
                            rb,
                            a.as_ptr(),
                            ab,
                            n,
                            rows,
                            nt,
                            out.as_mut_ptr(),
                            rows,
                        )
                    };
                    for t in 0..nt {
                        for r in 0..rows {
                            // SAFETY: scalar code over validated lengths.
                            let expect = unsafe {
                                twin(&w[r * rb..(r + 1) * rb], &a[t * ab..(t + 1) * ab], n)
                            };
                            assert!(
                                same(out[t * rows + r], expect),
                                "{ty} kernel {k} tokens {nt} at t{t} r{r}: {} != {expect}",
                                out[t * rows + r]
                            );
                        }
                    }
                }
            }
        }
    }
}
