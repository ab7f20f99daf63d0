//! Matrix products against quantized weights, dispatched on [`Precision`].

use rill_gguf::GgufFile;
use rill_kernels::{Matrix, ThreadPool};

use crate::{Precision, Weight};

/// `out[t * w.rows + r] = dot(w.row(r), x[t * w.cols ..])` for `t < n_tokens`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear(
    pool: &ThreadPool,
    precision: Precision,
    file: &GgufFile,
    w: &Weight,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
    quant_scratch: &mut Vec<u8>,
) -> Result<(), rill_kernels::KernelError> {
    let x = &x[..n_tokens * w.cols];
    let out = &mut out[..n_tokens * w.rows];
    if precision == Precision::Exact {
        let data = w.data(file);
        return rill_kernels::matmul_exact(
            Matrix::new(w.ty, data, w.rows, w.cols),
            x,
            n_tokens,
            out,
            pool,
        );
    }
    rill_kernels::matmul_quant_group(
        &mut [product(file, w, out, n_tokens)],
        w.cols,
        x,
        n_tokens,
        quant_scratch,
        pool,
    )
}

/// Several products of the same input (a layer's q/k/v, or gate/up): on the fast path the input
/// is quantized once and all rows go out in one dispatch of the pool. Every weight must have
/// `cols` columns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_group(
    pool: &ThreadPool,
    precision: Precision,
    file: &GgufFile,
    products: &mut [(&Weight, &mut [f32])],
    x: &[f32],
    n_tokens: usize,
    quant_scratch: &mut Vec<u8>,
) -> Result<(), rill_kernels::KernelError> {
    if precision == Precision::Exact || products.is_empty() {
        for (w, out) in products.iter_mut() {
            linear(pool, precision, file, w, x, n_tokens, out, quant_scratch)?;
        }
        return Ok(());
    }
    let cols = products[0].0.cols;
    if let Some((w, _)) = products.iter().find(|(w, _)| w.cols != cols) {
        return Err(rill_kernels::KernelError::LengthMismatch {
            what: "grouped product columns",
            expected: cols,
            actual: w.cols,
        });
    }
    let x = &x[..n_tokens * cols];
    let product = |w, out| product(file, w, out, n_tokens);
    match products {
        [(w0, o0), (w1, o1)] => rill_kernels::matmul_quant_group(
            &mut [product(w0, o0), product(w1, o1)],
            cols,
            x,
            n_tokens,
            quant_scratch,
            pool,
        ),
        [(w0, o0), (w1, o1), (w2, o2)] => rill_kernels::matmul_quant_group(
            &mut [product(w0, o0), product(w1, o1), product(w2, o2)],
            cols,
            x,
            n_tokens,
            quant_scratch,
            pool,
        ),
        _ => {
            for (w, out) in products.iter_mut() {
                linear(pool, precision, file, w, x, n_tokens, out, quant_scratch)?;
            }
            Ok(())
        }
    }
}

/// `w` as one product of a group, over `n_tokens` rows of input.
fn product<'a>(
    file: &'a GgufFile,
    w: &'a Weight,
    out: &'a mut [f32],
    n_tokens: usize,
) -> rill_kernels::QuantProduct<'a> {
    let (weights, layout) = w.fast_data(file);
    rill_kernels::QuantProduct {
        ty: w.ty,
        weights,
        layout,
        n_rows: w.rows,
        // A short buffer is left short for the kernels' size check to report.
        out: {
            let n = (n_tokens * w.rows).min(out.len());
            &mut out[..n]
        },
        activations: w.activations,
    }
}
