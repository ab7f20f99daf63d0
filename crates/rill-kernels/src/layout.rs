//! How a weight matrix's rows lay out their blocks.
//!
//! GGUF stores every 32-element block with its f16 scale fields in front of its quants, so a
//! kernel that wants eight blocks' scales in one vector has to gather them, two bytes out of
//! every 18-34. When one token is decoded, every row's scales are used once, and that gather was
//! a tenth to a quarter of the decode kernels' instructions. The **scales-first** layout keeps
//! each row the same size and in the same place but puts the row's `d` fields first, then (Q4_1,
//! Q5_1) its `m` fields, then the quant parts of its blocks in order: eight scales are one load.
//! The values, and so every result, are bit for bit those of the GGUF layout.
//!
//! The **row-interleaved** layout (on CPUs with AVX512-VNNI) goes further: sixteen rows'
//! blocks side by side, so that one 512-bit register holds elements of each of sixteen rows
//! and a block's integer dot product completes inside each lane (see `dot/interleaved_q32.rs`). Its
//! kernels sum each block (K-quants: each super-block) exactly before one f32 step, a different
//! rounding order from the other layouts', so it has its own canonical bits (the same for a row
//! alone and in any batch). Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL and MXFP4 keep their size and take
//! 8-bit activations; IQ4_XS and Q5_K take their 8-bit activations too, hold their sub-block scales
//! decoded (138 bytes per 256 elements against 136, 180 against 176) and keep their blocks'
//! bits (their super-block sums were exact integers already); Q4_K holds its codes as nibbles
//! with decoded scales and mins (148 bytes per 256 elements against 144) and takes 8-bit
//! activations (the blocks' bits again) or, in place of float ones, 16-bit activations
//! ([`Activations::Int16`]), as Q6_K does, whose codes are bytes (274 against 210).

use crate::dequant::scale_min_k4;
use crate::error::check_len;
use crate::{cpu, Activations, KernelError, QuantType, QK_K};

/// The layout of a weight matrix's rows (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightLayout {
    /// As in the GGUF file: each block's scale fields, then its quants.
    #[default]
    Blocks,
    /// Per row: every block's `d`, then every block's `m` (types with one), then every block's
    /// quant part.
    ScalesFirst,
    /// Groups of 16 rows, block by block: the group's sixteen `d` (and `m`, or the K-quants'
    /// `dmin` and decoded sub-block scales and mins), then the quants side by side, sixteen
    /// rows to a 512-bit register (see each type's `GROUP_BLOCK_*` below). Q4_0, Q4_1, Q5_0,
    /// Q8_0, IQ4_NL, MXFP4, IQ4_XS, Q5_K, Q4_K and Q6_K; the row count a multiple of 16.
    RowInterleaved,
    /// Q6_K's groups of 16 rows for 8-bit activations: each super-block's sixteen `d` and
    /// sub-block scales, then each 32-element part's low nibbles as Q4_0's group block holds
    /// them and its two high bit planes (the file's size; `RowInterleaved` Q6_K holds whole
    /// code bytes for 16-bit activations).
    RowInterleavedNibbles,
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

impl WeightLayout {
    /// The layout and activation scheme the fast kernels of this CPU run a product of `n_rows`
    /// rows of `ty` best in, given the scheme the model asks for. Where the 512-bit kernels run
    /// ([`cpu::wide_tiles`]) and the rows come in whole groups of 16: Q4_0, Q4_1, Q5_0, Q8_0,
    /// IQ4_NL, MXFP4, IQ4_XS, Q5_K and Q4_K rows interleaved (8-bit activations as asked), Q6_K's
    /// as [`WeightLayout::RowInterleavedNibbles`], and Q4_K and Q6_K rows interleaved with
    /// [`Activations::Int16`] in place of [`Activations::Float`]. Otherwise [`WeightLayout::fastest_for`] (the file's
    /// blocks for float activations).
    pub fn fastest_for_product(
        ty: QuantType,
        n_rows: usize,
        activations: Activations,
    ) -> (WeightLayout, Activations) {
        if n_rows.is_multiple_of(ROW_GROUP) && cpu::wide_tiles() {
            match (ty, activations) {
                (
                    QuantType::Q4_0
                    | QuantType::Q4_1
                    | QuantType::Q5_0
                    | QuantType::Q8_0
                    | QuantType::IQ4_NL
                    | QuantType::MXFP4
                    | QuantType::IQ4_XS
                    | QuantType::Q5_K,
                    Activations::Int8 | Activations::Int8Refined,
                ) => return (WeightLayout::RowInterleaved, activations),
                // MXFP4 joined when gpt-oss-20b's shape measured its experts' block tiles at
                // ~190 GFLOP/s in prompts: interleaved, pp512 went from 25-29 to 47-48 tok/s
                // and tg64 from 4.7-4.8 to 6.1 (alternating runs, 2 threads).
                (QuantType::Q4_K | QuantType::Q6_K, Activations::Float) => {
                    return (WeightLayout::RowInterleaved, Activations::Int16)
                }
                // Q4_K, and Q6_K in the file's size (`RowInterleavedNibbles`), interleaved with
                // 8-bit activations at every width (2 threads, `down_bench`, 2048 rows of 256 to
                // 768 columns): 3.0-3.5x (Q4_K) and 3.8-4.1x (Q6_K) the blocks' tiles at 32
                // tokens, 1.4-1.7x and 1.15-1.3x at one token. Qwen3-1.7B's 2048 columns:
                // prefill 1.6-1.9x, decode ~1.5x. Gemma 3's 1024-column attention output took
                // its prompts from 827-902 to 1177-1252 tok/s (alternating runs, decode
                // unchanged within noise); Qwen3-30B-A3B's experts (768 columns) are read a few
                // rows at a time, where the blocks' tiles were slowest.
                (QuantType::Q4_K, Activations::Int8 | Activations::Int8Refined) => {
                    return (WeightLayout::RowInterleaved, activations)
                }
                (QuantType::Q6_K, Activations::Int8 | Activations::Int8Refined) => {
                    return (WeightLayout::RowInterleavedNibbles, activations)
                }
                _ => {}
            }
        }
        match activations {
            Activations::Float | Activations::Int16 => (WeightLayout::Blocks, Activations::Float),
            _ => (WeightLayout::fastest_for(ty), activations),
        }
    }

    /// Bytes per row of `n_cols` elements of `ty` in this layout (a group's bytes over 16 for
    /// the row-interleaved super-block types, whose groups hold decoded scales).
    pub fn row_bytes(self, ty: QuantType, n_cols: usize) -> Result<usize, KernelError> {
        let file_row = ty.row_bytes_checked(n_cols)?;
        let group_block = match (self, ty) {
            (WeightLayout::RowInterleaved, QuantType::Q6_K) => GROUP_BLOCK_Q6_K,
            (WeightLayout::RowInterleaved, QuantType::Q4_K) => GROUP_BLOCK_Q4_K,
            (WeightLayout::RowInterleaved, QuantType::IQ4_XS) => GROUP_BLOCK_IQ4_XS,
            (WeightLayout::RowInterleaved, QuantType::Q5_K) => GROUP_BLOCK_Q5_K,
            (WeightLayout::RowInterleavedNibbles, QuantType::Q6_K) => GROUP_BLOCK_Q6_K_NIBBLES,
            (WeightLayout::RowInterleavedNibbles, _) => {
                return Err(KernelError::Unsupported {
                    ty,
                    op: "the row-interleaved nibble layout",
                })
            }
            _ => return Ok(file_row),
        };
        (n_cols / QK_K)
            .checked_mul(group_block / ROW_GROUP)
            .ok_or(KernelError::Overflow)
    }
}

/// A repacking function: `(ty, n_cols, src, dst)`, whole rows (or groups) from the GGUF layout.
pub type Repack = fn(QuantType, usize, &[u8], &mut [u8]) -> Result<(), KernelError>;

/// Rows per group of the row-interleaved layout.
pub const ROW_GROUP: usize = 16;

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

/// Copies whole groups of 16 rows of `n_cols` elements between the GGUF layout and the
/// row-interleaved one (into it when `to_rows`, back otherwise).
fn relayout_rows(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &mut [u8],
    to_rows: bool,
) -> Result<(), KernelError> {
    match ty {
        QuantType::Q4_0
        | QuantType::Q4_1
        | QuantType::Q5_0
        | QuantType::Q8_0
        | QuantType::IQ4_NL
        | QuantType::MXFP4 => {}
        QuantType::Q6_K | QuantType::Q4_K | QuantType::Q5_K | QuantType::IQ4_XS if to_rows => {}
        QuantType::Q6_K | QuantType::Q4_K | QuantType::Q5_K | QuantType::IQ4_XS => {
            return Err(KernelError::Unsupported {
                ty,
                op: "unpacking row-interleaved super-block rows",
            })
        }
        _ => {
            return Err(KernelError::Unsupported {
                ty,
                op: "the row-interleaved layout",
            })
        }
    };
    let file_group = ty
        .row_bytes_checked(n_cols)?
        .checked_mul(ROW_GROUP)
        .ok_or(KernelError::Overflow)?;
    let packed_group = WeightLayout::RowInterleaved
        .row_bytes(ty, n_cols)?
        .checked_mul(ROW_GROUP)
        .ok_or(KernelError::Overflow)?;
    let (src_group, dst_group) = if to_rows {
        (file_group, packed_group)
    } else {
        (packed_group, file_group)
    };
    if src_group == 0 || !src.len().is_multiple_of(src_group) {
        return Err(KernelError::LengthMismatch {
            what: "whole groups of 16 rows of weights",
            expected: src.len().next_multiple_of(src_group.max(1)),
            actual: src.len(),
        });
    }
    check_len("destination", src.len() / src_group * dst_group, dst.len())?;
    for (s, d) in src
        .chunks_exact(src_group)
        .zip(dst.chunks_exact_mut(dst_group))
    {
        let nb = n_cols / ty.block_size();
        match ty {
            QuantType::Q6_K => relayout_q6_k_group(s, d, nb),
            QuantType::Q4_K => relayout_q4_k_group(s, d, nb),
            QuantType::IQ4_XS => relayout_iq4_xs_group(s, d, nb),
            QuantType::Q5_K => relayout_q5_k_group(s, d, nb),
            _ => relayout_32_group(ty, s, d, nb, to_rows),
        }
    }
    Ok(())
}

/// Rewrites whole groups of 16 rows of `n_cols` Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, IQ4_XS, Q5_K,
/// Q4_K or Q6_K elements from the GGUF block layout (`src`) into the row-interleaved layout (`dst`: the
/// same size for the 32-element types, [`WeightLayout::row_bytes`] per row for the super-block
/// ones).
pub fn repack_rows_interleaved(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    relayout_rows(ty, n_cols, src, dst, true)
}

/// Rewrites whole groups of 16 GGUF Q6_K rows of `n_cols` elements (`src`) into the
/// [`WeightLayout::RowInterleavedNibbles`] layout (`dst`, the same size).
pub fn repack_rows_interleaved_nibbles(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    let group = WeightLayout::RowInterleavedNibbles
        .row_bytes(ty, n_cols)?
        .checked_mul(ROW_GROUP)
        .ok_or(KernelError::Overflow)?;
    if group == 0 || !src.len().is_multiple_of(group) {
        return Err(KernelError::LengthMismatch {
            what: "whole groups of 16 rows of weights",
            expected: src.len().next_multiple_of(group.max(1)),
            actual: src.len(),
        });
    }
    check_len("destination", src.len(), dst.len())?;
    for (s, d) in src.chunks_exact(group).zip(dst.chunks_exact_mut(group)) {
        relayout_q6_k_nibbles_group(s, d, n_cols / QK_K);
    }
    Ok(())
}

/// The inverse of [`repack_rows_interleaved`] (the 32-element types; the super-block types'
/// groups keep decoded scales and are not unpacked).
pub fn unpack_rows_interleaved(
    ty: QuantType,
    n_cols: usize,
    src: &[u8],
    dst: &mut [u8],
) -> Result<(), KernelError> {
    relayout_rows(ty, n_cols, src, dst, false)
}

/// Bytes of one block of a Q5_0 group: sixteen f16 `d` (32), sixteen rearranged high-bit words
/// (64), then the nibbles as four registers of sixteen 4-byte lanes (256).
pub(crate) const GROUP_BLOCK_Q5_0: usize = ROW_GROUP * 22;

/// The high-bit word of a Q5_0 block as this layout stores it: bit `8i + k` is the high bit of
/// element `4k + i`, so that one byte test per group `k` yields a mask over its bytes.
fn spread_high_bits(qh: u32) -> u32 {
    let mut h = 0u32;
    for k in 0..8 {
        for i in 0..4 {
            h |= ((qh >> (4 * k + i)) & 1) << (8 * i + k);
        }
    }
    h
}

/// The inverse of [`spread_high_bits`].
fn gather_high_bits(h: u32) -> u32 {
    let mut qh = 0u32;
    for k in 0..8 {
        for i in 0..4 {
            qh |= ((h >> (8 * i + k)) & 1) << (4 * k + i);
        }
    }
    qh
}

/// Bytes of one block of a Q8_0 group: sixteen f16 `d` (32), then the quants as eight
/// registers of sixteen 4-byte lanes (512).
pub(crate) const GROUP_BLOCK_Q8_0: usize = ROW_GROUP * 34;

/// Bytes of one super-block of a Q6_K group: sixteen f16 `d` (32), the sixteen sub-blocks'
/// scales of every row (16 × 16 i8), then the 6-bit codes as whole bytes, element pair by pair:
/// 32 bytes per pair, row `j`'s two codes at bytes `2j, 2j + 1` (4096). A 6-bit packing the
/// size of the GGUF rows decoded slower (its unpacking made decode compute-bound: 129-149 µs
/// against 96-102 per layer of Gemma's down projection, 2 threads).
pub(crate) const GROUP_BLOCK_Q6_K: usize = 32 + 256 + 4096;

/// Bytes of one super-block of a Q4_K group: sixteen f16 `d` (32) and `dmin` (32), the eight
/// sub-blocks' decoded 6-bit scales (8 × 16) and mins (8 × 16), then each 32-element
/// sub-block's codes as Q4_0's group block holds its block's nibbles (8 × 256): four elements
/// of a row to a 32-bit lane for the 8-bit kernel, spread into i16 pairs by one byte shuffle
/// for the 16-bit one.
pub(crate) const GROUP_BLOCK_Q4_K: usize = 64 + 128 + 128 + 2048;

/// The 256 6-bit codes (0..64) and sixteen sub-block scales of a GGUF Q6_K block.
pub(crate) fn q6_k_codes(b: &[u8]) -> ([u8; 256], [i8; 16]) {
    let mut codes = [0u8; 256];
    for n in 0..2 {
        let (ql, qh) = (&b[64 * n..64 * n + 64], &b[128 + 32 * n..128 + 32 * n + 32]);
        for l in 0..32 {
            let e = 128 * n + l;
            codes[e] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            codes[e + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            codes[e + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            codes[e + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    let mut scales = [0i8; 16];
    for (j, s) in scales.iter_mut().enumerate() {
        *s = b[192 + j] as i8;
    }
    (codes, scales)
}

/// The 256 4-bit codes and eight sub-blocks' (scale, min) of a GGUF Q4_K block.
pub(crate) fn q4_k_codes(b: &[u8]) -> ([u8; 256], [(u8, u8); 8]) {
    let mut codes = [0u8; 256];
    for j in 0..4 {
        for l in 0..32 {
            let q = b[16 + 32 * j + l];
            codes[64 * j + l] = q & 0x0F;
            codes[64 * j + 32 + l] = q >> 4;
        }
    }
    let mut scales = [(0u8, 0u8); 8];
    for (j, s) in scales.iter_mut().enumerate() {
        *s = scale_min_k4(j, &b[4..16]);
    }
    (codes, scales)
}

/// Writes row `r`'s 256 codes (their low nibbles) into a group super-block's nibble area,
/// each 32-element sub-block's as Q4_0's group block holds its block's: four 64-byte registers,
/// row `r`'s part `k` at `64k + 4r`, its low nibbles elements `4k..4k + 4` and its high ones
/// `16 + 4k..`.
fn put_sub_block_nibbles(area: &mut [u8], r: usize, codes: &[u8; 256]) {
    for (j, c) in codes.chunks_exact(32).enumerate() {
        for k in 0..4 {
            for i in 0..4 {
                let (lo, hi) = (c[4 * k + i] & 0x0F, c[16 + 4 * k + i] & 0x0F);
                area[256 * j + 64 * k + 4 * r + i] = lo | (hi << 4);
            }
        }
    }
}

/// Writes one GGUF K-quant row's `d`, `dmin`, decoded scales and mins and code nibbles into
/// row `r` of a group super-block (the part Q4_K's and Q5_K's groups share).
fn put_k_row(g: &mut [u8], r: usize, x: &[u8], codes: &[u8; 256], scales: &[(u8, u8); 8]) {
    g[2 * r..2 * r + 2].copy_from_slice(&x[0..2]);
    g[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&x[2..4]);
    for (j, &(sc, m)) in scales.iter().enumerate() {
        g[64 + 16 * j + r] = sc;
        g[192 + 16 * j + r] = m;
    }
    put_sub_block_nibbles(&mut g[320..], r, codes);
}

/// Row `r`'s part of a Q6_K group super-block's head, the same in both Q6_K layouts: its f16
/// `d` (bytes `2r..2r + 2`) and its sixteen scales (byte `32 + 16j + r`). Returns the row's
/// codes (0..63), which each layout places its own way.
fn put_q6_k_row_head(g: &mut [u8], r: usize, block: &[u8]) -> [u8; 256] {
    g[2 * r..2 * r + 2].copy_from_slice(&block[208..210]);
    let (codes, scales) = q6_k_codes(block);
    for (j, &sc) in scales.iter().enumerate() {
        g[32 + 16 * j + r] = sc as u8;
    }
    codes
}

/// Sixteen GGUF Q6_K rows of `nb` super-blocks (`src`) into one group (`dst`).
fn relayout_q6_k_group(src: &[u8], dst: &mut [u8], nb: usize) {
    let row_bytes = nb * 210;
    for b in 0..nb {
        let g = &mut dst[b * GROUP_BLOCK_Q6_K..(b + 1) * GROUP_BLOCK_Q6_K];
        for r in 0..ROW_GROUP {
            let codes = put_q6_k_row_head(g, r, &src[r * row_bytes + b * 210..][..210]);
            for p in 0..128 {
                g[288 + 32 * p + 2 * r] = codes[2 * p];
                g[288 + 32 * p + 2 * r + 1] = codes[2 * p + 1];
            }
        }
    }
}

/// Sixteen GGUF Q4_K rows of `nb` super-blocks (`src`) into one group (`dst`).
fn relayout_q4_k_group(src: &[u8], dst: &mut [u8], nb: usize) {
    let row_bytes = nb * 144;
    for b in 0..nb {
        let g = &mut dst[b * GROUP_BLOCK_Q4_K..(b + 1) * GROUP_BLOCK_Q4_K];
        for r in 0..ROW_GROUP {
            let x = &src[r * row_bytes + b * 144..r * row_bytes + (b + 1) * 144];
            let (codes, scales) = q4_k_codes(x);
            put_k_row(g, r, x, &codes, &scales);
        }
    }
}

/// Bytes of one super-block of an IQ4_XS group: sixteen f16 `d` (32), the eight sub-blocks'
/// signed scales `ls - 32` (8 × 16 i8), then each sub-block's index nibbles as Q4_0's group
/// block holds its block's (8 × 256): 138 bytes per row and 256 elements against the file's
/// 136.
pub(crate) const GROUP_BLOCK_IQ4_XS: usize = 32 + 128 + 2048;

/// Sixteen GGUF IQ4_XS rows of `nb` super-blocks (`src`) into one group (`dst`).
fn relayout_iq4_xs_group(src: &[u8], dst: &mut [u8], nb: usize) {
    let row_bytes = nb * 136;
    for b in 0..nb {
        let g = &mut dst[b * GROUP_BLOCK_IQ4_XS..(b + 1) * GROUP_BLOCK_IQ4_XS];
        for r in 0..ROW_GROUP {
            let x = &src[r * row_bytes + b * 136..r * row_bytes + (b + 1) * 136];
            g[2 * r..2 * r + 2].copy_from_slice(&x[0..2]);
            for j in 0..8 {
                g[32 + 16 * j + r] = crate::dequant::iq4_xs_scale(x, j) as i8 as u8;
                let (qs, area) = (8 + 16 * j, 160 + 256 * j);
                for k in 0..4 {
                    let at = area + 64 * k + 4 * r;
                    g[at..at + 4].copy_from_slice(&x[qs + 4 * k..qs + 4 * k + 4]);
                }
            }
        }
    }
}

/// Bytes of one super-block of a Q5_K group: Q4_K's group super-block (its codes' low nibbles),
/// then each sub-block's sixteen fifth-bit words rearranged as Q5_0's (8 × 64): 180 bytes per
/// row and 256 elements against the file's 176.
pub(crate) const GROUP_BLOCK_Q5_K: usize = 64 + 128 + 128 + 2048 + 512;

/// The 256 5-bit codes (0..32) and eight sub-blocks' (scale, min) of a GGUF Q5_K block.
fn q5_k_codes(b: &[u8]) -> ([u8; 256], [(u8, u8); 8]) {
    let (qh, qs) = (&b[16..48], &b[48..176]);
    let mut codes = [0u8; 256];
    for j in 0..4 {
        for l in 0..32 {
            let q = qs[32 * j + l];
            codes[64 * j + l] = (q & 0x0F) | (((qh[l] >> (2 * j)) & 1) << 4);
            codes[64 * j + 32 + l] = (q >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4);
        }
    }
    let mut scales = [(0u8, 0u8); 8];
    for (j, s) in scales.iter_mut().enumerate() {
        *s = scale_min_k4(j, &b[4..16]);
    }
    (codes, scales)
}

/// Sixteen GGUF Q5_K rows of `nb` super-blocks (`src`) into one group (`dst`).
fn relayout_q5_k_group(src: &[u8], dst: &mut [u8], nb: usize) {
    let row_bytes = nb * 176;
    for b in 0..nb {
        let g = &mut dst[b * GROUP_BLOCK_Q5_K..(b + 1) * GROUP_BLOCK_Q5_K];
        for r in 0..ROW_GROUP {
            let x = &src[r * row_bytes + b * 176..r * row_bytes + (b + 1) * 176];
            let (codes, scales) = q5_k_codes(x);
            put_k_row(g, r, x, &codes, &scales);
            for (j, c) in codes.chunks_exact(32).enumerate() {
                let high = (0..32).fold(0u32, |h, e| h | (u32::from(c[e] >> 4) << e));
                let at = 2368 + 64 * j + 4 * r;
                g[at..at + 4].copy_from_slice(&spread_high_bits(high).to_le_bytes());
            }
        }
    }
}

/// Bytes of one super-block of a Q6_K group in the nibble layout: sixteen f16 `d` (32), the
/// sixteen 16-element sub-blocks' scales (16 × 16 i8), each 32-element part's low nibbles as
/// Q4_0's group block holds its block's (8 × 256), then each part's two high bit planes, bit 4
/// then bit 5 of its codes, rearranged as Q5_0's high bits (8 × 128): 210 bytes per row and
/// 256 elements, the file's.
pub(crate) const GROUP_BLOCK_Q6_K_NIBBLES: usize = 32 + 256 + 2048 + 1024;

/// Sixteen GGUF Q6_K rows of `nb` super-blocks (`src`) into one nibble-layout group (`dst`).
fn relayout_q6_k_nibbles_group(src: &[u8], dst: &mut [u8], nb: usize) {
    let row_bytes = nb * 210;
    for b in 0..nb {
        let g = &mut dst[b * GROUP_BLOCK_Q6_K_NIBBLES..(b + 1) * GROUP_BLOCK_Q6_K_NIBBLES];
        for r in 0..ROW_GROUP {
            let codes = put_q6_k_row_head(g, r, &src[r * row_bytes + b * 210..][..210]);
            put_sub_block_nibbles(&mut g[288..], r, &codes);
            for (j, c) in codes.chunks_exact(32).enumerate() {
                for bit in 0..2 {
                    let plane =
                        (0..32).fold(0u32, |h, e| h | (u32::from((c[e] >> (4 + bit)) & 1) << e));
                    let at = 2336 + 128 * j + 64 * bit + 4 * r;
                    g[at..at + 4].copy_from_slice(&spread_high_bits(plane).to_le_bytes());
                }
            }
        }
    }
}

/// Bytes of one block of a Q4_0 group: sixteen f16 `d` (32), then the nibbles as four registers
/// of sixteen 4-byte lanes (256), as Q5_0's.
pub(crate) const GROUP_BLOCK_Q4_0: usize = ROW_GROUP * 18;

/// Bytes of one block of a Q4_1 group: sixteen f16 `d` (32) and `m` (32), then the nibbles
/// (256).
pub(crate) const GROUP_BLOCK_Q4_1: usize = ROW_GROUP * 20;

/// Bytes of one block of an MXFP4 group: sixteen E8M0 exponent bytes (16), then the nibbles
/// (256).
pub(crate) const GROUP_BLOCK_MXFP4: usize = ROW_GROUP * 17;

/// Rewrites sixteen GGUF rows of `nb` blocks of a 32-element type (`src`, consecutive rows)
/// into one group (`dst`, the same size), or back when `to_group` is false. Per block, the
/// group holds the sixteen `d` (and Q4_1's sixteen `m`; MXFP4's sixteen exponent bytes), Q5_0's sixteen high-bit words
/// rearranged ([`spread_high_bits`]), then each row's 4-byte parts of quants in register order:
/// part `k` of row `j` at `64k + 4j` (Q8_0's with their sign bits flipped: `q + 128` as an
/// unsigned byte, what the kernels multiply).
fn relayout_32_group(ty: QuantType, src: &[u8], dst: &mut [u8], nb: usize, to_group: bool) {
    // (GGUF block bytes, scale fields and the bytes of each (f16: 2, E8M0: 1), offset of the
    // quant parts in the block and in the group block, 4-byte quant parts, the bits flipped in
    // them)
    let (block, fields, field_bytes, quants_at, group_quants_at, parts, flip) = match ty {
        QuantType::Q4_0 | QuantType::IQ4_NL => (18, 1, 2, 2, 32, 4, 0),
        QuantType::MXFP4 => (17, 1, 1, 1, 16, 4, 0),
        QuantType::Q4_1 => (20, 2, 2, 4, 64, 4, 0),
        QuantType::Q5_0 => (22, 1, 2, 6, 96, 4, 0),
        _ => (34, 1, 2, 2, 32, 8, 0x80),
    };
    let (group_block, row_bytes) = (ROW_GROUP * block, nb * block);
    for b in 0..nb {
        let g = b * group_block;
        for r in 0..ROW_GROUP {
            let x = r * row_bytes + b * block;
            // (offset in the GGUF rows, offset in the group, length, bits flipped)
            let pieces = (0..fields)
                .map(|f| {
                    (
                        x + field_bytes * f,
                        g + ROW_GROUP * field_bytes * f + field_bytes * r,
                        field_bytes,
                        0,
                    )
                })
                .chain((0..parts).map(|k| {
                    (
                        x + quants_at + 4 * k,
                        g + group_quants_at + 64 * k + 4 * r,
                        4,
                        flip,
                    )
                }));
            for (in_rows, in_group, len, flip) in pieces {
                let (from, to) = if to_group {
                    (in_rows, in_group)
                } else {
                    (in_group, in_rows)
                };
                for i in 0..len {
                    dst[to + i] = src[from + i] ^ flip;
                }
            }
            if ty == QuantType::Q5_0 {
                // `qh` is rearranged, not copied.
                let (hx, hg) = (x + 2, g + 32 + 4 * r);
                let word = |at: usize| {
                    u32::from_le_bytes([src[at], src[at + 1], src[at + 2], src[at + 3]])
                };
                if to_group {
                    dst[hg..hg + 4].copy_from_slice(&spread_high_bits(word(hx)).to_le_bytes());
                } else {
                    dst[hx..hx + 4].copy_from_slice(&gather_high_bits(word(hg)).to_le_bytes());
                }
            }
        }
    }
}
