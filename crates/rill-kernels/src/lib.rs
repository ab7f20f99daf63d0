//! CPU compute kernels for rill.
//!
//! This crate knows nothing about models or GGUF files: it works on byte slices holding blocks in
//! ggml's on-disk layouts (see [`QuantType`]) and on `f32` slices. It provides
//!
//! * exact scalar dequantization ([`dequantize_row`]), the reference for everything else;
//! * activation quantization into the formats llama.cpp pairs with each weight type
//!   ([`quantize_row_q8_0`], [`quantize_row_q8_1`], [`quantize_row_q8_k`]);
//! * integer dot products between a quantized weight row and a quantized activation row
//!   ([`vec_dot`]), with AVX2+FMA paths picked at run time and plain scalar twins;
//! * two matrix-times-activations drivers: [`matmul_exact`] (f32 activations, reference accuracy)
//!   and [`matmul_quant`] (quantized activations, the fast path), both parallelised over weight
//!   rows on a persistent [`ThreadPool`] and both batch invariant.

pub mod attention;
mod cpu;
pub mod dequant;
pub mod dequant_kv;
pub mod dot;
mod error;
mod fp16;
pub mod grid_quants;
mod iq_grids;
pub mod layout;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod quant_types;
pub mod quantize;

pub use cpu::{
    cpu_path, has_amx, has_avx2_fma_f16c, has_vnni, set_wide_tiles, wide_tiles, CpuPath,
};
pub use dequant::dequantize_row;
pub use dot::{dot_f32, dot_f32_scalar, vec_dot, vec_dot_f32_act, vec_dot_scalar};
pub use error::KernelError;
pub use layout::{
    repack_rows_interleaved, repack_rows_interleaved_nibbles, repack_scales_first,
    unpack_rows_interleaved, unpack_scales_first, WeightLayout, ROW_GROUP,
};
pub use matmul::{
    matmul_exact, matmul_quant, matmul_quant_group, matmul_quant_refined, matmul_quant_with,
    product_kernel, quant_scratch_bytes, Activations, Matrix, QuantProduct, MAX_GROUP,
};
pub use pool::ThreadPool;
pub use quant_types::{BlockQ8K, QuantType, QK4_0, QK4_1, QK5_0, QK5_1, QK8_0, QK8_1, QK_K};
pub use quantize::{
    i16_row_bytes, quantize_row, quantize_row_i16, quantize_row_i16_scalar, quantize_row_q4_0,
    quantize_row_q5_0, quantize_row_q8_0, quantize_row_q8_0_scalar, quantize_row_q8_1,
    quantize_row_q8_1_scalar, quantize_row_q8_k, quantize_row_q8_k_scalar, I16_BLOCK_BYTES,
    I16_LEVELS,
};
