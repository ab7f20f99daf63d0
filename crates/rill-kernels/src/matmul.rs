//! Weight-matrix × activations drivers.
//!
//! Both functions compute `out[t * n_rows + r] = dot(weights[r], x[t])` for a row-major weight
//! matrix of `n_rows` rows of `n_cols` elements and `n_tokens` activation rows of `n_cols` f32.
//!
//! Work is split over weight rows; each output element is produced by exactly one kernel call
//! whose inputs do not depend on the other tokens in the batch or on the thread split, so the
//! results are **batch invariant**: a token's outputs are bit-identical whether it is computed
//! alone or inside a prompt batch, with any number of threads.

use std::cell::RefCell;

mod exact;
pub use exact::matmul_exact;

use crate::dot::registry::{self, Level, Operation};
use crate::dot::{f32_bytes, DotKernel, GemmCall, GemmKernel};
use crate::error::check_len;
use crate::quantize::{
    i16_row_bytes, quantize_i16_unchecked, quantize_q8_0_unchecked, quantize_q8_1_unchecked,
    quantize_q8_k_unchecked,
};
use crate::{dequantize_row, KernelError, QuantType, ThreadPool, WeightLayout, ROW_GROUP};

/// A raw pointer that may be shared between the pool's threads; every use writes disjoint
/// elements (a method, not a field access, so closures capture the whole wrapper).
#[derive(Clone, Copy)]
struct SyncPtr<T>(*mut T);
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}
impl<T> SyncPtr<T> {
    #[inline(always)]
    fn get(&self) -> *mut T {
        self.0
    }
}

/// Target bytes of weights per row tile: small enough to stay in L1 while every token of the
/// batch is multiplied against it.
const TILE_BYTES: usize = 16 * 1024;

/// A weight matrix: `n_rows` rows of `n_cols` elements of `ty`, in the file's block layout
/// (for the repacked layouts, see [`QuantProduct`]).
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    pub ty: QuantType,
    pub weights: &'a [u8],
    pub n_rows: usize,
    pub n_cols: usize,
}

impl<'a> Matrix<'a> {
    /// `n_rows` rows of `n_cols` elements of `ty` in `weights`.
    pub const fn new(ty: QuantType, weights: &'a [u8], n_rows: usize, n_cols: usize) -> Self {
        Matrix {
            ty,
            weights,
            n_rows,
            n_cols,
        }
    }
}

/// Checks the sizes of `m` (its rows in `layout`), `n_tokens` activation rows and the outputs;
/// the bytes of one weight row.
fn validate(
    m: Matrix<'_>,
    layout: WeightLayout,
    x: &[f32],
    n_tokens: usize,
    out: &[f32],
) -> Result<usize, KernelError> {
    let Matrix {
        ty,
        weights,
        n_rows,
        n_cols,
    } = m;
    let row_bytes = layout.row_bytes(ty, n_cols)?;
    let w_bytes = row_bytes.checked_mul(n_rows).ok_or(KernelError::Overflow)?;
    check_len("matmul weight bytes", w_bytes, weights.len())?;
    let nx = n_cols.checked_mul(n_tokens).ok_or(KernelError::Overflow)?;
    check_len("matmul activation elements", nx, x.len())?;
    let no = n_rows.checked_mul(n_tokens).ok_or(KernelError::Overflow)?;
    check_len("matmul output elements", no, out.len())?;
    Ok(row_bytes)
}

/// The registered kernel a product of `ty` rows in `layout` with `activations` runs on this CPU
/// for a call of `n_tokens` tokens: what [`matmul_quant_group`] dispatches, for a report of
/// the kernels a model's products take (`rill inspect`). The AMX tiles take calls of 16 tokens
/// or more, the unpacking tiles any call over the file's blocks; a type with no tile here runs
/// its pair kernel; repacked rows have only tiles.
pub fn product_kernel(
    ty: QuantType,
    layout: WeightLayout,
    activations: Activations,
    n_tokens: usize,
) -> Result<&'static registry::Kernel, KernelError> {
    let unsupported = KernelError::Unsupported {
        ty,
        op: "matmul weight type",
    };
    let paired = ty.vec_dot_type().ok_or(unsupported.clone())?;
    let repacked = layout != WeightLayout::Blocks;
    let on_this_cpu = KernelError::Unsupported {
        ty,
        op: "this weight layout on this CPU",
    };
    match activations {
        Activations::Float if repacked => Err(KernelError::Unsupported {
            ty,
            op: "float activations on repacked rows",
        }),
        Activations::Float if paired != QuantType::F32 => {
            registry::select(ty, Operation::FloatTiles).ok_or(unsupported)
        }
        Activations::Int16 => registry::select(ty, Operation::Int16Tiles).ok_or(on_this_cpu),
        // Float weights meet f32 activations whatever is asked: in tiles of panels shared by
        // every token (their pair kernel where the rows' length is not a multiple of 8, which
        // the product's driver decides).
        _ if paired == QuantType::F32 && !repacked => registry::select(ty, Operation::FloatTiles)
            .or_else(|| registry::select(ty, Operation::Dot))
            .ok_or(unsupported),
        _ => {
            let tiles = match registry::select(ty, Operation::Tiles(layout)) {
                // Fewer tokens than one AMX tile: the 512-bit tile, with its own blocking.
                Some(k) if k.level == Level::Amx && n_tokens < 16 => {
                    registry::select_below(ty, Operation::Tiles(layout), Some(Level::Amx))
                }
                tiles => tiles,
            };
            let unpacking = (layout == WeightLayout::Blocks)
                .then(|| registry::select(ty, Operation::UnpackingTiles))
                .flatten();
            match (tiles, unpacking) {
                (Some(k), _) if k.level == Level::Amx => Ok(k),
                (_, Some(k)) | (Some(k), None) => Ok(k),
                (None, None) if repacked => Err(on_this_cpu),
                (None, None) => registry::select(ty, Operation::Dot).ok_or(unsupported),
            }
        }
    }
}

/// Bytes of scratch [`matmul_quant`] needs to hold `n_tokens` quantized activation rows of
/// `n_cols` elements for weights of type `ty` (0 for float weights, which use f32 activations).
pub fn quant_scratch_bytes(
    ty: QuantType,
    n_cols: usize,
    n_tokens: usize,
) -> Result<usize, KernelError> {
    let act = ty.vec_dot_type().ok_or(KernelError::Unsupported {
        ty,
        op: "matmul weight type",
    })?;
    if act == QuantType::F32 {
        return Ok(0);
    }
    act.row_bytes_checked(n_cols)?
        .checked_mul(n_tokens)
        .ok_or(KernelError::Overflow)
}

/// Fast path: quantizes each activation row once into the paired format (into `scratch`, grown
/// if needed and reused across calls, so steady-state calls do not allocate), then computes every
/// output with the integer [`vec_dot`](crate::vec_dot) kernel. Float weight types use the f32
/// activations directly.
///
/// Rows are split across `pool`; within a chunk, rows are processed in L1-sized tiles and every
/// token is multiplied against a tile before moving on, so weights are read from memory once per
/// call regardless of the batch size.
pub fn matmul_quant(
    m: Matrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_quant_with(m, x, n_tokens, out, scratch, pool, Activations::Int8)
}

/// How a product's activations meet quantized weights on the fast path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// Quantized once into 8-bit blocks of the format paired with the weight type: integer dot
    /// products (llama.cpp's scheme).
    #[default]
    Int8,
    /// Two-level 8-bit: each activation row is quantized, and the rounding residual is
    /// quantized again into a second row of the same format, so `x ≈ hi + lo` and every output
    /// is `dot(w, hi) + dot(w, lo)`. The activation error shrinks by about two orders of
    /// magnitude for twice the integer arithmetic (the weights are still read once).
    Int8Refined,
    /// Not quantized: weight rows are dequantized exactly to f32, a panel at a time shared by
    /// every token, and multiplied with the f32 activations (one FMA per 8 products). Exact
    /// activations, and cheaper than [`Activations::Int8Refined`] where the weights' unpacking
    /// dominates (K-quants); worth it where activations have outliers that make one block scale
    /// coarse, such as the input of a GeGLU feed-forward down projection.
    Float,
    /// 16-bit blocks of 256 elements holding 12-bit quants ([`crate::quantize_row_i16`]):
    /// 16 times finer than 8 bits, for the same products as [`Activations::Float`], where the
    /// weights' rows are K-quants [row-interleaved](WeightLayout::RowInterleaved) (integer
    /// `vpdpwssd` products of sixteen rows at a time instead of dequantized f32 FMAs).
    Int16,
}

/// [`matmul_quant`] with two-level activation quantization ([`Activations::Int8Refined`]).
/// Float weight types behave as in [`matmul_quant`].
pub fn matmul_quant_refined(
    m: Matrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_quant_with(m, x, n_tokens, out, scratch, pool, Activations::Int8Refined)
}

/// [`matmul_quant`] with the activation scheme chosen by `activations`. Every scheme is batch
/// invariant; float weight types always use their f32 activations.
pub fn matmul_quant_with(
    m: Matrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
    pool: &ThreadPool,
    activations: Activations,
) -> Result<(), KernelError> {
    let mut products = [QuantProduct {
        ty: m.ty,
        weights: m.weights,
        n_rows: m.n_rows,
        out,
        activations,
        layout: WeightLayout::Blocks,
    }];
    matmul_quant_group(&mut products, m.n_cols, x, n_tokens, scratch, pool)
}

/// Allocates this thread's kernel scratch (every thread-local buffer at its starting size) now,
/// so that a pool thread which happens to take its first task of some kind late does not
/// allocate in the middle of decoding.
pub(crate) fn prepare_thread() {
    PART_TMP.with(|c| c.borrow_mut().reserve(2 * 4096));
    PART_OUT.with(|c| c.borrow_mut().reserve(4096));
    exact::DEQ_ROW.with(|c| c.borrow_mut().reserve(4096));
    #[cfg(target_arch = "x86_64")]
    {
        crate::dot::blocks_q32::prepare_thread();
        crate::dot::float_acts::prepare_thread();
        crate::dot::interleaved_q32::prepare_thread();
    }
}

thread_local! {
    /// Per-thread residual and dequantized-part buffers for two-level activation quantization.
    static PART_TMP: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Quantizes `x` into `parts` consecutive rows of `act` blocks in `dst`: the first holds `x`,
/// each next one the residual the previous ones left.
fn quantize_parts(
    quant: fn(&[f32], &mut [u8]),
    act: QuantType,
    x: &[f32],
    dst: &mut [u8],
    parts: usize,
) {
    let arb = dst.len() / parts;
    quant(x, &mut dst[..arb]);
    if parts == 1 {
        return;
    }
    PART_TMP.with(|cell| {
        let mut buf = cell.borrow_mut();
        buf.resize(2 * x.len(), 0.0);
        let (residual, deq) = buf.split_at_mut(x.len());
        residual.copy_from_slice(x);
        for p in 1..parts {
            let (done, rest) = dst.split_at_mut(p * arb);
            // Cannot fail: the previous part was just produced for `x.len()` elements.
            let _ = dequantize_row(act, &done[(p - 1) * arb..], deq);
            for (r, &q) in residual.iter_mut().zip(deq.iter()) {
                *r -= q;
            }
            quant(residual, &mut rest[..arb]);
        }
    });
}

/// Quantizes one activation row into its format's blocks (sizes already validated).
type Quantizer = fn(&[f32], &mut [u8]);

/// The form a product group's activations take for a kernel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ActFormat {
    /// The f32 rows themselves.
    F32,
    /// 8-bit blocks of this activation type.
    Blocks(QuantType),
    /// 16-bit blocks ([`crate::quantize_row_i16`]).
    I16,
}

/// One product of a [`matmul_quant_group`]: `out[t * n_rows + r] = dot(weights row r, x[t])`.
pub struct QuantProduct<'a> {
    pub ty: QuantType,
    pub weights: &'a [u8],
    pub n_rows: usize,
    pub out: &'a mut [f32],
    /// How the activations meet the weights.
    pub activations: Activations,
    /// How the weights' rows lay out their blocks.
    pub layout: WeightLayout,
}

/// Most products in one group (a layer's q/k/v or gate/up).
pub const MAX_GROUP: usize = 4;

/// Several products of the same input `x` (`n_tokens` rows of `n_cols`), such as a layer's
/// query, key and value projections: the input is quantized once per activation format and
/// refinement, and all products' rows are shared out in **one** dispatch of the pool, where
/// separate calls would quantize and fork/join once each. Every output is bit-identical to
/// [`matmul_quant`] (or [`matmul_quant_refined`]) on its product alone.
pub fn matmul_quant_group(
    products: &mut [QuantProduct<'_>],
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    scratch: &mut Vec<u8>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    if products.len() > MAX_GROUP {
        return Err(KernelError::Unsupported {
            ty: products[0].ty,
            op: "a product group larger than MAX_GROUP",
        });
    }
    // Validate everything and pick kernels and activation formats first.
    let mut jobs: [Option<Job>; MAX_GROUP] = [None; MAX_GROUP];
    // Distinct (activation format, parts) pairs, with their byte offset in `scratch` and
    // their bytes per token.
    let mut formats: [(ActFormat, usize, usize, usize); MAX_GROUP] =
        [(ActFormat::F32, 0, 0, 0); MAX_GROUP];
    let mut n_formats = 0;
    let mut scratch_need = 0usize;
    for (k, p) in products.iter_mut().enumerate() {
        let matrix = Matrix::new(p.ty, p.weights, p.n_rows, n_cols);
        let row_bytes = validate(matrix, p.layout, x, n_tokens, p.out)?;
        let unsupported = KernelError::Unsupported {
            ty: p.ty,
            op: "matmul weight type",
        };
        let paired = p.ty.vec_dot_type().ok_or(unsupported.clone())?;
        let interleaved = matches!(
            p.layout,
            WeightLayout::RowInterleaved | WeightLayout::RowInterleavedNibbles
        );
        if interleaved && !p.n_rows.is_multiple_of(ROW_GROUP) {
            return Err(KernelError::LengthMismatch {
                what: "rows of a row-interleaved matrix (whole groups of 16)",
                expected: p.n_rows.next_multiple_of(ROW_GROUP),
                actual: p.n_rows,
            });
        }
        // 16-bit activations go with row-interleaved Q4_K/Q6_K rows only (those rows may also
        // take 8-bit ones where a kernel reads them so: Q4_K).
        let int16_rows = p.layout == WeightLayout::RowInterleaved
            && matches!(p.ty, QuantType::Q4_K | QuantType::Q6_K);
        if p.activations == Activations::Int16 && !int16_rows {
            return Err(KernelError::Unsupported {
                ty: p.ty,
                op: "16-bit activations other than with row-interleaved Q4_K/Q6_K rows",
            });
        }
        let mut chosen = product_kernel(p.ty, p.layout, p.activations, n_tokens)?;
        // Float rows go through the tiles eight elements at a time.
        if paired == QuantType::F32
            && chosen.operation == Operation::FloatTiles
            && !n_cols.is_multiple_of(8)
        {
            chosen = registry::select(p.ty, Operation::Dot).ok_or(unsupported.clone())?;
        }
        let function = KernelError::Unsupported {
            ty: p.ty,
            op: "a registered kernel of the wrong kind",
        };
        let tiles = || chosen.tile_kernel().ok_or(function.clone());
        let kernel = match (chosen.operation, chosen.level) {
            (Operation::FloatTiles, _) => Kernel::Dequantized(tiles()?),
            (Operation::UnpackingTiles, _) => Kernel::Unpacking(tiles()?),
            (Operation::Tiles(_), Level::Amx) => Kernel::Amx(tiles()?),
            (Operation::Tiles(_) | Operation::Int16Tiles, _) => Kernel::Tiled(tiles()?),
            (Operation::Dot, _) => Kernel::Pairs(chosen.dot_kernel().ok_or(function.clone())?),
        };
        let (act, parts) = match (chosen.operation, p.activations) {
            (Operation::FloatTiles, _) => (ActFormat::F32, 1),
            (Operation::Int16Tiles, _) => (ActFormat::I16, 1),
            _ if paired == QuantType::F32 => (ActFormat::F32, 1),
            (_, Activations::Int8Refined) => (ActFormat::Blocks(paired), 2),
            _ => (ActFormat::Blocks(paired), 1),
        };
        let format = match formats[..n_formats]
            .iter()
            .position(|f| f.0 == act && f.1 == parts)
        {
            Some(f) => f,
            None => {
                let arb = match act {
                    ActFormat::F32 => 4 * n_cols,
                    ActFormat::Blocks(ty) => ty
                        .row_bytes_checked(n_cols)?
                        .checked_mul(parts)
                        .ok_or(KernelError::Overflow)?,
                    ActFormat::I16 => i16_row_bytes(n_cols)?,
                };
                let bytes = if act == ActFormat::F32 {
                    0
                } else {
                    arb.checked_mul(n_tokens).ok_or(KernelError::Overflow)?
                };
                formats[n_formats] = (act, parts, scratch_need, arb);
                scratch_need = scratch_need
                    .checked_add(bytes)
                    .ok_or(KernelError::Overflow)?;
                n_formats += 1;
                n_formats - 1
            }
        };
        jobs[k] = Some(Job {
            weights: p.weights,
            kernel,
            row_bytes,
            n_rows: p.n_rows,
            format,
            parts,
            interleaved,
            out: SyncPtr(p.out.as_mut_ptr()),
        });
    }
    if n_tokens == 0 {
        return Ok(());
    }
    if scratch.len() < scratch_need {
        scratch.resize(scratch_need, 0);
    }
    for &(format, parts, offset, arb) in &formats[..n_formats] {
        let (quant, act): (Quantizer, QuantType) = match format {
            ActFormat::F32 => continue,
            ActFormat::Blocks(QuantType::Q8_0) => (quantize_q8_0_unchecked, QuantType::Q8_0),
            ActFormat::Blocks(QuantType::Q8_1) => (quantize_q8_1_unchecked, QuantType::Q8_1),
            ActFormat::Blocks(_) => (quantize_q8_k_unchecked, QuantType::Q8_K),
            // One part: `act` is only read to refine a second one.
            ActFormat::I16 => (quantize_i16_unchecked, QuantType::Q8_K),
        };
        let buf = &mut scratch[offset..offset + arb * n_tokens];
        if n_tokens >= 4 && pool.n_threads() > 1 {
            let p = SyncPtr(buf.as_mut_ptr());
            pool.parallel_for(n_tokens, 1, |range| {
                for t in range {
                    // SAFETY: each token writes its own disjoint `arb`-byte slice of `buf`.
                    let dst = unsafe { std::slice::from_raw_parts_mut(p.get().add(t * arb), arb) };
                    quantize_parts(quant, act, &x[t * n_cols..(t + 1) * n_cols], dst, parts);
                }
            });
        } else {
            for (t, dst) in buf.chunks_exact_mut(arb).enumerate() {
                quantize_parts(quant, act, &x[t * n_cols..(t + 1) * n_cols], dst, parts);
            }
        }
    }
    let acts_of = |format: usize| -> (&[u8], usize) {
        let (act, _, offset, arb) = formats[format];
        if act == ActFormat::F32 {
            (f32_bytes(x), arb)
        } else {
            (&scratch[offset..offset + arb * n_tokens], arb)
        }
    };
    let jobs = &jobs[..products.len()];
    let total_rows: usize = jobs.iter().flatten().map(|j| j.n_rows).sum();
    // Decode (one token) streams weights: spread rows over every thread in a few chunks each.
    // Prefill: whole row blocks per task.
    let min_chunk = if n_tokens == 1 {
        16
    } else {
        // Whole row blocks per task where that still leaves four tasks per thread to balance
        // the load (the pool claims tasks dynamically); smaller blocks, in eights, otherwise.
        let block = jobs
            .iter()
            .flatten()
            .map(|j| j.row_block())
            .max()
            .unwrap_or(4);
        (total_rows / (4 * pool.n_threads())).clamp(8, block.max(8)) & !7
    };
    // Rows are shared out in units: single rows, or groups of 16 when a product's rows are
    // interleaved in such groups (each product then starts a new unit, its last one possibly
    // short).
    let unit = if jobs.iter().flatten().any(|j| j.interleaved) {
        ROW_GROUP
    } else {
        1
    };
    let total_units: usize = jobs.iter().flatten().map(|j| j.n_rows.div_ceil(unit)).sum();
    pool.parallel_for(total_units, min_chunk.div_ceil(unit), |units| {
        // The chunk may span several products: give each its part.
        let mut first = 0;
        for job in jobs.iter().flatten() {
            let job_units = job.n_rows.div_ceil(unit);
            let (start, end) = (units.start.max(first), units.end.min(first + job_units));
            if start < end {
                let (acts, arb) = acts_of(job.format);
                let rows = (start - first) * unit..((end - first) * unit).min(job.n_rows);
                job.run(rows, acts, arb, n_cols, n_tokens);
            }
            first += job_units;
        }
    });
    Ok(())
}
thread_local! {
    /// Per-thread outputs of the separate activation parts of a token block (refined path).
    static PART_OUT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Target bytes of weights per row block of the tiled kernels. Each call of a tiled kernel
/// converts its token block's activation scales and lays out its tiles' activations (the
/// 512-bit tiles) once for all its rows; the rows of a tile stream from L2. Measured against
/// 16 KB in one process: Q5_0 1.13-1.27x, Q4_1 and Q8_0 1.06-1.16x, from 16 to 512 tokens.
const ROW_BLOCK_BYTES: usize = 128 * 1024;

/// Rows per row block of the dequantizing tiles: whole panels of eight, enough of them that
/// laying out a token block's activations once per call is paid back (tasks stay four per
/// thread, which caps it: 80 rows for Gemma's ffn_down). Measured against 64 in one process:
/// 1.16x (Q4_K, Q6_K, 512 tokens, 2 threads); 32 was 0.93x.
const DEQUANTIZED_ROW_BLOCK: usize = 128;

/// Tokens per block in [`Job::tiles`]: their activation rows stay in L1/L2 while a row block
/// of weights passes over them.
const TOKEN_BLOCK: usize = 64;

/// Target bytes of weights per row block of the [unpacking](Kernel::Unpacking) tiles.
const UNPACKING_ROW_BLOCK_BYTES: usize = 512 * 1024;

/// Tokens per block for the [unpacking](Kernel::Unpacking) tiles: each call unpacks its rows
/// once for all of them.
const UNPACKING_TOKEN_BLOCK: usize = 128;

/// Target bytes of weights per row block of the [AMX](Kernel::Amx) tiles.
const AMX_ROW_BLOCK_BYTES: usize = 512 * 1024;

/// Tokens per block for the [AMX](Kernel::Amx) tiles: each call unpacks its rows and lays out
/// its tokens' quants once for all of them.
const AMX_TOKEN_BLOCK: usize = 128;

/// How a product's outputs are computed.
#[derive(Clone, Copy)]
enum Kernel {
    /// An AMX tile (`dot/interleaved_amx.rs`): it unpacks each group's super-blocks once per call and lays
    /// out its tokens once per call, so it takes larger token and row blocks.
    Amx(GemmKernel),
    /// A tiled kernel over rectangles of rows and tokens.
    Tiled(GemmKernel),
    /// A tiled kernel that unpacks its rows once per call (the grid i-quants, the ternary
    /// types, Q2_K, Q3_K): it takes larger token and row blocks.
    Unpacking(GemmKernel),
    /// A single-pair kernel, where there is no tiled one for the type on this CPU.
    Pairs(DotKernel),
    /// A tiled kernel that dequantizes weight panels for f32 activations: it reads each
    /// panel once whatever the row count, and lays the activations out once per call, so it
    /// takes larger row blocks.
    Dequantized(GemmKernel),
}

/// One validated product of a group, ready to run over any range of its rows.
#[derive(Clone, Copy)]
struct Job<'a> {
    weights: &'a [u8],
    kernel: Kernel,
    row_bytes: usize,
    n_rows: usize,
    /// Index of the activation format (in the group's list) this product reads.
    format: usize,
    /// Activation parts (2 when refined).
    parts: usize,
    /// The rows are in the row-interleaved layout: every range run is whole groups of 16.
    interleaved: bool,
    out: SyncPtr<f32>,
}

impl Job<'_> {
    /// Weight rows per row block: about [`ROW_BLOCK_BYTES`] of weights ([`DEQUANTIZED_ROW_BLOCK`]
    /// rows for the dequantizing tiles, about [`UNPACKING_ROW_BLOCK_BYTES`] in whole eights for
    /// the unpacking ones).
    fn row_block(&self) -> usize {
        match self.kernel {
            Kernel::Dequantized(_) => DEQUANTIZED_ROW_BLOCK,
            // Each call transposes its tokens' activations once for all its rows.
            Kernel::Unpacking(_) => {
                (UNPACKING_ROW_BLOCK_BYTES / self.row_bytes.max(1)).clamp(8, 512) & !7
            }
            Kernel::Amx(_) => {
                (AMX_ROW_BLOCK_BYTES / self.row_bytes.max(1)).clamp(ROW_GROUP, 512)
                    & !(ROW_GROUP - 1)
            }
            _ if self.interleaved => {
                (ROW_BLOCK_BYTES / self.row_bytes.max(1)).clamp(ROW_GROUP, 256) & !(ROW_GROUP - 1)
            }
            _ => (ROW_BLOCK_BYTES / self.row_bytes.max(1)).clamp(4, 256) & !3,
        }
    }

    /// Outputs of `rows` for every token, from activation rows `act_row_bytes` apart.
    fn run(
        &self,
        rows: std::ops::Range<usize>,
        acts: &[u8],
        act_row_bytes: usize,
        n_cols: usize,
        n_tokens: usize,
    ) {
        match self.kernel {
            Kernel::Tiled(gemm)
            | Kernel::Dequantized(gemm)
            | Kernel::Unpacking(gemm)
            | Kernel::Amx(gemm) => self.tiles(gemm, rows, acts, act_row_bytes, n_cols, n_tokens),
            Kernel::Pairs(kernel) => {
                self.pairs(kernel, rows, acts, act_row_bytes, n_cols, n_tokens)
            }
        }
    }

    /// Tiled: rows go in blocks of about [`TILE_BYTES`] of weights, and each row block is
    /// multiplied by every token block before moving on, so weights come from memory once and
    /// from L1 for every token tile. The kernel computes every (row, token) value with the same
    /// arithmetic as the single-pair kernel, so the tiling, the token count and the thread split
    /// never change a bit.
    fn tiles(
        &self,
        gemm: GemmKernel,
        rows: std::ops::Range<usize>,
        acts: &[u8],
        act_row_bytes: usize,
        n_cols: usize,
        n_tokens: usize,
    ) {
        let (parts, row_bytes, n_rows) = (self.parts, self.row_bytes, self.n_rows);
        let part_bytes = act_row_bytes / parts;
        let row_block = self.row_block();
        let token_block = match self.kernel {
            Kernel::Unpacking(_) => UNPACKING_TOKEN_BLOCK,
            Kernel::Amx(_) => AMX_TOKEN_BLOCK,
            _ => TOKEN_BLOCK,
        };
        let mut r0 = rows.start;
        while r0 < rows.end {
            let nr = row_block.min(rows.end - r0);
            let w = self.weights[r0 * row_bytes..].as_ptr();
            let mut t0 = 0;
            while t0 < n_tokens {
                let nt = token_block.min(n_tokens - t0);
                let a = acts[t0 * act_row_bytes..].as_ptr();
                if parts == 1 {
                    // SAFETY: the kernel matches the CPU; rows r0..r0+nr and tokens
                    // t0..t0+nt are in bounds (sizes validated by the caller); outputs (t, r)
                    // for these rows belong to this task alone.
                    unsafe {
                        gemm(&GemmCall {
                            w,
                            ldw: row_bytes,
                            a,
                            lda: act_row_bytes,
                            n: n_cols,
                            nr,
                            nt,
                            out: self.out.get().add(t0 * n_rows + r0),
                            ldo: n_rows,
                        })
                    };
                } else {
                    PART_OUT.with(|cell| {
                        let mut buf = cell.borrow_mut();
                        let need = parts * nt * nr;
                        if buf.len() < need {
                            // Large steps: chunk sizes vary by thread (see blocks_q32/).
                            buf.resize(need.next_power_of_two().max(4096), 0.0);
                        }
                        // The parts of token t are consecutive `part_bytes` rows, so they are
                        // virtual tokens `parts * t + p` with stride `part_bytes`.
                        // SAFETY: as above; `buf` holds `parts * nt` rows of `nr` outputs.
                        unsafe {
                            gemm(&GemmCall {
                                w,
                                ldw: row_bytes,
                                a,
                                lda: part_bytes,
                                n: n_cols,
                                nr,
                                nt: parts * nt,
                                out: buf.as_mut_ptr(),
                                ldo: nr,
                            })
                        };
                        for t in 0..nt {
                            for r in 0..nr {
                                // Same sum, in the same order, as the pairwise path.
                                let mut v = buf[parts * t * nr + r];
                                for p in 1..parts {
                                    v += buf[(parts * t + p) * nr + r];
                                }
                                // SAFETY: (t0 + t, r0 + r) is written by this task only.
                                unsafe { *self.out.get().add((t0 + t) * n_rows + r0 + r) = v };
                            }
                        }
                    });
                }
                t0 += nt;
            }
            r0 += nr;
        }
    }

    /// One single-pair kernel call per output, rows in L1-sized tiles.
    fn pairs(
        &self,
        kernel: DotKernel,
        rows: std::ops::Range<usize>,
        acts: &[u8],
        act_row_bytes: usize,
        n_cols: usize,
        n_tokens: usize,
    ) {
        let (parts, row_bytes) = (self.parts, self.row_bytes);
        let part_bytes = act_row_bytes / parts;
        let tile = (TILE_BYTES / row_bytes.max(1)).clamp(1, 64);
        let mut r0 = rows.start;
        while r0 < rows.end {
            let r1 = (r0 + tile).min(rows.end);
            for t in 0..n_tokens {
                let a = &acts[t * act_row_bytes..(t + 1) * act_row_bytes];
                for r in r0..r1 {
                    let w = &self.weights[r * row_bytes..(r + 1) * row_bytes];
                    // SAFETY: sizes validated by the caller; the kernel matches the CPU.
                    let mut v = unsafe { kernel(w, &a[..part_bytes], n_cols) };
                    for p in 1..parts {
                        // SAFETY: as above; part `p` of the token's activation row.
                        v += unsafe { kernel(w, &a[p * part_bytes..(p + 1) * part_bytes], n_cols) };
                    }
                    // SAFETY: (t, r) is written by exactly one task; index < n_tokens * n_rows.
                    unsafe { *self.out.get().add(t * self.n_rows + r) = v };
                }
            }
            r0 = r1;
        }
    }
}
