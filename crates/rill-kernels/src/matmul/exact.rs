//! The reference-accuracy product ([`matmul_exact`]): f32 activations against rows dequantized
//! exactly, or float rows dotted directly.

use std::cell::RefCell;

use super::{validate, Job, Kernel, Matrix, SyncPtr, TILE_BYTES};
use crate::dot::{best_kernel, f32_bytes, DotKernel};
use crate::{dequantize_row, dot_f32, KernelError, ThreadPool, WeightLayout};

/// Rows split over the pool for a single-pair kernel over f32 activations (float weights on
/// the exact path).
fn run_rows(
    kernel: DotKernel,
    m: Matrix<'_>,
    row_bytes: usize,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) {
    let Matrix {
        weights,
        n_rows,
        n_cols,
        ..
    } = m;
    let (acts, act_row_bytes) = (f32_bytes(x), 4 * n_cols);
    let job = Job {
        weights,
        kernel: Kernel::Pairs(kernel),
        row_bytes,
        n_rows,
        format: 0,
        parts: 1,
        interleaved: false,
        out: SyncPtr(out.as_mut_ptr()),
    };
    let tile = (TILE_BYTES / row_bytes.max(1)).clamp(1, 64);
    pool.parallel_for(n_rows, tile.min(16), |rows| {
        job.pairs(kernel, rows, acts, act_row_bytes, n_cols, n_tokens)
    });
}

thread_local! {
    /// Per-thread dequantization buffer for `matmul_exact`, grown on demand and kept for reuse.
    pub(super) static DEQ_ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Reference-accuracy path: f32 activations. Each weight row is dequantized exactly once (into a
/// thread-local buffer) and dotted in f32 with every token row. Float weight types are dotted
/// directly without a conversion pass.
pub fn matmul_exact(
    m: Matrix<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    pool: &ThreadPool,
) -> Result<(), KernelError> {
    let row_bytes = validate(m, WeightLayout::Blocks, x, n_tokens, out)?;
    let Matrix {
        ty,
        weights,
        n_rows,
        n_cols,
    } = m;
    if n_rows == 0 || n_tokens == 0 {
        return Ok(());
    }
    if !ty.is_quantized() {
        let kernel = best_kernel(ty).ok_or(KernelError::Unsupported {
            ty,
            op: "matmul weight type",
        })?;
        run_rows(kernel, m, row_bytes, x, n_tokens, out, pool);
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
