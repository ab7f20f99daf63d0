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

/// Copies whole rows of `n_cols` elements of `ty` from `src` to `dst` (the same size) between
/// the two layouts: into scales first when `to_scales_first`, back into GGUF blocks otherwise.
fn relayout(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &mut [u8],
    to_scales_first: bool,
) -> Result<(), KernelError> {
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
    let (bb, nb) = (ty.block_bytes(), n_cols / ty.block_size());
    let quant_bytes = bb - fields;
    for (s, d) in src
        .chunks_exact(row_bytes)
        .zip(dst.chunks_exact_mut(row_bytes))
    {
        // Each piece of block `b`: (offset in the GGUF row, offset in the scales-first row,
        // length): its f16 fields, then its quant part.
        for b in 0..nb {
            let fields_of = (0..fields / 2).map(|f| (b * bb + 2 * f, 2 * (f * nb + b), 2));
            let quants = (b * bb + fields, fields * nb + quant_bytes * b, quant_bytes);
            for (in_blocks, in_scales_first, len) in fields_of.chain([quants]) {
                let (from, to) = if to_scales_first {
                    (in_blocks, in_scales_first)
                } else {
                    (in_scales_first, in_blocks)
                };
                d[to..to + len].copy_from_slice(&s[from..from + len]);
            }
        }
    }
    Ok(())
}

/// Rewrites whole rows of `n_cols` elements of `ty` from the GGUF block layout (`src`) into the
/// scales-first layout (`dst`, the same size).
pub fn repack_scales_first(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    relayout(ty, n_cols, src, dst, true)
}

/// The inverse of [`repack_scales_first`]: scales-first rows (`src`) back into GGUF blocks.
pub fn unpack_scales_first(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    relayout(ty, n_cols, src, dst, false)
}
