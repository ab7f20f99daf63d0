//! Dot products between one weight row and one activation row.
//!
//! Weights stay in their block format; activations are quantized into the format llama.cpp pairs
//! with each weight type ([`QuantType::vec_dot_type`]) so the inner loops are integer
//! multiply-adds, or kept as f32 for the float weight types. Each kernel exists as a portable
//! scalar function ([`scalar`]) and, on x86-64, an AVX2+FMA version (`avx2`) chosen at run time.

/// A [`GemmKernel`] entry point: `fn $name(w, ldw, a, lda, n, nr, nt, out, ldo)` calling
/// `$body` with the same arguments, under the given attributes (`#[target_feature]` for the
/// SIMD kernels, whose generic drivers are instantiated once per type, layout and width here).
macro_rules! gemm_entry {
    ($(#[$attr:meta])* $vis:vis $name:ident, $body:expr) => {
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        $vis unsafe fn $name(
            w: *const u8,
            ldw: usize,
            a: *const u8,
            lda: usize,
            n: usize,
            nr: usize,
            nt: usize,
            out: *mut f32,
            ldo: usize,
        ) {
            $body(w, ldw, a, lda, n, nr, nt, out, ldo)
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod deq_tile;
#[cfg(target_arch = "x86_64")]
pub(crate) mod iq;
#[cfg(target_arch = "x86_64")]
pub(crate) mod iq_grid;
#[cfg(target_arch = "x86_64")]
pub(crate) mod iq_grid_vnni;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tile;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tile_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tile_ri;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tile_ri_super;
pub mod tile_scalar;

/// The float-activation tiles' SIMD dequantizer (Q4_K and Q6_K), for tests and benchmarks that
/// compare it with [`dequantize_row`](crate::dequantize_row): `false` for other types or CPUs
/// without AVX2. `src` must hold `ty.row_bytes(dst.len())` bytes.
pub fn dequantize_row_simd(ty: QuantType, src: &[u8], dst: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() && ty.row_bytes(dst.len()) == Some(src.len()) {
        // SAFETY: the CPU has the features; the sizes were checked.
        return unsafe { deq_tile::dequantize_row_simd(ty, src, dst) };
    }
    let _ = (ty, src, dst);
    false
}

use crate::error::check_len;
use crate::{cpu, KernelError, QuantType, WeightLayout};

/// A row kernel: `(weight_row, activation_row, n_elements) -> dot`.
///
/// `unsafe` because the SIMD kernels require the CPU features and trust the slice lengths that
/// the public entry points validated.
pub(crate) type DotKernel = unsafe fn(&[u8], &[u8], usize) -> f32;

/// A tiled matrix kernel over a rectangle of outputs:
/// `(w, ldw, a, lda, n, n_rows, n_tokens, out, ldo)` computes
/// `out[t * ldo + r] = dot(w + r * ldw, a + t * lda)` over `n` elements for every `r < n_rows`,
/// `t < n_tokens`, each value bit-identical to the single-pair kernel of the same type.
///
/// `unsafe`: requires the CPU features of its SIMD implementation and pointers valid for every
/// row, activation row and output it touches.
pub(crate) type GemmKernel =
    unsafe fn(*const u8, usize, *const u8, usize, usize, usize, usize, *mut f32, usize);

/// The AMX tile for weight type `ty` in `layout`, where this CPU runs one (`amx.rs`: the
/// super-block types' row-interleaved rows; the same bits as [`best_gemm_kernel`]'s).
pub(crate) fn amx_gemm_kernel(ty: QuantType, layout: WeightLayout) -> Option<GemmKernel> {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_amx() {
        return match (layout, ty) {
            (WeightLayout::RowInterleaved, QuantType::IQ4_XS) => Some(amx::gemm_iq4_xs_rows_amx),
            (WeightLayout::RowInterleaved, QuantType::Q4_K) => Some(amx::gemm_q4_k_rows_i8_amx),
            (WeightLayout::RowInterleaved, QuantType::Q5_K) => Some(amx::gemm_q5_k_rows_amx),
            (WeightLayout::RowInterleavedNibbles, QuantType::Q6_K) => {
                Some(amx::gemm_q6_k_nibbles_amx)
            }
            _ => None,
        };
    }
    let _ = (ty, layout);
    None
}

/// The tiled kernel for weight type `ty` in `layout` on this CPU, if there is one (otherwise
/// callers loop over [`best_kernel`] pairs, which is equally batch invariant; rows in the
/// scales-first and row-interleaved layouts only have tiled kernels).
pub(crate) fn best_gemm_kernel(ty: QuantType, layout: WeightLayout) -> Option<GemmKernel> {
    #[cfg(target_arch = "x86_64")]
    if layout == WeightLayout::RowInterleavedNibbles {
        return match ty {
            QuantType::Q6_K if cpu::has_vnni() => Some(tile_ri_super::gemm_q6_k_nibbles),
            _ => None,
        };
    }
    #[cfg(target_arch = "x86_64")]
    if layout == WeightLayout::RowInterleaved {
        return match ty {
            QuantType::Q4_0 if cpu::has_vnni() => Some(tile_ri::gemm_q4_0_rows),
            QuantType::Q4_1 if cpu::has_vnni() => Some(tile_ri::gemm_q4_1_rows),
            QuantType::Q5_0 if cpu::has_vnni() => Some(tile_ri::gemm_q5_0_rows),
            QuantType::Q8_0 if cpu::has_vnni() => Some(tile_ri::gemm_q8_0_rows),
            QuantType::Q4_K if cpu::has_vnni() => Some(tile_ri_super::gemm_q4_k_rows_i8),
            QuantType::IQ4_NL if cpu::has_vnni() => Some(tile_ri::gemm_iq4_nl_rows),
            QuantType::MXFP4 if cpu::has_vnni() => Some(tile_ri::gemm_mxfp4_rows),
            QuantType::IQ4_XS if cpu::has_vnni() => Some(tile_ri_super::gemm_iq4_xs_rows),
            QuantType::Q5_K if cpu::has_vnni() => Some(tile_ri_super::gemm_q5_k_rows),
            _ => None,
        };
    }
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() {
        use QuantType::*;
        let scales_first = layout == WeightLayout::ScalesFirst;
        if cpu::has_vnni() {
            let k: Option<GemmKernel> = match (ty, scales_first) {
                (Q4_0, false) => Some(tile::gemm_q4_0_vnni),
                (Q4_1, false) => Some(tile::gemm_q4_1_vnni),
                (Q5_0, false) => Some(tile::gemm_q5_0_vnni),
                (Q5_1, false) => Some(tile::gemm_q5_1_vnni),
                (Q8_0, false) => Some(tile::gemm_q8_0_vnni),
                (Q4_0, true) => Some(tile::gemm_q4_0_sf_vnni),
                (Q4_1, true) => Some(tile::gemm_q4_1_sf_vnni),
                (Q5_0, true) => Some(tile::gemm_q5_0_sf_vnni),
                (Q5_1, true) => Some(tile::gemm_q5_1_sf_vnni),
                (Q8_0, true) => Some(tile::gemm_q8_0_sf_vnni),
                (Q4_K, false) => Some(tile_k::gemm_q4_k_wide),
                (IQ4_NL, false) => Some(tile::gemm_iq4_nl_vnni),
                (MXFP4, false) => Some(tile::gemm_mxfp4_vnni),
                _ => None,
            };
            if k.is_some() {
                return k;
            }
        }
        return match (ty, scales_first) {
            (Q4_0, false) => Some(tile::gemm_q4_0),
            (Q4_1, false) => Some(tile::gemm_q4_1),
            (Q5_0, false) => Some(tile::gemm_q5_0),
            (Q5_1, false) => Some(tile::gemm_q5_1),
            (Q8_0, false) => Some(tile::gemm_q8_0),
            (Q4_K, false) => Some(tile_k::gemm_q4_k),
            (Q6_K, false) => Some(tile_k::gemm_q6_k),
            (IQ4_XS, _) => Some(iq::gemm_iq4_xs),
            (IQ4_NL, false) => Some(tile::gemm_iq4_nl),
            (MXFP4, false) => Some(tile::gemm_mxfp4),
            (IQ2_XXS, false) => Some(iq_grid::gemm_iq2_xxs),
            (IQ2_XS, false) => Some(iq_grid::gemm_iq2_xs),
            (IQ2_S, false) => Some(iq_grid::gemm_iq2_s),
            (IQ3_XXS, false) => Some(iq_grid::gemm_iq3_xxs),
            (IQ3_S, false) => Some(iq_grid::gemm_iq3_s),
            (IQ1_S, false) => Some(iq_grid::gemm_iq1_s),
            (IQ1_M, false) => Some(iq_grid::gemm_iq1_m),
            (TQ1_0, false) => Some(iq_grid::gemm_tq1_0),
            (TQ2_0, false) => Some(iq_grid::gemm_tq2_0),
            (Q4_0, true) => Some(tile::gemm_q4_0_sf),
            (Q4_1, true) => Some(tile::gemm_q4_1_sf),
            (Q5_0, true) => Some(tile::gemm_q5_0_sf),
            (Q5_1, true) => Some(tile::gemm_q5_1_sf),
            (Q8_0, true) => Some(tile::gemm_q8_0_sf),
            _ => None,
        };
    }
    let _ = (ty, layout);
    None
}

/// The tiled kernel that unpacks `ty`'s rows (in the file's block layout) into bytes once per
/// call and meets every token of the call with them, if this CPU has one: the grid i-quants,
/// the ternary types, Q2_K and Q3_K with AVX512-VNNI. Its calls should take many tokens, since each
/// unpacks its rows anew.
pub(crate) fn unpacking_gemm_kernel(ty: QuantType, layout: WeightLayout) -> Option<GemmKernel> {
    #[cfg(target_arch = "x86_64")]
    if layout == WeightLayout::Blocks && cpu::has_vnni() {
        use QuantType::*;
        return match ty {
            IQ2_XXS => Some(iq_grid_vnni::gemm_iq2_xxs_vnni),
            IQ2_XS => Some(iq_grid_vnni::gemm_iq2_xs_vnni),
            IQ2_S => Some(iq_grid_vnni::gemm_iq2_s_vnni),
            IQ3_XXS => Some(iq_grid_vnni::gemm_iq3_xxs_vnni),
            IQ3_S => Some(iq_grid_vnni::gemm_iq3_s_vnni),
            IQ1_S => Some(iq_grid_vnni::gemm_iq1_s_vnni),
            IQ1_M => Some(iq_grid_vnni::gemm_iq1_m_vnni),
            TQ1_0 => Some(iq_grid_vnni::gemm_tq1_0_vnni),
            TQ2_0 => Some(iq_grid_vnni::gemm_tq2_0_vnni),
            Q2_K => Some(iq_grid_vnni::gemm_q2_k_vnni),
            Q3_K => Some(iq_grid_vnni::gemm_q3_k_vnni),
            _ => None,
        };
    }
    let _ = (ty, layout);
    None
}

/// The kernel of row-interleaved `ty` rows against 16-bit activations (Q4_K, Q6_K) on this CPU.
pub(crate) fn int16_gemm_kernel(ty: QuantType) -> Option<GemmKernel> {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_vnni() {
        return match ty {
            QuantType::Q6_K => Some(tile_ri::gemm_q6_k_rows),
            QuantType::Q4_K => Some(tile_ri::gemm_q4_k_rows),
            _ => None,
        };
    }
    let _ = ty;
    None
}

/// The tiled float-activation kernel of quantized weight type `ty` (weights dequantized
/// exactly, f32 activations; see `deq_tile.rs`): AVX2 where this CPU has it, else the portable
/// twin. `None` for float and activation-only types.
pub(crate) fn f32act_gemm_kernel(ty: QuantType) -> Option<GemmKernel> {
    use QuantType::*;
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() && cpu::has_vnni() {
        return Some(match ty {
            Q4_0 => deq_tile::gemm_f32act_q4_0_wide,
            Q4_1 => deq_tile::gemm_f32act_q4_1_wide,
            Q5_0 => deq_tile::gemm_f32act_q5_0_wide,
            Q5_1 => deq_tile::gemm_f32act_q5_1_wide,
            Q8_0 => deq_tile::gemm_f32act_q8_0_wide,
            Q2_K => deq_tile::gemm_f32act_q2_k_wide,
            Q3_K => deq_tile::gemm_f32act_q3_k_wide,
            Q4_K => deq_tile::gemm_f32act_q4_k_wide,
            Q5_K => deq_tile::gemm_f32act_q5_k_wide,
            Q6_K => deq_tile::gemm_f32act_q6_k_wide,
            IQ4_NL => deq_tile::gemm_f32act_iq4_nl_wide,
            IQ4_XS => deq_tile::gemm_f32act_iq4_xs_wide,
            MXFP4 => deq_tile::gemm_f32act_mxfp4_wide,
            IQ2_XXS => deq_tile::gemm_f32act_iq2_xxs_wide,
            IQ2_XS => deq_tile::gemm_f32act_iq2_xs_wide,
            IQ2_S => deq_tile::gemm_f32act_iq2_s_wide,
            IQ3_XXS => deq_tile::gemm_f32act_iq3_xxs_wide,
            IQ3_S => deq_tile::gemm_f32act_iq3_s_wide,
            IQ1_S => deq_tile::gemm_f32act_iq1_s_wide,
            IQ1_M => deq_tile::gemm_f32act_iq1_m_wide,
            TQ1_0 => deq_tile::gemm_f32act_tq1_0_wide,
            TQ2_0 => deq_tile::gemm_f32act_tq2_0_wide,
            F32 | F16 | BF16 | Q8_1 | Q8_K => return None,
        });
    }
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() {
        return Some(match ty {
            Q4_0 => deq_tile::gemm_f32act_q4_0,
            Q4_1 => deq_tile::gemm_f32act_q4_1,
            Q5_0 => deq_tile::gemm_f32act_q5_0,
            Q5_1 => deq_tile::gemm_f32act_q5_1,
            Q8_0 => deq_tile::gemm_f32act_q8_0,
            Q2_K => deq_tile::gemm_f32act_q2_k,
            Q3_K => deq_tile::gemm_f32act_q3_k,
            Q4_K => deq_tile::gemm_f32act_q4_k,
            Q5_K => deq_tile::gemm_f32act_q5_k,
            Q6_K => deq_tile::gemm_f32act_q6_k,
            IQ4_NL => deq_tile::gemm_f32act_iq4_nl,
            IQ4_XS => deq_tile::gemm_f32act_iq4_xs,
            MXFP4 => deq_tile::gemm_f32act_mxfp4,
            IQ2_XXS => deq_tile::gemm_f32act_iq2_xxs,
            IQ2_XS => deq_tile::gemm_f32act_iq2_xs,
            IQ2_S => deq_tile::gemm_f32act_iq2_s,
            IQ3_XXS => deq_tile::gemm_f32act_iq3_xxs,
            IQ3_S => deq_tile::gemm_f32act_iq3_s,
            IQ1_S => deq_tile::gemm_f32act_iq1_s,
            IQ1_M => deq_tile::gemm_f32act_iq1_m,
            TQ1_0 => deq_tile::gemm_f32act_tq1_0,
            TQ2_0 => deq_tile::gemm_f32act_tq2_0,
            F32 | F16 | BF16 | Q8_1 | Q8_K => return None,
        });
    }
    Some(match ty {
        Q4_0 => tile_scalar::gemm_f32act_q4_0,
        Q4_1 => tile_scalar::gemm_f32act_q4_1,
        Q5_0 => tile_scalar::gemm_f32act_q5_0,
        Q5_1 => tile_scalar::gemm_f32act_q5_1,
        Q8_0 => tile_scalar::gemm_f32act_q8_0,
        Q2_K => tile_scalar::gemm_f32act_q2_k,
        Q3_K => tile_scalar::gemm_f32act_q3_k,
        Q4_K => tile_scalar::gemm_f32act_q4_k,
        Q5_K => tile_scalar::gemm_f32act_q5_k,
        Q6_K => tile_scalar::gemm_f32act_q6_k,
        IQ4_NL => tile_scalar::gemm_f32act_iq4_nl,
        IQ4_XS => tile_scalar::gemm_f32act_iq4_xs,
        MXFP4 => tile_scalar::gemm_f32act_mxfp4,
        IQ2_XXS => tile_scalar::gemm_f32act_iq2_xxs,
        IQ2_XS => tile_scalar::gemm_f32act_iq2_xs,
        IQ2_S => tile_scalar::gemm_f32act_iq2_s,
        IQ3_XXS => tile_scalar::gemm_f32act_iq3_xxs,
        IQ3_S => tile_scalar::gemm_f32act_iq3_s,
        IQ1_S => tile_scalar::gemm_f32act_iq1_s,
        IQ1_M => tile_scalar::gemm_f32act_iq1_m,
        TQ1_0 => tile_scalar::gemm_f32act_tq1_0,
        TQ2_0 => tile_scalar::gemm_f32act_tq2_0,
        F32 | F16 | BF16 | Q8_1 | Q8_K => return None,
    })
}

/// The scalar kernel for weight type `ty`, `None` for activation-only types.
pub(crate) fn scalar_kernel(ty: QuantType) -> Option<DotKernel> {
    use QuantType::*;
    Some(match ty {
        F32 => scalar::f32_f32,
        F16 => scalar::f16_f32,
        BF16 => scalar::bf16_f32,
        Q4_0 => scalar::q4_0_q8_0,
        Q4_1 => scalar::q4_1_q8_1,
        Q5_0 => scalar::q5_0_q8_0,
        Q5_1 => scalar::q5_1_q8_1,
        Q8_0 => scalar::q8_0_q8_0,
        Q2_K => scalar::q2_k_q8_k,
        Q3_K => scalar::q3_k_q8_k,
        Q4_K => scalar::q4_k_q8_k,
        Q5_K => scalar::q5_k_q8_k,
        Q6_K => scalar::q6_k_q8_k,
        IQ4_NL => scalar::iq4_nl_q8_0,
        IQ4_XS => scalar::iq4_xs_q8_k,
        MXFP4 => scalar::mxfp4_q8_0,
        IQ2_XXS => scalar::iq2_xxs_q8_k,
        IQ2_XS => scalar::iq2_xs_q8_k,
        IQ2_S => scalar::iq2_s_q8_k,
        IQ3_XXS => scalar::iq3_xxs_q8_k,
        IQ3_S => scalar::iq3_s_q8_k,
        IQ1_S => scalar::iq1_s_q8_k,
        IQ1_M => scalar::iq1_m_q8_k,
        TQ1_0 => scalar::tq1_0_q8_k,
        TQ2_0 => scalar::tq2_0_q8_k,
        Q8_1 | Q8_K => return None,
    })
}

/// The fastest kernel for weight type `ty` on this CPU, `None` for activation-only types.
pub(crate) fn best_kernel(ty: QuantType) -> Option<DotKernel> {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() {
        use QuantType::*;
        if cpu::has_vnni() {
            let k: Option<DotKernel> = match ty {
                Q4_0 => Some(tile::q4_0_q8_0_vnni),
                Q4_1 => Some(tile::q4_1_q8_1_vnni),
                Q5_0 => Some(tile::q5_0_q8_0_vnni),
                Q5_1 => Some(tile::q5_1_q8_1_vnni),
                Q8_0 => Some(tile::q8_0_q8_0_vnni),
                IQ4_NL => Some(tile::iq4_nl_q8_0_vnni),
                MXFP4 => Some(tile::mxfp4_q8_0_vnni),
                IQ2_XXS => Some(iq_grid_vnni::iq2_xxs_q8_k_vnni),
                IQ2_XS => Some(iq_grid_vnni::iq2_xs_q8_k_vnni),
                IQ2_S => Some(iq_grid_vnni::iq2_s_q8_k_vnni),
                IQ3_XXS => Some(iq_grid_vnni::iq3_xxs_q8_k_vnni),
                IQ3_S => Some(iq_grid_vnni::iq3_s_q8_k_vnni),
                IQ1_S => Some(iq_grid_vnni::iq1_s_q8_k_vnni),
                IQ1_M => Some(iq_grid_vnni::iq1_m_q8_k_vnni),
                TQ1_0 => Some(iq_grid_vnni::tq1_0_q8_k_vnni),
                TQ2_0 => Some(iq_grid_vnni::tq2_0_q8_k_vnni),
                Q2_K => Some(iq_grid_vnni::q2_k_q8_k_vnni),
                Q3_K => Some(iq_grid_vnni::q3_k_q8_k_vnni),
                _ => None,
            };
            if k.is_some() {
                return k;
            }
        }
        let k: Option<DotKernel> = match ty {
            F32 => Some(avx2::f32_f32),
            F16 => Some(avx2::f16_f32),
            BF16 => Some(avx2::bf16_f32),
            Q4_0 => Some(tile::q4_0_q8_0),
            Q4_1 => Some(tile::q4_1_q8_1),
            Q5_0 => Some(tile::q5_0_q8_0),
            Q5_1 => Some(tile::q5_1_q8_1),
            Q8_0 => Some(tile::q8_0_q8_0),
            Q4_K => Some(tile_k::q4_k_q8_k),
            Q5_K => Some(avx2::q5_k_q8_k),
            Q6_K => Some(tile_k::q6_k_q8_k),
            IQ4_NL => Some(tile::iq4_nl_q8_0),
            IQ4_XS => Some(iq::iq4_xs_q8_k),
            MXFP4 => Some(tile::mxfp4_q8_0),
            IQ2_XXS => Some(iq_grid::iq2_xxs_q8_k),
            IQ2_XS => Some(iq_grid::iq2_xs_q8_k),
            IQ2_S => Some(iq_grid::iq2_s_q8_k),
            IQ3_XXS => Some(iq_grid::iq3_xxs_q8_k),
            IQ3_S => Some(iq_grid::iq3_s_q8_k),
            IQ1_S => Some(iq_grid::iq1_s_q8_k),
            IQ1_M => Some(iq_grid::iq1_m_q8_k),
            TQ1_0 => Some(iq_grid::tq1_0_q8_k),
            TQ2_0 => Some(iq_grid::tq2_0_q8_k),
            _ => None,
        };
        if k.is_some() {
            return k;
        }
    }
    scalar_kernel(ty)
}

/// Validates a (weight row, activation row) pair for `n` elements.
fn check_pair(ty: QuantType, w: &[u8], a: &[u8], n: usize) -> Result<(), KernelError> {
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

/// [`vec_dot`] by every SIMD implementation this CPU can run for `weight_type` (for instance
/// AVX2 `maddubs` and AVX512-VNNI `vpdpbusd` for the 32-element block types), named: lets tests
/// hold every path to the scalar twin, not only the one [`vec_dot`] picks here.
pub fn vec_dot_simd_variants(
    weight_type: QuantType,
    weight_row: &[u8],
    act_row: &[u8],
    n: usize,
) -> Result<Vec<(&'static str, f32)>, KernelError> {
    check_pair(weight_type, weight_row, act_row, n)?;
    #[allow(unused_mut)]
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() {
        use QuantType::*;
        let pairs: Option<(DotKernel, DotKernel)> = match weight_type {
            Q4_0 => Some((tile::q4_0_q8_0, tile::q4_0_q8_0_vnni)),
            Q4_1 => Some((tile::q4_1_q8_1, tile::q4_1_q8_1_vnni)),
            Q5_0 => Some((tile::q5_0_q8_0, tile::q5_0_q8_0_vnni)),
            Q5_1 => Some((tile::q5_1_q8_1, tile::q5_1_q8_1_vnni)),
            Q8_0 => Some((tile::q8_0_q8_0, tile::q8_0_q8_0_vnni)),
            IQ4_NL => Some((tile::iq4_nl_q8_0, tile::iq4_nl_q8_0_vnni)),
            MXFP4 => Some((tile::mxfp4_q8_0, tile::mxfp4_q8_0_vnni)),
            _ => None,
        };
        if let Some((avx2, vnni)) = pairs {
            // SAFETY: lengths validated above; each kernel runs only where its features are.
            out.push(("avx2", unsafe { avx2(weight_row, act_row, n) }));
            if cpu::has_vnni() {
                out.push(("avx512vnni", unsafe { vnni(weight_row, act_row, n) }));
            }
        } else if let Some(k) = best_kernel(weight_type) {
            out.push(("avx2", unsafe { k(weight_row, act_row, n) }));
        }
    }
    Ok(out)
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
    tile_scalar::bitexact(weight_type, weight_row, act_row, n).ok_or(KernelError::Unsupported {
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
        return unsafe { avx2::dot_f32(a, b) };
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
