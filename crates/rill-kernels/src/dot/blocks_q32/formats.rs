//! The 32-element block formats of the tiled kernels: how each unpacks its quants into bytes
//! and its scales, offsets and mins (see the parent module for the arithmetic they feed).

use std::arch::x86_64::*;

use super::*;

/// A 32-element weight block format and the activation format it pairs with.
pub(crate) trait Q32 {
    /// Weight block bytes.
    const WB: usize;
    /// Activation block bytes (34 for Q8_0, 36 for Q8_1).
    const AB: usize;
    /// Offset of the 32 activation quants inside an activation block.
    const AQ: usize;
    /// Where the weight block's min comes from ([`Mins::None`]: the type has no min term).
    const WMIN: Mins = Mins::None;
    /// Where the activation block's (scaled) sum that meets the min comes from.
    const AMIN: Mins = Mins::None;
    /// There is a min term: per block, the weight's min times the activation block's sum.
    const HAS_MIN: bool = !matches!(Self::WMIN, Mins::None);
    /// Unpacked quants are signed (multiplied with the sign trick) rather than unsigned.
    const SIGNED: bool;
    /// Bytes of f16 fields (`d`, and `m` for the min types) at the start of a block; the quant
    /// part (high bits, then nibbles or bytes) follows.
    const QOFF: usize;
    /// The block's scale is one e8m0 byte (MXFP4: half its power of two), not an f16.
    const E8M0: bool = false;
    /// The 32 quants of the quant part at `x`, element `i` in byte `i`.
    unsafe fn unpack(x: *const u8) -> __m256i;
    /// What [`Q32::unpack_unsigned`] adds to every quant of a signed type (0 for the unsigned
    /// ones): the 512-bit tiles multiply unsigned codes and take `OFFSET · Σ y` back out of the
    /// integer lane sums, which is exact.
    const OFFSET: i32 = 0;
    /// The 32 quants plus [`Q32::OFFSET`], as unsigned bytes.
    #[inline(always)]
    unsafe fn unpack_unsigned(x: *const u8) -> __m256i {
        Self::unpack(x)
    }
}

/// 16 packed bytes → 32 bytes: low nibbles (elements 0..16) then high nibbles (16..32).
#[inline(always)]
unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    // A broadcast load (no shuffle-port work), then the upper half shifted by a nibble: a
    // 64-bit shift moves the next byte's bits into each byte's high nibble, which the mask drops.
    let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(p as *const __m128i));
    let shifted = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
}

/// 32 bits → 32 bytes, 0xFF where the bit is set.
#[inline(always)]
unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
    let x32 = (p as *const u32).read_unaligned() as i32;
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

#[inline(always)]
pub(super) unsafe fn loadu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

pub(crate) struct Q40;
pub(crate) struct Q41;
pub(crate) struct Q50;
pub(crate) struct Q51;
pub(crate) struct Q80;

impl Q32 for Q40 {
    const WB: usize = 18;
    const AB: usize = 34;
    const AQ: usize = 2;
    const SIGNED: bool = true;
    const QOFF: usize = 2;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> __m256i {
        _mm256_sub_epi8(bytes_from_nibbles_32(x), _mm256_set1_epi8(8))
    }
    const OFFSET: i32 = 8;
    #[inline(always)]
    unsafe fn unpack_unsigned(x: *const u8) -> __m256i {
        bytes_from_nibbles_32(x)
    }
}

impl Q32 for Q41 {
    const WB: usize = 20;
    const AB: usize = 36;
    const AQ: usize = 4;
    const WMIN: Mins = Mins::Field;
    const AMIN: Mins = Mins::Field;
    const SIGNED: bool = false;
    const QOFF: usize = 4;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> __m256i {
        bytes_from_nibbles_32(x)
    }
}

/// Q5_0's element is `d · (u - 16)` with `u` the unsigned 5-bit code, so its dot product is
/// taken as `d · dy · Σ u·y` plus the min term `(-16 · d) · (dy · Σ y)`: unsigned weight codes
/// need no per-pair sign fix-up in the inner loop (a quarter of its instructions), and the
/// activation sums cost one pass per activation row.
impl Q32 for Q50 {
    const WB: usize = 22;
    const AB: usize = 34;
    const AQ: usize = 2;
    const WMIN: Mins = Mins::Scaled(-16.0);
    const AMIN: Mins = Mins::QuantSum(2);
    const SIGNED: bool = false;
    const QOFF: usize = 2;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> __m256i {
        let lo = bytes_from_nibbles_32(x.add(4));
        let hi = _mm256_and_si256(bytes_from_bits_32(x), _mm256_set1_epi8(0x10));
        _mm256_or_si256(lo, hi)
    }
}

impl Q32 for Q51 {
    const WB: usize = 24;
    const AB: usize = 36;
    const AQ: usize = 4;
    const WMIN: Mins = Mins::Field;
    const AMIN: Mins = Mins::Field;
    const SIGNED: bool = false;
    const QOFF: usize = 4;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> __m256i {
        let lo = bytes_from_nibbles_32(x.add(4));
        let hi = _mm256_and_si256(bytes_from_bits_32(x), _mm256_set1_epi8(0x10));
        _mm256_or_si256(lo, hi)
    }
}

impl Q32 for Q80 {
    const WB: usize = 34;
    const AB: usize = 34;
    const AQ: usize = 2;
    const SIGNED: bool = true;
    const QOFF: usize = 2;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> __m256i {
        loadu(x)
    }
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn unpack_unsigned(x: *const u8) -> __m256i {
        _mm256_xor_si256(loadu(x), _mm256_set1_epi8(-128))
    }
}

/// The 32 levels that 16 bytes of nibble indices at `x` pick from `levels` (`pshufb`, the table
/// in both 128-bit lanes), each byte xor-ed with `flip`: 0 gives the signed levels, -128 the
/// levels plus 128 as unsigned bytes (the sign bit flipped).
#[inline(always)]
unsafe fn table_levels(levels: &[i8; 16], x: *const u8, flip: i8) -> __m256i {
    let table = _mm_loadu_si128(levels.as_ptr() as *const __m128i);
    let table = _mm_xor_si128(table, _mm_set1_epi8(flip));
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), bytes_from_nibbles_32(x))
}

/// IQ4_NL: Q4_0's block (an f16 `d`, 16 bytes of nibbles) whose nibbles index a table of 16
/// signed levels instead of standing for `q - 8`.
pub(crate) struct Iq4Nl;

impl Q32 for Iq4Nl {
    const WB: usize = 18;
    const AB: usize = 34;
    const AQ: usize = 2;
    const SIGNED: bool = true;
    const QOFF: usize = 2;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> __m256i {
        table_levels(&crate::dequant::IQ4_LEVELS, x, 0)
    }
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn unpack_unsigned(x: *const u8) -> __m256i {
        table_levels(&crate::dequant::IQ4_LEVELS, x, -128)
    }
}

/// MXFP4: an e8m0 scale byte and 16 bytes of nibbles indexing the FP4 (e2m1) levels, doubled
/// to integers (the scale is taken as half its power of two).
pub(crate) struct Mxfp4;

impl Q32 for Mxfp4 {
    const WB: usize = 17;
    const AB: usize = 34;
    const AQ: usize = 2;
    const SIGNED: bool = true;
    const QOFF: usize = 1;
    const E8M0: bool = true;
    #[inline(always)]
    unsafe fn unpack(x: *const u8) -> __m256i {
        table_levels(&crate::dequant::FP4_LEVELS, x, 0)
    }
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn unpack_unsigned(x: *const u8) -> __m256i {
        table_levels(&crate::dequant::FP4_LEVELS, x, -128)
    }
}
