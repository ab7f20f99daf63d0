//! Dot products between one weight row and one activation row.
//!
//! Weights stay in their block format; activations are quantized into the format llama.cpp pairs
//! with each weight type ([`QuantType::vec_dot_type`]) so the inner loops are integer
//! multiply-adds, or kept as f32 for the float weight types. Each kernel exists as a portable
//! scalar function ([`scalar`]) and, on x86-64, an AVX2+FMA version (`avx2`) chosen at run time.

/// A [`GemmKernel`] entry point: `fn $name(call: &GemmCall)` calling `$body(call)`, under the
/// given attributes (`#[target_feature]` for the SIMD kernels, whose generic drivers are
/// instantiated once per type, layout and width here).
macro_rules! gemm_entry {
    ($(#[$attr:meta])* $vis:vis $name:ident, $body:expr) => {
        $(#[$attr])*
        $vis unsafe fn $name(call: &$crate::dot::GemmCall) {
            $body(call)
        }
    };
}

/// A [`GemmKernel`] entry point over rows of `$what` in the row-interleaved layout (`nr` a
/// multiple of 16), compiled for AVX512-VNNI.
#[cfg(target_arch = "x86_64")]
macro_rules! rows_entry {
    ($name:ident, $body:expr, $what:literal) => {
        gemm_entry!(
            #[doc = concat!($what, " rows in the row-interleaved layout (`nr` a multiple of 16).")]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
            pub $name,
            $body
        );
    };
}

// Files go by the rows' layout (then the type family), as the registry's operations do; each
// holds its kernels for every CPU level (see `registry.rs`).
#[cfg(target_arch = "x86_64")]
pub(crate) mod blocks_float;
#[cfg(target_arch = "x86_64")]
pub(crate) mod blocks_grid;
#[cfg(target_arch = "x86_64")]
pub(crate) mod blocks_iq4_xs;
#[cfg(target_arch = "x86_64")]
pub(crate) mod blocks_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod blocks_q32;
#[cfg(target_arch = "x86_64")]
pub(crate) mod float_acts;
#[cfg(target_arch = "x86_64")]
pub(crate) mod interleaved_amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod interleaved_int16;
#[cfg(target_arch = "x86_64")]
pub(crate) mod interleaved_q32;
#[cfg(target_arch = "x86_64")]
pub(crate) mod interleaved_super;
pub mod registry;
pub mod scalar;
pub mod twins;
#[cfg(target_arch = "x86_64")]
pub(crate) mod unpacking_grid;

/// The float-activation tiles' SIMD dequantizer (Q4_K and Q6_K), for tests and benchmarks that
/// compare it with [`dequantize_row`](crate::dequantize_row): `false` for other types or CPUs
/// without AVX2. `src` must hold `ty.row_bytes(dst.len())` bytes.
pub fn dequantize_row_simd(ty: QuantType, src: &[u8], dst: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() && ty.row_bytes(dst.len()) == Some(src.len()) {
        // SAFETY: the CPU has the features; the sizes were checked.
        return unsafe { float_acts::dequantize_row_simd(ty, src, dst) };
    }
    let _ = (ty, src, dst);
    false
}

use crate::error::check_len;
use crate::{cpu, KernelError, QuantType};
use registry::{Level, Operation};

/// A row kernel: `(weight_row, activation_row, n_elements) -> dot`.
///
/// `unsafe` because the SIMD kernels require the CPU features and trust the slice lengths that
/// the public entry points validated.
pub(crate) type DotKernel = unsafe fn(&[u8], &[u8], usize) -> f32;

/// The operands of a tiled matrix kernel: a rectangle of `nr` weight rows `ldw` bytes apart
/// (`ldw` a row's bytes in its layout; the row-interleaved layouts address whole groups of 16)
/// and `nt` activation rows `lda` bytes apart, over `n` elements, written to
/// `out[t * ldo + r]`.
#[derive(Clone, Copy)]
pub(crate) struct GemmCall {
    pub(crate) w: *const u8,
    pub(crate) ldw: usize,
    pub(crate) a: *const u8,
    pub(crate) lda: usize,
    pub(crate) n: usize,
    pub(crate) nr: usize,
    pub(crate) nt: usize,
    pub(crate) out: *mut f32,
    pub(crate) ldo: usize,
}

/// A tiled matrix kernel over a [`GemmCall`]'s rectangle: `out[t * ldo + r] = dot(w + r * ldw,
/// a + t * lda)` for every `r < nr`, `t < nt`, each value bit-identical to the single-pair
/// kernel of the same type (see its [`Twin`](registry::Twin)).
///
/// `unsafe`: requires the CPU features of its SIMD implementation and pointers valid for every
/// row, activation row and output it touches.
pub(crate) type GemmKernel = unsafe fn(&GemmCall);

/// The portable pair kernel for weight type `ty`, `None` for activation-only types.
pub(crate) fn scalar_kernel(ty: QuantType) -> Option<DotKernel> {
    registry::select_at(ty, Operation::Dot, Level::Portable)?.dot_kernel()
}

/// The fastest pair kernel for weight type `ty` on this CPU, `None` for activation-only types.
pub(crate) fn best_kernel(ty: QuantType) -> Option<DotKernel> {
    registry::select(ty, Operation::Dot)?.dot_kernel()
}

/// Validates a (weight row, activation row) pair for `n` elements.
pub(crate) fn check_pair(ty: QuantType, w: &[u8], a: &[u8], n: usize) -> Result<(), KernelError> {
    let act = ty.vec_dot_type().ok_or(KernelError::Unsupported {
        ty,
        op: "vec_dot weight type",
    })?;
    check_len(
        "vec_dot weight row bytes",
        ty.row_bytes_checked(n)?,
        w.len(),
    )?;
    // The activation type's block size never exceeds the weight's, so this cannot fail on
    // divisibility once the weight check passed.
    check_len(
        "vec_dot activation row bytes",
        act.row_bytes_checked(n)?,
        a.len(),
    )
}

/// Dot product of a weight row of type `weight_type` with an activation row already in the
/// paired format (`weight_type.vec_dot_type()`: Q8_0, Q8_1, Q8_K, or little-endian f32 bytes
/// for F32/F16/BF16 weights), over `n` elements. Uses the fastest kernel for this CPU.
pub fn vec_dot(
    weight_type: QuantType,
    weight_row: &[u8],
    act_row: &[u8],
    n: usize,
) -> Result<f32, KernelError> {
    check_pair(weight_type, weight_row, act_row, n)?;
    let k = best_kernel(weight_type).ok_or(KernelError::Unsupported {
        ty: weight_type,
        op: "vec_dot weight type",
    })?;
    // SAFETY: lengths validated above; `best_kernel` only returns SIMD kernels the CPU supports.
    Ok(unsafe { k(weight_row, act_row, n) })
}

/// Scalar twin of [`vec_dot`] (same contract), for testing and reference.
pub fn vec_dot_scalar(
    weight_type: QuantType,
    weight_row: &[u8],
    act_row: &[u8],
    n: usize,
) -> Result<f32, KernelError> {
    check_pair(weight_type, weight_row, act_row, n)?;
    let k = scalar_kernel(weight_type).ok_or(KernelError::Unsupported {
        ty: weight_type,
        op: "vec_dot weight type",
    })?;
    // SAFETY: scalar kernels are safe functions; lengths validated above.
    Ok(unsafe { k(weight_row, act_row, n) })
}

/// Bit-exact scalar twin of the SIMD [`vec_dot`] for the weight types that have tiled kernels
/// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K): the same lane grouping, rounding and reduction order, so on
/// an AVX2 machine the two agree bit for bit. Other types are `Unsupported`.
pub fn vec_dot_scalar_bitexact(
    weight_type: QuantType,
    weight_row: &[u8],
    act_row: &[u8],
    n: usize,
) -> Result<f32, KernelError> {
    check_pair(weight_type, weight_row, act_row, n)?;
    twins::bitexact(weight_type, weight_row, act_row, n).ok_or(KernelError::Unsupported {
        ty: weight_type,
        op: "bit-exact scalar vec_dot",
    })
}

/// Views an f32 slice as its little-endian bytes (rill only targets little-endian CPUs).
#[inline]
pub(crate) fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: any f32 bit pattern is valid bytes; length in bytes is 4 × len; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}

#[cfg(target_endian = "big")]
compile_error!("rill-kernels assumes a little-endian target");

/// Dot product of a float-typed weight row (F32, F16 or BF16 bytes) with f32 activations.
pub fn vec_dot_f32_act(
    weight_type: QuantType,
    weight_row: &[u8],
    act: &[f32],
) -> Result<f32, KernelError> {
    if weight_type.is_quantized() {
        return Err(KernelError::Unsupported {
            ty: weight_type,
            op: "vec_dot_f32_act (quantized weights need quantized activations)",
        });
    }
    vec_dot(weight_type, weight_row, f32_bytes(act), act.len())
}

/// f32 dot product (AVX2+FMA when available). Computes over the common prefix of the two slices;
/// callers are expected to pass equal lengths (checked in debug builds) — this is a hot helper
/// for attention, so it returns a plain `f32`.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() {
        // SAFETY: features checked; the kernel reads min(len) elements of each.
        return unsafe { blocks_float::dot_f32(a, b) };
    }
    scalar::dot_f32(a, b)
}

/// Scalar twin of [`dot_f32`].
pub fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    scalar::dot_f32(a, b)
}

/// Reproducible data for the kernels' tests.
#[cfg(test)]
pub(crate) mod test_data {
    /// A xorshift64 generator.
    pub(crate) struct XorShift(pub(crate) u64);

    impl XorShift {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// A value in -1..=1, in steps of 1/1000.
        pub(crate) fn unit(&mut self) -> f32 {
            (self.next() % 2001) as f32 / 1000.0 - 1.0
        }
    }

    /// `count` Q8_K rows of `n` elements, element `i` of row `t` quantized from `value(t, i)`.
    pub(crate) fn q8_k_rows(
        n: usize,
        count: usize,
        mut value: impl FnMut(usize, usize) -> f32,
    ) -> Vec<u8> {
        let ab = crate::QuantType::Q8_K.row_bytes(n).unwrap();
        let mut a = vec![0u8; count * ab];
        for (t, row) in a.chunks_exact_mut(ab).enumerate() {
            let x: Vec<f32> = (0..n).map(|i| value(t, i)).collect();
            crate::quantize_row_q8_k(&x, row).unwrap();
        }
        a
    }
}
