//! What one cached key or value is stored as, and read access for the attention kernels.
//!
//! Keys and values each have their own element type (llama.cpp's `-ctk` / `-ctv`): f32 (the
//! exact path), f16, or the block types Q8_0 and Q4_0 (32 elements per block with one f16 scale,
//! quantized as ggml's reference quantizers do). A block-typed row is dequantized into f32 when
//! read, so attention over it runs the f32 kernels on exactly the stored values.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rill_kernels::attention::{prefetch, CachePart};
use rill_kernels::ops::{self, KvView};
use rill_kernels::QuantType;

use crate::large_buffer::LargeBuffer;

/// Element type of cached keys or values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// Exact: what the reference computes.
    F32,
    /// Half the memory; what llama.cpp uses by default.
    F16,
    /// 8.5 bits per element: a scale per 32, `round(x / scale)` in -127..=127.
    Q8_0,
    /// 4.5 bits per element: a scale per 32, 16 levels.
    Q4_0,
}

/// Largest head size a block-typed cache takes (rows are dequantized into a buffer that size on
/// the stack).
pub const MAX_QUANTIZED_HEAD_DIM: usize = 512;

impl KvDtype {
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0];

    /// Its name, as `--kv-type` and the metrics spell it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// The type named `name` (case-insensitive), if any.
    pub fn parse(name: &str) -> Option<KvDtype> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name.trim()))
    }

    /// The quantized block format, for the block types.
    pub(crate) fn block_type(self) -> Option<QuantType> {
        match self {
            KvDtype::F32 | KvDtype::F16 => None,
            KvDtype::Q8_0 => Some(QuantType::Q8_0),
            KvDtype::Q4_0 => Some(QuantType::Q4_0),
        }
    }

    /// Bytes of `n` elements (`n` a multiple of 32 for the block types).
    pub fn row_bytes(self, n: usize) -> usize {
        match self.block_type() {
            None => n * if self == KvDtype::F32 { 4 } else { 2 },
            Some(ty) => n / ty.block_size() * ty.block_bytes(),
        }
    }

    /// Whether rows of `head_dim` elements can be stored in this type.
    pub fn fits_head_dim(self, head_dim: usize) -> bool {
        self.block_type().is_none_or(|ty| {
            head_dim.is_multiple_of(ty.block_size()) && head_dim <= MAX_QUANTIZED_HEAD_DIM
        })
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<KvDtype, String> {
        KvDtype::parse(s).ok_or_else(|| {
            let names: Vec<_> = KvDtype::ALL.iter().map(|t| t.name()).collect();
            format!("unknown KV type {s:?} (one of: {})", names.join(", "))
        })
    }
}

/// The element types of keys and of values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvTypes {
    pub keys: KvDtype,
    pub values: KvDtype,
}

impl KvTypes {
    /// What a precision uses unless told otherwise: f32 for the exact path, f16 for the fast.
    pub fn for_precision(precision: crate::Precision) -> KvTypes {
        match precision {
            crate::Precision::Exact => KvDtype::F32.into(),
            crate::Precision::Fast => KvDtype::F16.into(),
        }
    }

    /// `"q8_0"` when keys and values agree, else `"q8_0/f16"` (keys first).
    pub fn name(self) -> String {
        if self.keys == self.values {
            self.keys.name().to_string()
        } else {
            format!("{}/{}", self.keys.name(), self.values.name())
        }
    }

    /// An error naming the type when rows of `head_dim` elements do not fit keys or values.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), super::KvError> {
        for dtype in [self.keys, self.values] {
            if !dtype.fits_head_dim(head_dim) {
                return Err(super::KvError::HeadDimForType {
                    dtype: dtype.name(),
                    head_dim,
                });
            }
        }
        Ok(())
    }

    /// Bytes one position takes: keys and values of `kv_dim` elements in each of `n_layers`.
    pub fn bytes_per_token(self, n_layers: usize, kv_dim: usize) -> usize {
        n_layers * (self.keys.row_bytes(kv_dim) + self.values.row_bytes(kv_dim))
    }
}

impl From<KvDtype> for KvTypes {
    fn from(t: KvDtype) -> KvTypes {
        KvTypes { keys: t, values: t }
    }
}

impl std::fmt::Display for KvTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// One layer's keys (or values), indexed by element: `[block][slot][kv_head * head_dim]`.
pub(super) enum Arena {
    F32(LargeBuffer<f32>),
    F16(LargeBuffer<f16>),
    /// Quantized rows; element `i` is in block `i / 32` (rows are whole blocks).
    Blocks {
        ty: QuantType,
        bytes: LargeBuffer<u8>,
    },
}

impl Arena {
    /// `n` elements, zero. `None` when the memory cannot be had (an error for the caller, never
    /// an abort).
    pub(super) fn new(dtype: KvDtype, n: usize) -> Option<Arena> {
        Some(match dtype.block_type() {
            None if dtype == KvDtype::F32 => Arena::F32(LargeBuffer::zeroed(n)?),
            None => Arena::F16(LargeBuffer::zeroed(n)?),
            Some(ty) => Arena::Blocks {
                ty,
                bytes: LargeBuffer::zeroed(
                    n.div_ceil(ty.block_size()).checked_mul(ty.block_bytes())?,
                )?,
            },
        })
    }

    /// Stores `src` at element `at` (for the block types, both whole blocks).
    pub(super) fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Arena::F32(a) => a[at..at + src.len()].copy_from_slice(src),
            // Eight or sixteen lanes at a time where the CPU converts (F16C), rounding to
            // nearest even as `f16::from_f32` does: one call per element took 1.3% of
            // SmolLM2's prompt, on the one thread that writes the cache.
            Arena::F16(a) => a[at..at + src.len()].convert_from_f32_slice(src),
            Arena::Blocks { ty, bytes } => {
                let range = block_range(*ty, at, src.len());
                let quantize = match ty {
                    QuantType::Q8_0 => rill_kernels::quantize_row_q8_0,
                    _ => rill_kernels::quantize_row_q4_0,
                };
                // Sizes agree by construction (whole blocks of a row the cache sized).
                quantize(src, &mut bytes[range]).expect("whole blocks");
            }
        }
    }

    /// Copies `n` elements from `from` to `to` (for the block types, whole blocks).
    pub(super) fn copy_within(&mut self, from: usize, to: usize, n: usize) {
        match self {
            Arena::F32(a) => a.copy_within(from..from + n, to),
            Arena::F16(a) => a.copy_within(from..from + n, to),
            Arena::Blocks { ty, bytes } => {
                let src = block_range(*ty, from, n);
                let to = block_range(*ty, to, n).start;
                bytes.copy_within(src, to);
            }
        }
    }
}

/// The bytes of elements `at..at + n` of a block-typed arena.
fn block_range(ty: QuantType, at: usize, n: usize) -> std::ops::Range<usize> {
    let (bs, bb) = (ty.block_size(), ty.block_bytes());
    at / bs * bb..(at + n) / bs * bb
}

/// One layer, one sequence, one KV head.
pub(crate) struct LayerView<'a> {
    pub(super) keys: &'a Arena,
    pub(super) values: &'a Arena,
    pub(super) blocks: &'a [u32],
    pub(super) block_size: usize,
    pub(super) kv_dim: usize,
    pub(super) head_offset: usize,
    pub(super) head_dim: usize,
    pub(super) len: usize,
}

impl LayerView<'_> {
    #[inline]
    fn offset(&self, j: usize) -> usize {
        let block = self.blocks[j / self.block_size] as usize;
        (block * self.block_size + j % self.block_size) * self.kv_dim + self.head_offset
    }
}

/// Rows of a quantized cache dequantized at a time (a stack buffer of this many elements).
const DEQUANTIZED_ELEMENTS: usize = 2048;

impl LayerView<'_> {
    /// Runs `f(k, rows)` over positions `j0..j0 + n` of a block-typed arena, dequantized into
    /// f32 in pieces of consecutive positions (`k`: the piece's offset from `j0`). Every stored
    /// value is a small integer times an f16 scale, which f32 holds exactly, so how it is
    /// dequantized cannot change a bit.
    #[inline]
    fn dequantized_runs(
        &self,
        arena: &Arena,
        j0: usize,
        n: usize,
        mut f: impl FnMut(usize, ops::Rows<'_, f32>),
    ) {
        let Arena::Blocks { ty, bytes } = arena else {
            return;
        };
        let dim = self.head_dim;
        let mut buf = [0f32; DEQUANTIZED_ELEMENTS];
        let per_piece = (DEQUANTIZED_ELEMENTS / dim).max(1);
        for (k, at, rows) in self.segments(j0, n) {
            for first in (0..rows).step_by(per_piece) {
                let count = per_piece.min(rows - first);
                for r in 0..count {
                    let src = &bytes[block_range(*ty, at + (first + r) * self.kv_dim, dim)];
                    let out = &mut buf[r * dim..(r + 1) * dim];
                    match ty {
                        QuantType::Q8_0 => rill_kernels::dequant_kv::dequantize_q8_0_rows(src, out),
                        _ => rill_kernels::dequant_kv::dequantize_q4_0_rows(src, out),
                    }
                }
                let rows = ops::Rows {
                    data: &buf[..count * dim],
                    stride: dim,
                    rows: count,
                    dim,
                };
                f(k + first, rows);
            }
        }
    }
}

/// `out[g] = dot(key, q_g)` for the heads back to back in `q`.
fn f32_key_dots(key: &[f32], q: &[f32], out: &mut [f32]) {
    for (o, qg) in out.iter_mut().zip(q.chunks_exact(key.len())) {
        *o = rill_kernels::dot_f32(key, qg);
    }
}

/// `out_g += w[g] * value` for the heads' outputs back to back in `out`.
fn f32_value_axpys(value: &[f32], w: &[f32], out: &mut [f32]) {
    for (&wg, og) in w.iter().zip(out.chunks_exact_mut(value.len())) {
        ops::axpy_f32(og, wg, value);
    }
}

impl LayerView<'_> {
    /// Positions `j0..j0 + n` of `arena` as f32 rows (`head_dim` each, `stride` apart) into
    /// `out`: copied, widened from f16 or dequantized.
    fn rows_as_f32(&self, arena: &Arena, j0: usize, n: usize, out: &mut [f32], stride: usize) {
        let dim = self.head_dim;
        for (k, at, rows) in self.segments(j0, n) {
            for r in 0..rows {
                let (src, dst) = (at + r * self.kv_dim, &mut out[(k + r) * stride..][..dim]);
                match arena {
                    Arena::F32(a) => dst.copy_from_slice(&a[src..src + dim]),
                    Arena::F16(a) => rill_kernels::dequant_kv::widen_f16(&a[src..src + dim], dst),
                    Arena::Blocks { ty, bytes } => {
                        let src = &bytes[block_range(*ty, src, dim)];
                        match ty {
                            QuantType::Q8_0 => {
                                rill_kernels::dequant_kv::dequantize_q8_0_rows(src, dst)
                            }
                            _ => rill_kernels::dequant_kv::dequantize_q4_0_rows(src, dst),
                        }
                    }
                }
            }
        }
    }
}

impl KvView for LayerView<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn keys_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize) {
        self.rows_as_f32(self.keys, j0, n, out, stride)
    }

    fn values_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize) {
        self.rows_as_f32(self.values, j0, n, out, stride)
    }

    fn values_are_f16(&self) -> bool {
        matches!(self.values, Arena::F16(_))
    }

    fn values_weighed_in_place(&self) -> bool {
        matches!(self.values, Arena::F16(_) | Arena::Blocks { .. })
    }

    fn prefetch(&self, j0: usize, n: usize, part: CachePart) {
        let arena = match part {
            CachePart::Keys => self.keys,
            CachePart::Values => self.values,
        };
        let dim = self.head_dim;
        for (_, at, rows) in self.segments(j0, n) {
            // This head's part of each position (whole positions, every KV head, measured
            // slower for SmolLM2 at depth 4096: attention 5.07 against 4.82 times its gate and
            // up products, alternating).
            for row in (0..rows).map(|r| at + r * self.kv_dim) {
                match arena {
                    Arena::F32(a) => prefetch(&a[row..row + dim]),
                    Arena::F16(a) => prefetch(&a[row..row + dim]),
                    Arena::Blocks { ty, bytes } => prefetch(&bytes[block_range(*ty, row, dim)]),
                }
            }
        }
    }

    fn key_rows_f16<'s>(&'s self, j0: usize, out: &mut [&'s [f16]]) -> bool {
        self.rows_f16(self.keys, j0, out)
    }

    fn value_rows_f16<'s>(&'s self, j0: usize, out: &mut [&'s [f16]]) -> bool {
        self.rows_f16(self.values, j0, out)
    }

    fn key_rows_q8_0<'s>(&'s self, j0: usize, out: &mut [&'s [u8]]) -> bool {
        let Arena::Blocks {
            ty: QuantType::Q8_0,
            bytes,
        } = self.keys
        else {
            return false;
        };
        let dim = self.head_dim;
        self.each_stored_row(j0, out, |at| &bytes[block_range(QuantType::Q8_0, at, dim)]);
        true
    }

    #[inline]
    fn key_dot(&self, j: usize, q: &[f32]) -> f32 {
        let (at, n) = (self.offset(j), self.head_dim);
        match self.keys {
            Arena::F32(a) => rill_kernels::dot_f32(&a[at..at + n], q),
            Arena::F16(a) => ops::dot_f16_f32(&a[at..at + n], q),
            Arena::Blocks { .. } => {
                let mut out = [0f32];
                self.key_dots_run(j, 1, q, 1, &mut out, 1);
                out[0]
            }
        }
    }

    #[inline]
    fn value_axpy(&self, j: usize, w: f32, out: &mut [f32]) {
        let (at, n) = (self.offset(j), self.head_dim);
        match self.values {
            Arena::F32(a) => ops::axpy_f32(out, w, &a[at..at + n]),
            Arena::F16(a) => ops::axpy_f16(out, w, &a[at..at + n]),
            Arena::Blocks { .. } => self.value_axpys_run(j, 1, &[w], 1, 1, out),
        }
    }

    #[inline]
    fn key_dots(&self, j: usize, q: &[f32], out: &mut [f32]) {
        let (at, n) = (self.offset(j), self.head_dim);
        match self.keys {
            Arena::F32(a) => f32_key_dots(&a[at..at + n], q, out),
            Arena::F16(a) => ops::dot_f16_f32_heads(&a[at..at + n], q, out),
            Arena::Blocks { .. } => self.key_dots_run(j, 1, q, out.len(), out, 1),
        }
    }

    #[inline]
    fn value_axpys(&self, j: usize, w: &[f32], out: &mut [f32]) {
        let (at, n) = (self.offset(j), self.head_dim);
        match self.values {
            Arena::F32(a) => f32_value_axpys(&a[at..at + n], w, out),
            Arena::F16(a) => ops::axpy_f16_heads(out, w, &a[at..at + n]),
            Arena::Blocks { .. } => self.value_axpys_run(j, 1, w, 1, w.len(), out),
        }
    }

    fn key_dots_run(
        &self,
        j0: usize,
        n: usize,
        q: &[f32],
        heads: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        match self.keys {
            Arena::F32(_) => ops::key_dots_run_by_position(self, j0, n, q, heads, out, out_stride),
            Arena::F16(a) => {
                for (k, keys) in self.runs(a, j0, n) {
                    ops::dot_heads_run(keys, q, heads, &mut out[k..], out_stride);
                }
            }
            blocks => self.dequantized_runs(blocks, j0, n, |k, keys| {
                ops::dot_heads_run(keys, q, heads, &mut out[k..], out_stride);
            }),
        }
    }

    fn value_axpys_run(
        &self,
        j0: usize,
        n: usize,
        w: &[f32],
        w_stride: usize,
        heads: usize,
        out: &mut [f32],
    ) {
        let out = &mut out[..heads * self.head_dim];
        match self.values {
            Arena::F32(_) => ops::value_axpys_run_by_position(self, j0, n, w, w_stride, heads, out),
            Arena::F16(a) => {
                for (k, values) in self.runs(a, j0, n) {
                    ops::axpy_heads_run(out, &w[k..], w_stride, values);
                }
            }
            blocks => self.dequantized_runs(blocks, j0, n, |k, values| {
                ops::axpy_heads_run(out, &w[k..], w_stride, values);
            }),
        }
    }
}

impl<'a> LayerView<'a> {
    /// This head's part of positions `j0..j0 + out.len()` of an f16 arena, as stored.
    fn rows_f16<'s>(&'s self, arena: &'a Arena, j0: usize, out: &mut [&'s [f16]]) -> bool {
        let Arena::F16(a) = arena else {
            return false;
        };
        let dim = self.head_dim;
        self.each_stored_row(j0, out, |at| &a[at..at + dim]);
        true
    }

    /// `out[k] = row(at)` for positions `j0 + k`, `at` the arena element where this head's
    /// part of the position starts.
    fn each_stored_row<'s, T: ?Sized>(
        &self,
        j0: usize,
        out: &mut [&'s T],
        row: impl Fn(usize) -> &'s T,
    ) {
        for (k, at, rows) in self.segments(j0, out.len()) {
            for r in 0..rows {
                out[k + r] = row(at + r * self.kv_dim);
            }
        }
    }

    /// Positions `j0..j0 + n` as runs that are contiguous in the arena (one per cache block
    /// touched), each with its offset `k` from `j0`.
    fn runs<'s>(
        &'s self,
        arena: &'a [f16],
        j0: usize,
        n: usize,
    ) -> impl Iterator<Item = (usize, ops::F16Rows<'a>)> + 's {
        self.segments(j0, n).map(move |(k, at, rows)| {
            let run = ops::F16Rows {
                data: &arena[at..at + (rows - 1) * self.kv_dim + self.head_dim],
                stride: self.kv_dim,
                rows,
                dim: self.head_dim,
            };
            (k, run)
        })
    }

    /// Positions `j0..j0 + n` as pieces contiguous in the arena (one per cache block touched):
    /// each piece's offset `k` from `j0`, its first element and its number of positions.
    fn segments(&self, j0: usize, n: usize) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let mut k = 0;
        std::iter::from_fn(move || {
            if k >= n {
                return None;
            }
            let j = j0 + k;
            let rows = (self.block_size - j % self.block_size).min(n - k);
            let piece = (k, self.offset(j), rows);
            k += rows;
            Some(piece)
        })
    }
}
