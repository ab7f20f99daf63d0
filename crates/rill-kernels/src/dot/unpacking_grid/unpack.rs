//! How each type's super-block becomes the tile's unpacked form ([`Unpacked`]): `q + 128` of
//! its 256 weights and a scale per 16. The grid i-quants read their grids by 512-bit gathers
//! (sixteen u32 or eight u64 entries each) and take their signs as 64-bit masks; Q2_K and Q3_K
//! shift their 2-bit quants out of both sub-blocks' bytes at once, as TQ2_0 does; TQ1_0 takes 64
//! trits per byte multiply and two unsigned compares. Every scale is
//! built in registers: scalar stores read back as a vector would stall store forwarding on
//! decode's critical path.
//!
//! # Safety
//! As the parent module's: AVX512-F/BW/VNNI/VL, and blocks valid for their type's length.

use std::arch::x86_64::*;

use crate::dot::blocks_grid::{
    f16_at, GridSimd, Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3S, Iq3Xxs, Tq1, Tq2,
};
use crate::grid_quants::KSIGN_MASKS;
use crate::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::QuantType;

/// Q2_K and Q3_K, which have no grid.
pub(super) struct Q2K;
pub(super) struct Q3K;

/// A super-block unpacked into registers: `q + 128` of its 256 weights (register `m` holds
/// elements `64 m .. 64 m + 64`), the scale of each 16 weights, and the block's factor `d`.
pub(super) struct Unpacked {
    pub(super) codes: [__m512i; 4],
    pub(super) scales: __m512i,
    pub(super) d: f32,
    /// With [`Unpack::HAS_MIN`] (Q2_K): each 16 weights' min as i16 pairs (`min 2p` low, `min
    /// 2p + 1` high) and its factor `dmin`.
    pub(super) min_pairs: __m256i,
    pub(super) dmin: f32,
}

/// How a type's super-block is unpacked.
pub(super) trait Unpack {
    const TY: QuantType;
    /// Each 16 weights of a sub-block have a scale of their own (otherwise the two are one).
    const HALVES: bool;
    /// The weights have mins (Q2_K), met by the activations' sums of 16.
    const HAS_MIN: bool = false;
    /// Every scale is one (the ternary types): decode skips the scale multiplies.
    const UNIT_SCALES: bool = false;
    unsafe fn unpack(x: *const u8) -> Unpacked;
}

/// The grid types' constants for [`Unpack`].
macro_rules! grid_constants {
    () => {
        const TY: QuantType = <Self as GridSimd>::TY;
        const HALVES: bool = <Self as GridSimd>::HALVES;
    };
}

/// An [`Unpacked`] without mins.
#[inline(always)]
unsafe fn unpacked(codes: [__m512i; 4], scales: __m512i, d: f32) -> Unpacked {
    Unpacked {
        codes,
        scales,
        d,
        min_pairs: _mm256_setzero_si256(),
        dmin: 0.0,
    }
}

/// Bytes of `q` times `power` (the same factor in both bytes of each 16-bit lane), modulo
/// 256: the even and the odd bytes multiplied apart, as the single-pair kernel's byte multiply.
#[inline(always)]
unsafe fn mul_bytes_512(q: __m512i, power: __m512i) -> __m512i {
    let low = _mm512_set1_epi16(0x00FF);
    let even = _mm512_and_si512(_mm512_mullo_epi16(q, power), low);
    let odd = _mm512_mullo_epi16(_mm512_andnot_si512(low, q), power);
    _mm512_or_si512(even, odd)
}

/// TQ1_0's codes `trit + 128` from the fixed-point bytes `v`: 127, plus one from 86 and one
/// more from 171 (the trit is `(3 v) >> 8`, less one).
#[inline(always)]
unsafe fn trit_codes(v: __m512i) -> __m512i {
    let one = _mm512_set1_epi8(1);
    let base = _mm512_set1_epi8(127);
    let from_86 = _mm512_cmpge_epu8_mask(v, _mm512_set1_epi8(86));
    let from_171 = _mm512_cmpge_epu8_mask(v, _mm512_set1_epi8(171u8 as i8));
    let codes = _mm512_mask_add_epi8(base, from_86, base, one);
    _mm512_mask_add_epi8(codes, from_171, codes, one)
}

/// Each dword `x` of the table as `x` in both of its 16-bit halves.
const fn in_both_halves(mut table: [[i32; 16]; 4]) -> [[i32; 16]; 4] {
    let mut r = 0;
    while r < table.len() {
        let mut i = 0;
        while i < 16 {
            table[r][i] *= 0x1_0001;
            i += 1;
        }
        r += 1;
    }
    table
}

/// TQ1_0, 64 trits at a time (the single-pair kernel's register form takes 32): register 0
/// holds trits 0 and 1 of `qs[0..32]` (elements 0..64), register 1 trits 2 and 3, register 2
/// trit 4 and trits 0 and 1 of `qs[32..48]`, register 3 that part's trits 2-4 and the four
/// trits of each `qh` byte (elements 240 + 4 i + j: trit `i` of `qh[j]`).
impl Unpack for Tq1 {
    grid_constants!();
    const UNIT_SCALES: bool = true;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let qs0 = _mm256_loadu_si256(x as *const __m256i);
        let qs1 = _mm_loadu_si128(x.add(32) as *const __m128i);
        let qh = _mm_set1_epi32((x.add(48) as *const i32).read_unaligned());
        let inputs = [
            _mm512_broadcast_i64x4(qs0),
            _mm512_broadcast_i64x4(qs0),
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(qs0),
                _mm256_broadcastsi128_si256(qs1),
            ),
            _mm512_inserti32x4::<3>(_mm512_broadcast_i32x4(qs1), qh),
        ];
        // Each byte's power of three in both bytes of its 16-bit lane, per 128-bit lane:
        // register 0 1, 1, 3, 3; register 1 9, 9, 27, 27; register 2 81, 81, 1, 3; register 3
        // 9, 27, 81, and in the `qh` lane 3^i for dword i (dword 0 first).
        const POWERS: [[i32; 16]; 4] = in_both_halves([
            [1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3],
            [9, 9, 9, 9, 9, 9, 9, 9, 27, 27, 27, 27, 27, 27, 27, 27],
            [81, 81, 81, 81, 81, 81, 81, 81, 1, 1, 1, 1, 3, 3, 3, 3],
            [9, 9, 9, 9, 27, 27, 27, 27, 81, 81, 81, 81, 1, 3, 9, 27],
        ]);
        let powers = POWERS.map(|lanes| _mm512_loadu_si512(lanes.as_ptr() as *const _));
        let mut codes = [_mm512_setzero_si512(); 4];
        for ((code, &input), &power) in codes.iter_mut().zip(&inputs).zip(&powers) {
            *code = trit_codes(mul_bytes_512(input, power));
        }
        unpacked(codes, _mm512_set1_epi32(1), <Self as GridSimd>::d(x))
    }
}

/// TQ2_0: its 2-bit codes are Q2_K's layout (`q` in 0..3 for the trit plus one).
impl Unpack for Tq2 {
    grid_constants!();
    const UNIT_SCALES: bool = true;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> Unpacked {
        let mut codes = [_mm512_setzero_si512(); 4];
        for (m, code) in codes.iter_mut().enumerate() {
            *code = _mm512_add_epi8(two_bit_quants(x, m), _mm512_set1_epi8(127));
        }
        unpacked(codes, _mm512_set1_epi32(1), <Self as GridSimd>::d(x))
    }
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
        unpacked(
            codes,
            _mm512_sub_epi32(six_bits, _mm512_set1_epi32(32)),
            f16_at(x.add(108)),
        )
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
            min_pairs,
            dmin: f16_at(x.add(82)),
            ..unpacked(codes, scales, f16_at(x.add(80)))
        }
    }
}

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
        // Scale `j` of each 32 weights is nibble `j`.
        let packed = (x.add(106) as *const u32).read_unaligned() as i32;
        let nibbles = _mm256_srlv_epi32(
            _mm256_set1_epi32(packed),
            _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
        );
        let s = _mm256_and_si256(nibbles, _mm256_set1_epi32(15));
        unpacked(codes, odd_scales_doubled(s), Self::d(x))
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
    sign_masks(fields_of_two::<7>(first as i32, second as i32))
}

/// The first four `BITS`-bit fields of `first` (from bit 0 up), then those of `second`, as
/// i32 lanes.
#[inline(always)]
unsafe fn fields_of_two<const BITS: i32>(first: i32, second: i32) -> __m256i {
    let (a, b) = (first, second);
    let shifted = _mm256_srlv_epi32(
        _mm256_setr_epi32(a, a, a, a, b, b, b, b),
        _mm256_setr_epi32(0, BITS, 2 * BITS, 3 * BITS, 0, BITS, 2 * BITS, 3 * BITS),
    );
    _mm256_and_si256(shifted, _mm256_set1_epi32((1 << BITS) - 1))
}

/// Two sub-blocks' eight grid indices: the quant bytes at `low`, each with its `BITS` high
/// bits from `first` (the first sub-block's four) or `second` as bits 8 and up.
#[inline(always)]
unsafe fn grid_indices<const BITS: i32>(low: *const u8, first: i32, second: i32) -> __m256i {
    let low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(low as *const _));
    _mm256_or_si256(
        low,
        _mm256_slli_epi32::<8>(fields_of_two::<BITS>(first, second)),
    )
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
        unpacked(codes, nibble_pair_scales(x.add(66)), Self::d(x))
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
            let (h0, h1) = (i32::from(*x.add(66 + 2 * m)), i32::from(*x.add(67 + 2 * m)));
            let index = grid_indices::<2>(x.add(2 + 8 * m), h0, h1);
            let grid = _mm512_i32gather_epi64::<8>(index, IQ2S_GRID.as_ptr() as *const i64);
            let negative = (x.add(34 + 8 * m) as *const u64).read_unaligned();
            *code = biased(grid, negative);
        }
        unpacked(codes, nibble_pair_scales(x.add(74)), Self::d(x))
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
            let index = grid_indices::<3>(x.add(2 + 8 * m), i32::from(h0), i32::from(h1));
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
        unpacked(codes, odd_scales_doubled(s), Self::d(x))
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
        unpacked(codes, top_nibble_scales(aux, 4), Self::d(x))
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
        unpacked(codes, top_nibble_scales(q.add(4), 8), Self::d(x))
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
        unpacked(
            codes,
            _mm512_add_epi32(_mm512_add_epi32(s, s), _mm512_set1_epi32(1)),
            Self::d(x),
        )
    }
}
