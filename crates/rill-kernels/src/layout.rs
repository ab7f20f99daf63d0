//! How a weight matrix's rows lay out their blocks.
//!
//! GGUF stores every 32-element block with its f16 scale fields in front of its quants, so a
//! kernel that wants eight blocks' scales in one vector has to gather them, two bytes out of
//! every 18-34. When one token is decoded, every row's scales are used once, and that gather was
//! a tenth to a quarter of the decode kernels' instructions. The **scales-first** layout keeps
//! each row the same size and in the same place but puts the row's `d` fields first, then (Q4_1,
//! Q5_1) its `m` fields, then the quant parts of its blocks in order: eight scales are one load.
//! The values, and so every result, are bit for bit those of the GGUF layout.

use crate::error::check_len;
use crate::{cpu, KernelError, QuantType};

/// The layout of a weight matrix's rows (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightLayout {
    /// As in the GGUF file: each block's scale fields, then its quants.
    #[default]
    Blocks,
    /// Per row: every block's `d`, then every block's `m` (types with one), then every block's
    /// quant part.
    ScalesFirst,
}

impl WeightLayout {
    /// The layout the fast kernels of this CPU read `ty` best in: scales first for the
    /// 32-element block types where the tiled SIMD kernels run, blocks otherwise.
    pub fn fastest_for(ty: QuantType) -> WeightLayout {
        if scale_field_bytes(ty).is_some() && cpu::has_avx2_fma_f16c() {
            WeightLayout::ScalesFirst
        } else {
            WeightLayout::Blocks
        }
    }
}

/// Bytes of f16 scale fields at the start of a block of the types that have a scales-first
/// layout: 2 (`d`) or 4 (`d`, `m`).
pub(crate) fn scale_field_bytes(ty: QuantType) -> Option<usize> {
    match ty {
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => Some(2),
        QuantType::Q4_1 | QuantType::Q5_1 => Some(4),
        _ => None,
    }
}

/// Checks `src`/`dst` for `ty` rows of `n_cols` and returns (block bytes, scale field bytes,
/// blocks per row, row bytes).
fn row_shape(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &[u8],
) -> Result<(usize, usize, usize, usize), KernelError> {
    let fields = scale_field_bytes(ty).ok_or(KernelError::Unsupported {
        ty,
        op: "the scales-first layout",
    })?;
    let row_bytes = ty.row_bytes_checked(n_cols)?;
    check_len("destination", src.len(), dst.len())?;
    if row_bytes == 0 || !src.len().is_multiple_of(row_bytes) {
        return Err(KernelError::LengthMismatch {
            what: "whole rows of weights",
            expected: src.len().next_multiple_of(row_bytes.max(1)),
            actual: src.len(),
        });
    }
    Ok((
        ty.block_bytes(),
        fields,
        n_cols / ty.block_size(),
        row_bytes,
    ))
}

/// Rewrites whole rows of `n_cols` elements of `ty` from the GGUF block layout (`src`) into the
/// scales-first layout (`dst`, the same size).
pub fn repack_scales_first(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    let (bb, fields, nb, row_bytes) = row_shape(ty, n_cols, src, dst)?;
    for (s, d) in src
        .chunks_exact(row_bytes)
        .zip(dst.chunks_exact_mut(row_bytes))
    {
        let (heads, quants) = d.split_at_mut(fields * nb);
        for (b, block) in s.chunks_exact(bb).enumerate() {
            for f in 0..fields / 2 {
                heads[2 * (f * nb + b)..][..2].copy_from_slice(&block[2 * f..2 * f + 2]);
            }
            quants[(bb - fields) * b..][..bb - fields].copy_from_slice(&block[fields..]);
        }
    }
    Ok(())
}

/// The inverse of [`repack_scales_first`]: scales-first rows (`src`) back into GGUF blocks.
pub fn unpack_scales_first(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    let (bb, fields, nb, row_bytes) = row_shape(ty, n_cols, src, dst)?;
    for (s, d) in src
        .chunks_exact(row_bytes)
        .zip(dst.chunks_exact_mut(row_bytes))
    {
        let (heads, quants) = s.split_at(fields * nb);
        for (b, block) in d.chunks_exact_mut(bb).enumerate() {
            for f in 0..fields / 2 {
                block[2 * f..2 * f + 2].copy_from_slice(&heads[2 * (f * nb + b)..][..2]);
            }
            block[fields..].copy_from_slice(&quants[(bb - fields) * b..][..bb - fields]);
        }
    }
    Ok(())
}
