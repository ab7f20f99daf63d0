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

use crate::dot::{best_kernel, f32_bytes, DotKernel};
use crate::error::check_len;
use crate::quantize::{quantize_q8_0_unchecked, quantize_q8_1_unchecked, quantize_q8_k_unchecked};
use crate::{dequantize_row, dot_f32, KernelError, QuantType, ThreadPool};

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

fn validate(
    ty: QuantType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    out: &[f32],
) -> Result<usize, KernelError> {
    let row_bytes = ty.row_bytes_checked(n_cols)?;
    let w_bytes = row_bytes.checked_mul(n_rows).ok_or(KernelError::Overflow)?;
    check_len("matmul weight bytes", w_bytes, weights.len())?;
    let nx = n_cols.checked_mul(n_tokens).ok_or(KernelError::Overflow)?;
    check_len("matmul activation elements", nx, x.len())?;
    let no = n_rows.checked_mul(n_tokens).ok_or(KernelError::Overflow)?;
    check_len("matmul output elements", no, out.len())?;
    Ok(row_bytes)
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
#[allow(clippy::too_many_arguments)]
pub fn matmul_quant(
    ty: QuantType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_quant_parts(
        ty, weights, n_rows, n_cols, x, n_tokens, out, scratch, pool, 1,
    )
}

/// [`matmul_quant`] with two-level activation quantization: each activation row is quantized,
/// and the rounding residual is quantized again into a second row of the same format, so
/// `x ≈ hi + lo` and every output is `dot(w, hi) + dot(w, lo)`. The activation error shrinks by
/// about two orders of magnitude for twice the integer arithmetic (the weights are still read
/// once). Worth it where activations have outliers that make one block scale coarse, such as the
/// input of a feed-forward down projection. Float weight types behave as in [`matmul_quant`].
#[allow(clippy::too_many_arguments)]
pub fn matmul_quant_refined(
    ty: QuantType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    matmul_quant_parts(
        ty, weights, n_rows, n_cols, x, n_tokens, out, scratch, pool, 2,
    )
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

#[allow(clippy::too_many_arguments)]
fn matmul_quant_parts(
    ty: QuantType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    scratch: &mut Vec<u8>,
    pool: &ThreadPool,
    parts: usize,
) -> Result<(), KernelError> {
    let row_bytes = validate(ty, weights, n_rows, n_cols, x, n_tokens, out)?;
    let act = ty.vec_dot_type().ok_or(KernelError::Unsupported {
        ty,
        op: "matmul weight type",
    })?;
    let kernel = best_kernel(ty).ok_or(KernelError::Unsupported {
        ty,
        op: "matmul weight type",
    })?;
    if n_rows == 0 || n_tokens == 0 {
        return Ok(());
    }
    let (acts, act_row_bytes, parts): (&[u8], usize, usize) = if act == QuantType::F32 {
        (f32_bytes(x), 4 * n_cols, 1)
    } else {
        let arb = act
            .row_bytes_checked(n_cols)?
            .checked_mul(parts)
            .ok_or(KernelError::Overflow)?;
        let need = arb.checked_mul(n_tokens).ok_or(KernelError::Overflow)?;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let quant: fn(&[f32], &mut [u8]) = match act {
            QuantType::Q8_0 => quantize_q8_0_unchecked,
            QuantType::Q8_1 => quantize_q8_1_unchecked,
            _ => quantize_q8_k_unchecked,
        };
        let buf = &mut scratch[..need];
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
        (&scratch[..need], arb, parts)
    };
    run_rows(
        kernel,
        weights,
        row_bytes,
        n_rows,
        n_cols,
        acts,
        act_row_bytes,
        parts,
        n_tokens,
        out,
        pool,
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_rows(
    kernel: DotKernel,
    weights: &[u8],
    row_bytes: usize,
    n_rows: usize,
    n_cols: usize,
    acts: &[u8],
    act_row_bytes: usize,
    parts: usize,
    n_tokens: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let part_bytes = act_row_bytes / parts;
    let tile = (TILE_BYTES / row_bytes.max(1)).clamp(1, 64);
    let outp = SyncPtr(out.as_mut_ptr());
    pool.parallel_for(n_rows, tile.min(16), |rows| {
        let mut r0 = rows.start;
        while r0 < rows.end {
            let r1 = (r0 + tile).min(rows.end);
            for t in 0..n_tokens {
                let a = &acts[t * act_row_bytes..(t + 1) * act_row_bytes];
                for r in r0..r1 {
                    let w = &weights[r * row_bytes..(r + 1) * row_bytes];
                    // SAFETY: sizes validated by the caller; the kernel matches the CPU.
                    let mut v = unsafe { kernel(w, &a[..part_bytes], n_cols) };
                    for p in 1..parts {
                        // SAFETY: as above; part `p` of the token's activation row.
                        v += unsafe { kernel(w, &a[p * part_bytes..(p + 1) * part_bytes], n_cols) };
                    }
                    // SAFETY: (t, r) is written by exactly one task; index < n_tokens * n_rows.
                    unsafe { *outp.get().add(t * n_rows + r) = v };
                }
            }
            r0 = r1;
        }
    });
}

thread_local! {
    /// Per-thread dequantization buffer for `matmul_exact`, grown on demand and kept for reuse.
    static DEQ_ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Reference-accuracy path: f32 activations. Each weight row is dequantized exactly once (into a
/// thread-local buffer) and dotted in f32 with every token row. Float weight types are dotted
/// directly without a conversion pass.
#[allow(clippy::too_many_arguments)]
pub fn matmul_exact(
    ty: QuantType,
    weights: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let row_bytes = validate(ty, weights, n_rows, n_cols, x, n_tokens, out)?;
    if n_rows == 0 || n_tokens == 0 {
        return Ok(());
    }
    if !ty.is_quantized() {
        let kernel = best_kernel(ty).ok_or(KernelError::Unsupported {
            ty,
            op: "matmul weight type",
        })?;
        run_rows(
            kernel,
            weights,
            row_bytes,
            n_rows,
            n_cols,
            f32_bytes(x),
            4 * n_cols,
            1,
            n_tokens,
            out,
            pool,
        );
        return Ok(());
    }
    // Only weight types that can be dequantized are accepted (Q8_1/Q8_K are activation formats
    // but dequantize fine, so allow them too).
    let outp = SyncPtr(out.as_mut_ptr());
    pool.parallel_for(n_rows, 4, |rows| {
        DEQ_ROW.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < n_cols {
                buf.resize(n_cols, 0.0);
            }
            let row = &mut buf[..n_cols];
            for r in rows {
                let w = &weights[r * row_bytes..(r + 1) * row_bytes];
                // Cannot fail: sizes validated above.
                if dequantize_row(ty, w, row).is_err() {
                    continue;
                }
                for t in 0..n_tokens {
                    let v = dot_f32(row, &x[t * n_cols..(t + 1) * n_cols]);
                    // SAFETY: (t, r) is written by exactly one task.
                    unsafe { *outp.get().add(t * n_rows + r) = v };
                }
            }
        });
    });
    Ok(())
}
