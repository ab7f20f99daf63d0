//! The head's 4-bit copy and what bounds its error: made once at load from the file's rows.

use rill_kernels::{Activations, QuantType, ThreadPool, WeightLayout};

use crate::large_buffer::LargeBuffer;
use crate::{ModelError, Weight};

/// Elements per error block: one stored error norm per 32 elements of a row.
pub(crate) const ERR_BLOCK: usize = 32;

/// Rows built per task while loading.
const ROWS_PER_TASK: usize = 1024;

/// The copy's type: Q4_0 (4.5 bits a weight). Q5_0's bounds are half as wide, but its kernel's
/// one-token pass over Gemma 3's head takes 5.3 ms against Q4_0's 3.1 (the Q8_0 head: 6.5):
/// see `docs/two-pass-head.md`.
pub(crate) const SKETCH_TYPE: QuantType = QuantType::Q4_0;

/// A low-bit copy of the output head with, per row, bounds on how far it is from the file's row.
///
/// For row `j` of the head (`w_j`, exactly as the file holds it) and its copy `q_j`:
/// `‖(w_j − q_j)[b]‖₂ ≤ code(j, b) · unit[j]` over each 32-element block `b` (`codes` in
/// groups of 16 rows, block-major: [`rill_kernels::ops::HeadBounds::codes`]),
/// and `norm[j] ≥ max(‖w_j‖₂, ‖q_j‖₂)`. Every
/// stored bound is rounded up, so each holds for the exact values.
pub(crate) struct HeadSketch {
    pub(crate) ty: QuantType,
    /// On huge pages, as the repacked weights: the first pass streams all of it.
    pub(crate) data: LargeBuffer<u8>,
    pub(crate) layout: WeightLayout,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) codes: LargeBuffer<u8>,
    pub(crate) unit: Vec<f32>,
    pub(crate) norm: Vec<f32>,
    /// Rows the file's head is refined in at a time: its fast layout's group (16 rows
    /// interleaved), else one row.
    pub(crate) group: usize,
}

/// Whether a copy can be made and read faster than the head: the head's rows hold more than
/// the copy's 4.5 bits per weight and split into its 32-element blocks.
pub(crate) fn sketchable(head: &Weight) -> bool {
    let bits = head.row_bytes() as f64 * 8.0 / head.cols.max(1) as f64;
    head.cols.is_multiple_of(ERR_BLOCK) && bits >= 5.5
}

/// Where the two-pass head pays by default: a sketchable head of a large vocabulary, the largest
/// share of a token's reads. Measured (2 threads, AVX512-VNNI): Gemma 3 270M's 262,144-row Q8_0
/// head decodes 1.2x faster; SmolLM2's 49,152 rows (30 MB, read at cache speed) 2.3x slower, its
/// bounds reaching thousands of tokens.
pub(crate) fn worth_by_default(head: &Weight) -> bool {
    const MIN_VOCAB: usize = 100_000;
    sketchable(head) && head.rows >= MIN_VOCAB
}

/// Rows per refinement group of `layout`.
pub(crate) fn group_rows(layout: WeightLayout) -> usize {
    match layout {
        WeightLayout::RowInterleaved | WeightLayout::RowInterleavedNibbles => {
            rill_kernels::layout::ROW_GROUP
        }
        WeightLayout::Blocks | WeightLayout::ScalesFirst => 1,
    }
}

/// Rounds a non-negative bound computed in f64 up to an f32 that is at least it.
fn up(v: f64) -> f32 {
    let f = v as f32;
    if (f as f64) >= v {
        f
    } else {
        f.next_up()
    }
}

/// One task's rows: their copy's bytes (the file's block layout) and bounds.
struct Part {
    q4: Vec<u8>,
    codes: Vec<u8>,
    unit: Vec<f32>,
    norm: Vec<f32>,
}

impl HeadSketch {
    /// The copy of `head` (rows `raw` in the file's block layout), over the pool.
    pub(crate) fn build(
        head: &Weight,
        raw: &[u8],
        head_layout: WeightLayout,
        pool: &ThreadPool,
        ty: QuantType,
    ) -> Result<HeadSketch, ModelError> {
        let (rows, cols) = (head.rows, head.cols);
        let row_bytes = head.row_bytes();
        let quantize: fn(&[f32], &mut [u8]) -> Result<(), rill_kernels::KernelError> = match ty {
            QuantType::Q4_0 => rill_kernels::quantize_row_q4_0,
            QuantType::Q5_0 => rill_kernels::quantize_row_q5_0,
            _ => {
                return Err(rill_kernels::KernelError::Unsupported {
                    ty,
                    op: "a two-pass head copy",
                }
                .into())
            }
        };
        let q4_row = ty.row_bytes_checked(cols)?;
        let blocks = cols / ERR_BLOCK;
        let tasks = rows.div_ceil(ROWS_PER_TASK);
        let parts: Vec<Result<Part, ModelError>> = pool.map(tasks, |task| {
            let first = task * ROWS_PER_TASK;
            let n = ROWS_PER_TASK.min(rows - first);
            let mut part = Part {
                q4: vec![0; n * q4_row],
                codes: vec![0; n * blocks],
                unit: vec![0.0; n],
                norm: vec![0.0; n],
            };
            let (mut w, mut q) = (vec![0f32; cols], vec![0f32; cols]);
            let mut errs = vec![0f64; blocks];
            for i in 0..n {
                let j = first + i;
                rill_kernels::dequantize_row(
                    head.ty,
                    &raw[j * row_bytes..(j + 1) * row_bytes],
                    &mut w,
                )?;
                let q4 = &mut part.q4[i * q4_row..(i + 1) * q4_row];
                quantize(&w, q4)?;
                rill_kernels::dequantize_row(ty, q4, &mut q)?;
                let (mut w_sq, mut q_sq, mut worst) = (0f64, 0f64, 0f64);
                for (b, e) in errs.iter_mut().enumerate() {
                    let r = b * ERR_BLOCK..(b + 1) * ERR_BLOCK;
                    let mut sq = 0f64;
                    for (&wv, &qv) in w[r.clone()].iter().zip(&q[r]) {
                        let diff = wv as f64 - qv as f64;
                        sq += diff * diff;
                        w_sq += wv as f64 * wv as f64;
                        q_sq += qv as f64 * qv as f64;
                    }
                    // f64 sums of at most a few thousand squares of f32 values: a relative
                    // margin of 1e-9 covers their rounding.
                    *e = sq.sqrt() * (1.0 + 1e-9);
                    worst = worst.max(*e);
                }
                let unit = up(worst / 255.0);
                part.unit[i] = unit;
                part.norm[i] = up(w_sq.max(q_sq).sqrt() * (1.0 + 1e-9));
                for (b, &e) in errs.iter().enumerate() {
                    part.codes[i * blocks + b] = if unit == 0.0 {
                        0
                    } else {
                        // The smallest code whose multiple covers the block's norm.
                        let mut c = (e / unit as f64).ceil().min(255.0) as u32;
                        while c < 255 && (c as f64) * (unit as f64) < e {
                            c += 1;
                        }
                        c as u8
                    };
                }
            }
            Ok(part)
        });
        let (layout, _) = WeightLayout::fastest_for_product(ty, rows, Activations::Int8);
        let mut q4 = Vec::with_capacity(rows * q4_row);
        let mut sketch = HeadSketch {
            ty,
            data: LargeBuffer::zeroed(0).ok_or(ModelError::OutOfMemory { bytes: 0 })?,
            layout,
            rows,
            cols,
            codes: LargeBuffer::zeroed(0).ok_or(ModelError::OutOfMemory { bytes: 0 })?,
            unit: Vec::with_capacity(rows),
            norm: Vec::with_capacity(rows),
            group: group_rows(head_layout),
        };
        let group = rill_kernels::ops::BOUND_GROUP;
        let bytes = rows.div_ceil(group) * group * blocks;
        sketch.codes = LargeBuffer::zeroed(bytes).ok_or(ModelError::OutOfMemory { bytes })?;
        let mut row = 0;
        for part in parts {
            let part = part?;
            q4.extend_from_slice(&part.q4);
            for codes in part.codes.chunks_exact(blocks) {
                let (g, lane) = (row / group, row % group);
                for (b, &c) in codes.iter().enumerate() {
                    sketch.codes[(g * blocks + b) * group + lane] = c;
                }
                row += 1;
            }
            sketch.unit.extend_from_slice(&part.unit);
            sketch.norm.extend_from_slice(&part.norm);
        }
        let bytes = layout.row_bytes(ty, cols)? * rows;
        let mut data = LargeBuffer::zeroed(bytes).ok_or(ModelError::OutOfMemory { bytes })?;
        match layout {
            WeightLayout::Blocks => data.copy_from_slice(&q4),
            WeightLayout::ScalesFirst => {
                rill_kernels::repack_scales_first(ty, cols, &q4, &mut data)?
            }
            WeightLayout::RowInterleaved => {
                rill_kernels::repack_rows_interleaved(ty, cols, &q4, &mut data)?
            }
            WeightLayout::RowInterleavedNibbles => {
                return Err(rill_kernels::KernelError::Unsupported {
                    ty,
                    op: "the nibble-plane layout",
                }
                .into())
            }
        }
        sketch.data = data;
        Ok(sketch)
    }

    /// Bytes the first pass reads: the copy and the bounds.
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() + self.codes.len() + 8 * self.rows
    }
}
