//! Half-precision helpers shared by the scalar code.
//!
//! The scalar paths use the `half` crate's conversions, which are exact for f16 -> f32 and round
//! to nearest-even for f32 -> f16, exactly like ggml's `GGML_FP32_TO_FP16`.

#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

#[inline(always)]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// bf16 is the upper half of an f32, so widening is a shift.
#[inline(always)]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Reads a little-endian u16 at byte offset `off`.
#[inline(always)]
pub(crate) fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Reads a little-endian f16 at byte offset `off` and widens it.
#[inline(always)]
pub(crate) fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(rd_u16(b, off))
}

/// Reads a little-endian f32 at byte offset `off`.
#[inline(always)]
pub(crate) fn rd_f32(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
