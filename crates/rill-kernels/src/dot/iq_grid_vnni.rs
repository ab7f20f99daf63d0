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
use crate::grid_quants::KSIGN_MASKS;
use crate::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant_types::BlockQ8K;
use crate::{QuantType, QK_K};

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
    /// Per pair of 16 quants `p`, each token's `Σ y` of both as i16 pairs (for mins).
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
            for (p, pairs) in block.sum_pairs.iter_mut().enumerate() {
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

/// A super-block unpacked into registers: `q + 128` of its 256 weights (register `m` holds
/// elements `64 m .. 64 m + 64`), the scale of each 16 weights, and the block's factor `d`.
struct Unpacked {
    codes: [__m512i; 4],
    scales: __m512i,
    d: f32,
    /// With [`Unpack::HAS_MIN`] (Q2_K): each 16 weights' min as i16 pairs (`min 2p` low, `min
    /// 2p + 1` high) and its factor `dmin`.
    min_pairs: __m256i,
    dmin: f32,
}

/// How a type's super-block is unpacked.
trait Unpack {
    const TY: QuantType;
    /// Each 16 weights of a sub-block have a scale of their own (otherwise the two are one).
    const HALVES: bool;
    /// The weights have mins (Q2_K), met by the activations' sums of 16.
    const HAS_MIN: bool = false;
    unsafe fn unpack(x: *const u8) -> Unpacked;
}

/// The grid types' constants for [`Unpack`].
macro_rules! grid_constants {
    () => {
        const TY: QuantType = <Self as GridSimd>::TY;
        const HALVES: bool = <Self as GridSimd>::HALVES;
    };
}

/// A grid type's block from the single-pair kernel's register form of each sub-block
/// ([`GridSimd::sub`]).
#[inline(always)]
unsafe fn unpack_subs<T: GridSimd>(x: *const u8) -> Unpacked {
    // Loops, not closures: a closure would not inherit the caller's target features.
    let bias = _mm256_set1_epi8(-128);
    let mut scales = [0i32; 16];
    let mut codes = [_mm512_setzero_si512(); 4];
    for (m, code) in codes.iter_mut().enumerate() {
        let mut halves = [_mm256_setzero_si256(); 2];
        for (h, half) in halves.iter_mut().enumerate() {
            let ib = 2 * m + h;
            let (weights, (lo, hi)) = T::sub(x, ib);
            scales[2 * ib] = lo as i32;
            scales[2 * ib + 1] = hi as i32;
            *half = _mm256_add_epi8(weights, bias);
        }
        *code = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(halves[0]), halves[1]);
    }
    unpacked(codes, &scales, T::d(x))
}

/// An [`Unpacked`] without mins.
#[inline(always)]
unsafe fn unpacked(codes: [__m512i; 4], scales: &[i32; 16], d: f32) -> Unpacked {
    Unpacked {
        codes,
        scales: _mm512_loadu_si512(scales.as_ptr() as *const _),
        d,
        min_pairs: _mm256_setzero_si256(),
        dmin: 0.0,
    }
}

impl Unpack for Tq1 {
    grid_constants!();
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        unpack_subs::<Self>(x)
    }
}

impl Unpack for Tq2 {
    grid_constants!();
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        unpack_subs::<Self>(x)
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The 2-bit quants of Q2_K and Q3_K: register `m` holds sub-blocks `2m` and `2m + 1`, both
/// from the 32 bytes of their 128-element half, shifted by `2 j` for sub-block `j` of it.
#[inline(always)]
unsafe fn two_bit_quants(qs: *const u8, m: usize) -> __m512i {
    let half = _mm256_loadu_si256(qs.add(32 * (m / 2)) as *const _);
    let j = 2 * (m % 2) as i16;
    let counts = _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(2 * j)),
        _mm256_set1_epi16(2 * j + 2),
    );
    let shifted = _mm512_srlv_epi16(_mm512_broadcast_i64x4(half), counts);
    _mm512_and_si512(shifted, _mm512_set1_epi8(3))
}

/// Q3_K: the 2-bit quants less 4 where their bit of the high mask is clear (`q` in -4..3).
impl Unpack for Q3K {
    const TY: QuantType = QuantType::Q3_K;
    const HALVES: bool = true;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let high = _mm512_broadcast_i64x4(_mm256_loadu_si256(x as *const _));
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            // Sub-block `ib`'s bit of the high mask is bit `ib` of each of its 32 bytes.
            let (first, second) = ((1u8 << (2 * m)) as i8, (1u8 << (2 * m + 1)) as i8);
            let bits = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi8(first)),
                _mm256_set1_epi8(second),
            );
            let set = _mm512_test_epi8_mask(high, bits);
            let low = _mm512_add_epi8(two_bit_quants(x.add(32), m), _mm512_set1_epi8(124));
            *code = _mm512_mask_add_epi8(low, set, low, _mm512_set1_epi8(4));
        }
        // Scale `j`: the low nibble of byte `j` (the high one of byte `j - 8` from 8 on), two
        // bits `2 (j / 4)..` of byte `8 + j % 4` above it, less 32.
        let bytes = _mm_insert_epi32::<2>(
            _mm_loadl_epi64(x.add(96) as *const _),
            (x.add(104) as *const i32).read_unaligned(),
        );
        let low_bytes = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
        let low = _mm512_srlv_epi32(
            _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, low_bytes)),
            _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4),
        );
        let high_bytes = _mm_setr_epi8(8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11, 8, 9, 10, 11);
        let high = _mm512_srlv_epi32(
            _mm512_cvtepu8_epi32(_mm_shuffle_epi8(bytes, high_bytes)),
            _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6),
        );
        let six_bits = _mm512_or_si512(
            _mm512_and_si512(low, _mm512_set1_epi32(15)),
            _mm512_slli_epi32::<4>(_mm512_and_si512(high, _mm512_set1_epi32(3))),
        );
        Unpacked {
            scales: _mm512_sub_epi32(six_bits, _mm512_set1_epi32(32)),
            ..unpacked(codes, &[0; 16], f16_at(x.add(108)))
        }
    }
}

/// Q2_K: 2-bit quants, a 4-bit scale and a 4-bit min per 16.
impl Unpack for Q2K {
    const TY: QuantType = QuantType::Q2_K;
    const HALVES: bool = true;
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            *code = _mm512_add_epi8(two_bit_quants(x.add(16), m), _mm512_set1_epi8(-128));
        }
        let bytes = _mm_loadu_si128(x as *const _);
        let scales = _mm512_and_si512(_mm512_cvtepu8_epi32(bytes), _mm512_set1_epi32(15));
        // The high nibbles as sixteen i16: eight pairs.
        let min_pairs = _mm256_srli_epi16::<4>(_mm256_cvtepu8_epi16(bytes));
        Unpacked {
            scales,
            min_pairs,
            dmin: f16_at(x.add(82)),
            ..unpacked(codes, &[0; 16], f16_at(x.add(80)))
        }
    }
}

/// Q2_K and Q3_K, which have no grid.
struct Q2K;
struct Q3K;

/// IQ3_S with 512-bit registers: each sixteen grid entries by one gather (indices from the
/// quant bytes and, as a mask, the high bits), the signs applied under a 64-bit mask.
impl Unpack for Iq3S {
    grid_constants!();
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let (qs, signs) = (x.add(2), x.add(74));
        let high = (x.add(66) as *const u64).read_unaligned();
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            let low = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.add(16 * m) as *const _));
            let index = _mm512_mask_or_epi32(
                low,
                (high >> (16 * m)) as __mmask16,
                low,
                _mm512_set1_epi32(256),
            );
            let grid = _mm512_i32gather_epi32::<4>(index, IQ3S_GRID.as_ptr() as *const i32);
            let negative = (signs.add(8 * m) as *const u64).read_unaligned();
            *code = biased(grid, negative);
        }
        let packed = (x.add(106) as *const u32).read_unaligned();
        // Scale `j` (of each 32 weights, nibble `j`) for both halves: lanes `2j`, `2j + 1`.
        let nibbles = _mm512_srlv_epi32(
            _mm512_set1_epi32(packed as i32),
            _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28),
        );
        let s = _mm512_and_si512(nibbles, _mm512_set1_epi32(15));
        Unpacked {
            scales: _mm512_add_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(1)),
            ..unpacked(codes, &[0; 16], Self::d(x))
        }
    }
}

/// `128 + g`, or `128 - g` in the bytes whose bit of `negative` is set.
#[inline(always)]
unsafe fn biased(grid: __m512i, negative: __mmask64) -> __m512i {
    let bias = _mm512_set1_epi8(-128);
    _mm512_mask_sub_epi8(_mm512_add_epi8(grid, bias), negative, bias, grid)
}

/// The sign bits of two sub-blocks of eight-element sign indices (IQ2_XXS, IQ3_XXS): the
/// 7-bit indices `(aux >> 7 l) & 127` of `first`, then of `second`, looked up by one gather
/// of their byte masks.
#[inline(always)]
unsafe fn ksigns(first: u32, second: u32) -> __mmask64 {
    let (a, b) = (first as i32, second as i32);
    let shifted = _mm256_srlv_epi32(
        _mm256_setr_epi32(a, a, a, a, b, b, b, b),
        _mm256_setr_epi32(0, 7, 14, 21, 0, 7, 14, 21),
    );
    sign_masks(_mm256_and_si256(shifted, _mm256_set1_epi32(127)))
}

/// The sign bits of eight 8-element groups from their 7-bit sign indices.
#[inline(always)]
unsafe fn sign_masks(index: __m256i) -> __mmask64 {
    let masks = _mm512_i32gather_epi64::<8>(index, KSIGN_MASKS.as_ptr() as *const i64);
    _mm512_movepi8_mask(masks)
}

/// The scales `2 s + 1` of eight bytes of two 4-bit `s` each (IQ2_XS, IQ2_S: the low nibble
/// for a sub-block's first 16 weights, the high one for its second).
#[inline(always)]
unsafe fn nibble_pair_scales(at: *const u8) -> __m512i {
    let doubled = _mm_shuffle_epi8(
        _mm_loadl_epi64(at as *const _),
        _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
    );
    let shifts = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
    let nibbles = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_cvtepu8_epi32(doubled), shifts),
        _mm512_set1_epi32(15),
    );
    _mm512_add_epi32(_mm512_add_epi32(nibbles, nibbles), _mm512_set1_epi32(1))
}

/// IQ2_XS: each two sub-blocks' eight 16-bit words (a 9-bit grid index, a 7-bit sign index)
/// by one gather of their grid entries and one of their signs.
impl Unpack for Iq2Xs {
    grid_constants!();
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            let words = _mm256_cvtepu16_epi32(_mm_loadu_si128(x.add(2 + 16 * m) as *const _));
            let index = _mm256_and_si256(words, _mm256_set1_epi32(511));
            let grid = _mm512_i32gather_epi64::<8>(index, IQ2XS_GRID.as_ptr() as *const i64);
            *code = biased(grid, sign_masks(_mm256_srli_epi32::<9>(words)));
        }
        Unpacked {
            scales: nibble_pair_scales(x.add(66)),
            ..unpacked(codes, &[0; 16], Self::d(x))
        }
    }
}

/// IQ2_S: each two sub-blocks' eight grid entries (a quant byte and two high bits each) by one
/// gather; the sign bits are the block's bytes.
impl Unpack for Iq2S {
    grid_constants!();
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            let low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.add(2 + 8 * m) as *const _));
            let (h0, h1) = (i32::from(*x.add(66 + 2 * m)), i32::from(*x.add(67 + 2 * m)));
            let high = _mm256_srlv_epi32(
                _mm256_setr_epi32(h0, h0, h0, h0, h1, h1, h1, h1),
                _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6),
            );
            let high = _mm256_slli_epi32::<8>(_mm256_and_si256(high, _mm256_set1_epi32(3)));
            let index = _mm256_or_si256(low, high);
            let grid = _mm512_i32gather_epi64::<8>(index, IQ2S_GRID.as_ptr() as *const i64);
            let negative = (x.add(34 + 8 * m) as *const u64).read_unaligned();
            *code = biased(grid, negative);
        }
        Unpacked {
            scales: nibble_pair_scales(x.add(74)),
            ..unpacked(codes, &[0; 16], Self::d(x))
        }
    }
}

/// IQ1_S: each two sub-blocks' eight grid entries (a quant byte and three high bits each) by
/// one gather; weights `8 g ± 1` (the sub-block's delta sign).
impl Unpack for Iq1S {
    grid_constants!();
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            let qh = |h: usize| (x.add(34 + 2 * (2 * m + h)) as *const u16).read_unaligned();
            let (h0, h1) = (qh(0), qh(1));
            let low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.add(2 + 8 * m) as *const _));
            let (a, b) = (i32::from(h0), i32::from(h1));
            let high = _mm256_srlv_epi32(
                _mm256_setr_epi32(a, a, a, a, b, b, b, b),
                _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9),
            );
            let high = _mm256_slli_epi32::<8>(_mm256_and_si256(high, _mm256_set1_epi32(7)));
            let index = _mm256_or_si256(low, high);
            let grid = _mm512_i32gather_epi64::<8>(index, IQ1S_GRID.as_ptr() as *const i64);
            let shift = |h: u16| if h & 0x8000 != 0 { 127i8 } else { -127i8 };
            let offsets = _mm512_mask_blend_epi8(
                0xFFFF_FFFF_0000_0000,
                _mm512_set1_epi8(shift(h0)),
                _mm512_set1_epi8(shift(h1)),
            );
            *code = _mm512_add_epi8(times_eight(grid), offsets);
        }
        let words = _mm256_cvtepu16_epi32(_mm_loadu_si128(x.add(34) as *const _));
        let s = _mm256_and_si256(_mm256_srli_epi32::<12>(words), _mm256_set1_epi32(7));
        Unpacked {
            scales: odd_scales_doubled(s),
            ..unpacked(codes, &[0; 16], Self::d(x))
        }
    }
}

/// Eight sub-blocks' values (i32 lanes) as `2 v + 1`, each in the lanes of both its halves.
/// Built in registers: scalar stores read back as a vector would stall store forwarding.
#[inline(always)]
unsafe fn odd_scales_doubled(v: __m256i) -> __m512i {
    let odd = _mm256_add_epi32(_mm256_add_epi32(v, v), _mm256_set1_epi32(1));
    let pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    _mm512_permutexvar_epi32(pairs, _mm512_zextsi256_si512(odd))
}

/// The eight sub-blocks' scales `2 (aux >> 28) + 1` of eight `aux` words, contiguous (IQ3_XXS)
/// or the second word of each 8 bytes (IQ2_XXS).
#[inline(always)]
unsafe fn top_nibble_scales(at: *const u8, stride: usize) -> __m512i {
    let tops = if stride == 4 {
        _mm256_srli_epi32::<28>(_mm256_loadu_si256(at as *const _))
    } else {
        let words = _mm512_loadu_si512(at.sub(4) as *const _);
        _mm512_cvtepi64_epi32(_mm512_srli_epi64::<60>(words))
    };
    odd_scales_doubled(tops)
}

/// IQ3_XXS: each sixteen grid entries by one gather, each two sub-blocks' signs by another.
impl Unpack for Iq3Xxs {
    grid_constants!();
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let (qs, aux) = (x.add(2), x.add(66));
        let word = |ib: usize| (aux.add(4 * ib) as *const u32).read_unaligned();
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            let index = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.add(16 * m) as *const _));
            let grid = _mm512_i32gather_epi32::<4>(index, IQ3XXS_GRID.as_ptr() as *const i32);
            *code = biased(grid, ksigns(word(2 * m), word(2 * m + 1)));
        }
        Unpacked {
            scales: top_nibble_scales(aux, 4),
            ..unpacked(codes, &[0; 16], Self::d(x))
        }
    }
}

/// IQ2_XXS: each two sub-blocks' eight grid entries (eight bytes each) by one gather, their
/// signs by another.
impl Unpack for Iq2Xxs {
    grid_constants!();
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let q = x.add(2);
        // Of each sub-block's eight bytes, the first four index the grid.
        let pick = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, -1, -1, -1, -1, -1, -1, -1, -1);
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            let pair = _mm_loadu_si128(q.add(16 * m) as *const _);
            let index = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(pair, pick));
            let grid = _mm512_i32gather_epi64::<8>(index, IQ2XXS_GRID.as_ptr() as *const i64);
            let aux = |h: usize| (q.add(16 * m + 8 * h + 4) as *const u32).read_unaligned();
            *code = biased(grid, ksigns(aux(0), aux(1)));
        }
        Unpacked {
            scales: top_nibble_scales(q.add(4), 8),
            ..unpacked(codes, &[0; 16], Self::d(x))
        }
    }
}

/// `8 g` of grid bytes `g` of -1, 0 and 1 (a byte-wise `<< 3`: the 16-bit shift's carries
/// cleared).
#[inline(always)]
unsafe fn times_eight(grid: __m512i) -> __m512i {
    _mm512_and_si512(_mm512_slli_epi16::<3>(grid), _mm512_set1_epi8(-8))
}

/// IQ1_M: each two sub-blocks' eight grid entries (a quant byte and three high bits each) by
/// one gather; weights `8 g ± 1`, the sign per eight weights from the fourth bit of their
/// nibble; a scale per 16 weights.
impl Unpack for Iq1M {
    grid_constants!();
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            let low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(x.add(8 * m) as *const _));
            let packed = (x.add(32 + 4 * m) as *const u32).read_unaligned() as i32;
            let nibbles = _mm256_and_si256(
                _mm256_srlv_epi32(
                    _mm256_set1_epi32(packed),
                    _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
                ),
                _mm256_set1_epi32(15),
            );
            let high = _mm256_slli_epi32::<8>(_mm256_and_si256(nibbles, _mm256_set1_epi32(7)));
            let index = _mm256_or_si256(low, high);
            let grid = _mm512_i32gather_epi64::<8>(index, IQ1S_GRID.as_ptr() as *const i64);
            let minus = _mm256_test_epi32_mask(nibbles, _mm256_set1_epi32(8));
            let offsets =
                _mm512_mask_blend_epi64(minus, _mm512_set1_epi8(-127), _mm512_set1_epi8(127));
            *code = _mm512_add_epi8(times_eight(grid), offsets);
        }
        // Scale `s` is bits `3 (s % 4)..` of 16-bit word `s / 4`.
        let words = _mm512_cvtepu16_epi32(_mm256_castsi128_si256(_mm_loadl_epi64(
            x.add(48) as *const _
        )));
        let quads = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        let shifts = _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9);
        let s = _mm512_and_si512(
            _mm512_srlv_epi32(_mm512_permutexvar_epi32(quads, words), shifts),
            _mm512_set1_epi32(7),
        );
        Unpacked {
            scales: _mm512_add_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(1)),
            ..unpacked(codes, &[0; 16], Self::d(x))
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
        let mut acc =
            _mm512_mullo_epi32(_mm512_mullo_epi32(sums, _mm512_set1_epi32(-128)), u.scales);
        for (m, codes) in u.codes.iter().enumerate() {
            let quants = _mm512_loadu_si512(yb.add(BlockQ8K::QS + 64 * m) as *const _);
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
#[allow(clippy::too_many_arguments)]
unsafe fn gemm<T: Unpack>(
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
    transpose_tokens(a, lda, nt, nsb, &mut tokens);
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

#[cfg(test)]
mod tests {
    use super::super::{DotKernel, GemmKernel};
    use crate::dot::scalar_kernel;

    /// Both tiles and both single-pair kernels of every grid type (this file's, where the CPU
    /// has VNNI, and `iq_grid.rs`'s AVX2 ones), and this file's of Q2_K and Q3_K, give the scalar twin's bits for every (row,
    /// token), the tiles across token counts
    /// that fill, split and leave partial sixteen-token groups, and row counts with partial
    /// eight-row chunks.
    #[test]
    fn tiles_equal_the_scalar_twin_bit_for_bit() {
        if !crate::cpu::has_avx2_fma_f16c() {
            return;
        }
        use super::super::iq_grid as avx2;
        use super::*;
        type Case = (
            QuantType,
            Option<(GemmKernel, DotKernel)>,
            GemmKernel,
            DotKernel,
        );
        #[rustfmt::skip]
        let cases: [Case; 11] = [
            (QuantType::IQ2_XXS, Some((avx2::gemm_iq2_xxs, avx2::iq2_xxs_q8_k)), gemm_iq2_xxs_vnni, iq2_xxs_q8_k_vnni),
            (QuantType::IQ2_XS, Some((avx2::gemm_iq2_xs, avx2::iq2_xs_q8_k)), gemm_iq2_xs_vnni, iq2_xs_q8_k_vnni),
            (QuantType::IQ2_S, Some((avx2::gemm_iq2_s, avx2::iq2_s_q8_k)), gemm_iq2_s_vnni, iq2_s_q8_k_vnni),
            (QuantType::IQ3_XXS, Some((avx2::gemm_iq3_xxs, avx2::iq3_xxs_q8_k)), gemm_iq3_xxs_vnni, iq3_xxs_q8_k_vnni),
            (QuantType::IQ3_S, Some((avx2::gemm_iq3_s, avx2::iq3_s_q8_k)), gemm_iq3_s_vnni, iq3_s_q8_k_vnni),
            (QuantType::IQ1_S, Some((avx2::gemm_iq1_s, avx2::iq1_s_q8_k)), gemm_iq1_s_vnni, iq1_s_q8_k_vnni),
            (QuantType::IQ1_M, Some((avx2::gemm_iq1_m, avx2::iq1_m_q8_k)), gemm_iq1_m_vnni, iq1_m_q8_k_vnni),
            (QuantType::TQ1_0, Some((avx2::gemm_tq1_0, avx2::tq1_0_q8_k)), gemm_tq1_0_vnni, tq1_0_q8_k_vnni),
            (QuantType::TQ2_0, Some((avx2::gemm_tq2_0, avx2::tq2_0_q8_k)), gemm_tq2_0_vnni, tq2_0_q8_k_vnni),
            (QuantType::Q2_K, None, gemm_q2_k_vnni, q2_k_q8_k_vnni),
            (QuantType::Q3_K, None, gemm_q3_k_vnni, q3_k_q8_k_vnni),
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (n, rows, max_tokens) = (3 * QK_K, 19, 35);
        for (ty, avx2_kernels, vnni, vnni_pair) in cases {
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
            let mut kernels: Vec<GemmKernel> = avx2_kernels.iter().map(|k| k.0).collect();
            let mut pairs: Vec<DotKernel> = avx2_kernels.iter().map(|k| k.1).collect();
            if crate::cpu::has_vnni() {
                kernels.push(vnni);
                pairs.push(vnni_pair);
            }
            for (k, &kernel) in pairs.iter().enumerate() {
                for t in 0..max_tokens {
                    for r in 0..rows {
                        let (row, act) = (&w[r * rb..(r + 1) * rb], &a[t * ab..(t + 1) * ab]);
                        // SAFETY: the CPU has the kernels' features; lengths as validated.
                        let (got, expect) = unsafe { (kernel(row, act, n), twin(row, act, n)) };
                        assert!(same(got, expect), "{ty} pair kernel {k} at t{t} r{r}");
                    }
                }
            }
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
