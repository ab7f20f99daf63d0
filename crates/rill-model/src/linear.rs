//! Matrix products against quantized weights, dispatched on [`Precision`].

use rill_gguf::GgufFile;
use rill_kernels::ThreadPool;

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
    let data = w.data(file);
    let x = &x[..n_tokens * w.cols];
    let out = &mut out[..n_tokens * w.rows];
    if precision == Precision::Exact {
        return rill_kernels::matmul_exact(w.ty, data, w.rows, w.cols, x, n_tokens, out, pool);
    }
    let matmul = if w.refined_activations {
        rill_kernels::matmul_quant_refined
    } else {
        rill_kernels::matmul_quant
    };
    matmul(
        w.ty,
        data,
        w.rows,
        w.cols,
        x,
        n_tokens,
        out,
        quant_scratch,
        pool,
    )
}
