//! Every kernel rill has, in one table: what it computes ([`Operation`]), for which weight type,
//! on which CPU feature [`Level`], and the scalar [`Twin`] it must equal. The dispatch
//! ([`select`]) and the tests (`tests/registry.rs` runs every entry this CPU can run against its
//! twin) read the same table, so a kernel cannot be dispatched without being tested, nor
//! registered without a twin.

use std::sync::OnceLock;

use super::{twins, DotKernel, GemmCall, GemmKernel};
use crate::quantize::i16_row_bytes;
use crate::{cpu, KernelError, QuantType, WeightLayout};

/// What a kernel computes, and from which operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// One weight row in the file's blocks · one activation row in the weight type's paired
    /// format ([`QuantType::vec_dot_type`]).
    Dot,
    /// A rectangle of rows (in this layout) × tokens, activations in the paired format.
    Tiles(WeightLayout),
    /// Tiles over rows in the file's blocks that unpack their rows into bytes once per call
    /// (the grid i-quants, the ternary types, Q2_K and Q3_K), for calls of many tokens.
    UnpackingTiles,
    /// Tiles over row-interleaved Q4_K/Q6_K rows against 16-bit activations
    /// ([`quantize_row_i16`](crate::quantize_row_i16)).
    Int16Tiles,
    /// Tiles that dequantize the file's blocks exactly and multiply them with f32 activations.
    FloatTiles,
}

impl Operation {
    const COUNT: usize = 8;

    fn index(self) -> usize {
        match self {
            Operation::Dot => 0,
            Operation::Tiles(WeightLayout::Blocks) => 1,
            Operation::Tiles(WeightLayout::ScalesFirst) => 2,
            Operation::Tiles(WeightLayout::RowInterleaved) => 3,
            Operation::Tiles(WeightLayout::RowInterleavedNibbles) => 4,
            Operation::UnpackingTiles => 5,
            Operation::Int16Tiles => 6,
            Operation::FloatTiles => 7,
        }
    }

    /// The layout of the weight rows it reads.
    pub fn layout(self) -> WeightLayout {
        match self {
            Operation::Tiles(layout) => layout,
            Operation::Int16Tiles => WeightLayout::RowInterleaved,
            _ => WeightLayout::Blocks,
        }
    }

    /// Bytes of one activation row of `n` elements for weight type `ty`.
    pub fn activation_row_bytes(self, ty: QuantType, n: usize) -> Result<usize, KernelError> {
        let unsupported = KernelError::Unsupported {
            ty,
            op: "activations of this weight type",
        };
        match self {
            Operation::FloatTiles => n.checked_mul(4).ok_or(KernelError::Overflow),
            Operation::Int16Tiles => i16_row_bytes(n),
            _ => ty.vec_dot_type().ok_or(unsupported)?.row_bytes_checked(n),
        }
    }
}

/// The CPU features a kernel needs, in the order the dispatch prefers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Portable Rust.
    Portable,
    /// x86-64 AVX2, FMA and F16C.
    Avx2,
    /// AVX512-VNNI with AVX512-F, BW and VL (on top of AVX2).
    Avx512Vnni,
    /// AMX-TILE and AMX-INT8 (on top of AVX512-VNNI).
    Amx,
}

impl Level {
    const ALL: [Level; 4] = [Level::Portable, Level::Avx2, Level::Avx512Vnni, Level::Amx];

    /// Whether the dispatch uses this level here (the CPU has it and no switch —
    /// `RILL_FORCE_SCALAR`, `RILL_NO_VNNI`, `RILL_NO_AMX` — turned it off).
    pub fn enabled(self) -> bool {
        match self {
            Level::Portable => true,
            Level::Avx2 => cpu::has_avx2_fma_f16c(),
            Level::Avx512Vnni => cpu::has_vnni(),
            Level::Amx => cpu::has_amx(),
        }
    }

    /// Whether this CPU can run kernels of this level, whatever the switches say (what tests
    /// need to hold every kernel of the machine to its twin on every CI leg).
    pub fn in_hardware(self) -> bool {
        match self {
            Level::Portable => true,
            Level::Avx2 => cpu::avx2_in_hardware(),
            Level::Avx512Vnni => cpu::vnni_in_hardware(),
            Level::Amx => cpu::amx_in_hardware(),
        }
    }
}

/// The scalar function a kernel equals, evaluated per (row, token) on the row in the file's
/// blocks (whatever layout the kernel reads) and the activation row the kernel reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Twin {
    /// The plain scalar kernel ([`scalar`](super::scalar)), bit for bit: kernels that sum each
    /// block in integers and scale and accumulate in its order.
    Scalar,
    /// The plain scalar kernel within rounding: the float-weight dots and AVX2 Q5_K reassociate
    /// their sums (held to 1e-5 of the sum of magnitudes).
    ScalarRounded,
    /// [`twins::bitexact`]: the 8-lane tiled kernels' grouping and reduction tree.
    Tiled,
    /// [`twins::rows_bitexact`]: the row-interleaved 32-element types' block order.
    Interleaved,
    /// [`twins::k_rows_i16_bitexact`]: Q4_K/Q6_K against 16-bit activations.
    Int16,
    /// [`twins::deq_bitexact`]: exact dequantization, then 8-lane fused multiply-adds.
    Dequantized,
}

impl Twin {
    /// Whether the kernel must equal its twin bit for bit.
    pub fn is_bit_exact(self) -> bool {
        self != Twin::ScalarRounded
    }

    /// The twin's value for weight row `w` (the file's blocks) and activation row `a` (the
    /// bytes the kernel reads: paired blocks, 16-bit rows, or little-endian f32) over `n`
    /// elements; `None` where the twin does not cover `ty`.
    pub fn eval(self, ty: QuantType, w: &[u8], a: &[u8], n: usize) -> Option<f32> {
        match self {
            Twin::Scalar | Twin::ScalarRounded => {
                let k = select_at(ty, Operation::Dot, Level::Portable)?.dot_kernel()?;
                super::check_pair(ty, w, a, n).ok()?;
                // SAFETY: portable kernels need no CPU feature; the lengths were checked.
                Some(unsafe { k(w, a, n) })
            }
            Twin::Tiled => twins::bitexact(ty, w, a, n),
            Twin::Interleaved => twins::rows_bitexact(ty, w, a, n),
            Twin::Int16 => twins::k_rows_i16_bitexact(ty, w, a, n),
            Twin::Dequantized => {
                let x: Vec<f32> = a
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                twins::deq_bitexact(ty, w, &x, n)
            }
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum KernelFn {
    Dot(DotKernel),
    Tiles(GemmKernel),
}

/// One registered kernel.
pub struct Kernel {
    /// The weight type it reads.
    pub ty: QuantType,
    /// What it computes.
    pub operation: Operation,
    /// The CPU features it needs.
    pub level: Level,
    /// Its scalar twin.
    pub twin: Twin,
    /// Its path in `dot/`, for reports.
    pub name: &'static str,
    function: KernelFn,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} {:?}, {:?})",
            self.name, self.ty, self.operation, self.level
        )
    }
}

/// One rectangle for [`Kernel::tiles`]: `out[t * n_rows + r] = row r · token t`.
pub struct TileProblem<'a> {
    /// `n_rows` rows of `n_cols` elements in the kernel's layout.
    pub weights: &'a [u8],
    /// `n_tokens` activation rows ([`Operation::activation_row_bytes`] each).
    pub activations: &'a [u8],
    pub n_cols: usize,
    pub n_rows: usize,
    pub n_tokens: usize,
    /// `n_tokens * n_rows` outputs, token-major.
    pub out: &'a mut [f32],
}

impl Kernel {
    pub(crate) fn dot_kernel(&self) -> Option<DotKernel> {
        match self.function {
            KernelFn::Dot(k) => Some(k),
            KernelFn::Tiles(_) => None,
        }
    }

    pub(crate) fn tile_kernel(&self) -> Option<GemmKernel> {
        match self.function {
            KernelFn::Tiles(k) => Some(k),
            KernelFn::Dot(_) => None,
        }
    }

    /// Whether the dispatch picks this kernel on this machine for its type and operation.
    pub fn is_selected(&self) -> bool {
        select(self.ty, self.operation).is_some_and(|k| std::ptr::eq(k, self))
    }

    fn check_runnable(&self) -> Result<(), KernelError> {
        if self.level.in_hardware() {
            Ok(())
        } else {
            Err(KernelError::Unsupported {
                ty: self.ty,
                op: "a kernel this CPU cannot run",
            })
        }
    }

    /// Runs a [`Operation::Dot`] kernel on one pair, whatever the switches say (the CPU must
    /// have its features).
    pub fn dot(&self, w: &[u8], a: &[u8], n: usize) -> Result<f32, KernelError> {
        let k = self.dot_kernel().ok_or(KernelError::Unsupported {
            ty: self.ty,
            op: "a pair product of a tile kernel",
        })?;
        self.check_runnable()?;
        super::check_pair(self.ty, w, a, n)?;
        // SAFETY: the CPU has the kernel's features; the lengths were checked.
        Ok(unsafe { k(w, a, n) })
    }

    /// Runs a tile kernel over one whole rectangle, whatever the switches say (the CPU must
    /// have its features).
    pub fn tiles(&self, p: TileProblem<'_>) -> Result<(), KernelError> {
        let k = self.tile_kernel().ok_or(KernelError::Unsupported {
            ty: self.ty,
            op: "tiles of a pair kernel",
        })?;
        self.check_runnable()?;
        let layout = self.operation.layout();
        let row_bytes = layout.row_bytes(self.ty, p.n_cols)?;
        let act_bytes = self.operation.activation_row_bytes(self.ty, p.n_cols)?;
        let interleaved = matches!(
            layout,
            WeightLayout::RowInterleaved | WeightLayout::RowInterleavedNibbles
        );
        if interleaved && !p.n_rows.is_multiple_of(16) {
            return Err(KernelError::LengthMismatch {
                what: "rows of a row-interleaved matrix (whole groups of 16)",
                expected: p.n_rows.next_multiple_of(16),
                actual: p.n_rows,
            });
        }
        let size = |a: usize, b: usize| a.checked_mul(b).ok_or(KernelError::Overflow);
        crate::error::check_len("tile weights", size(row_bytes, p.n_rows)?, p.weights.len())?;
        crate::error::check_len(
            "tile activations",
            size(act_bytes, p.n_tokens)?,
            p.activations.len(),
        )?;
        crate::error::check_len("tile outputs", size(p.n_rows, p.n_tokens)?, p.out.len())?;
        if p.n_rows == 0 || p.n_tokens == 0 {
            return Ok(());
        }
        let call = GemmCall {
            w: p.weights.as_ptr(),
            ldw: row_bytes,
            a: p.activations.as_ptr(),
            lda: act_bytes,
            n: p.n_cols,
            nr: p.n_rows,
            nt: p.n_tokens,
            out: p.out.as_mut_ptr(),
            ldo: p.n_rows,
        };
        // SAFETY: the CPU has the kernel's features; every row, activation row and output the
        // rectangle touches lies in the slices checked above.
        unsafe { k(&call) };
        Ok(())
    }
}

/// Every registered kernel, portable ones first.
pub fn kernels() -> impl Iterator<Item = &'static Kernel> {
    PORTABLE.iter().chain(SIMD.iter())
}

/// The kernel the dispatch uses for `ty` and `operation` here: the highest enabled level.
pub fn select(ty: QuantType, operation: Operation) -> Option<&'static Kernel> {
    select_below(ty, operation, None)
}

/// [`select`] among levels under `level` (`None`: every level).
pub(crate) fn select_below(
    ty: QuantType,
    operation: Operation,
    level: Option<Level>,
) -> Option<&'static Kernel> {
    let by_level = &table()[operation.index() * QuantType::ALL.len() + ty as usize];
    Level::ALL
        .iter()
        .rev()
        .filter(|l| level.is_none_or(|top| **l < top) && l.enabled())
        .find_map(|l| by_level[*l as usize])
}

/// The kernel registered for `ty`, `operation` at exactly `level`, if any.
pub fn select_at(ty: QuantType, operation: Operation, level: Level) -> Option<&'static Kernel> {
    table()[operation.index() * QuantType::ALL.len() + ty as usize][level as usize]
}

type ByLevel = [Option<&'static Kernel>; 4];

/// (operation, type) → the kernel of each level, built once from the lists below.
fn table() -> &'static [ByLevel] {
    static TABLE: OnceLock<Vec<ByLevel>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = vec![[None; 4]; Operation::COUNT * QuantType::ALL.len()];
        for k in kernels() {
            let slot = &mut table[k.operation.index() * QuantType::ALL.len() + k.ty as usize]
                [k.level as usize];
            assert!(slot.is_none(), "two kernels registered as {k:?}");
            *slot = Some(k);
        }
        table
    })
}

/// `kernel!(Type, operation, Level, Twin, path)`: one entry; the path names it in reports.
macro_rules! kernel {
    ($ty:ident, Dot, $level:ident, $twin:ident, $module:ident::$f:ident) => {
        Kernel {
            ty: QuantType::$ty,
            operation: Operation::Dot,
            level: Level::$level,
            twin: Twin::$twin,
            name: concat!(stringify!($module), "::", stringify!($f)),
            function: KernelFn::Dot($module::$f),
        }
    };
    ($ty:ident, $op:expr, $level:ident, $twin:ident, $module:ident::$f:ident) => {
        Kernel {
            ty: QuantType::$ty,
            operation: $op,
            level: Level::$level,
            twin: Twin::$twin,
            name: concat!(stringify!($module), "::", stringify!($f)),
            function: KernelFn::Tiles($module::$f),
        }
    };
}

use super::scalar;
use Operation::{FloatTiles, Int16Tiles, Tiles, UnpackingTiles};
use WeightLayout::{Blocks, RowInterleaved, RowInterleavedNibbles, ScalesFirst};

#[rustfmt::skip]
static PORTABLE: &[Kernel] = &[
    kernel!(F32, Dot, Portable, Scalar, scalar::f32_f32),
    kernel!(F16, Dot, Portable, Scalar, scalar::f16_f32),
    kernel!(BF16, Dot, Portable, Scalar, scalar::bf16_f32),
    kernel!(Q4_0, Dot, Portable, Scalar, scalar::q4_0_q8_0),
    kernel!(Q4_1, Dot, Portable, Scalar, scalar::q4_1_q8_1),
    kernel!(Q5_0, Dot, Portable, Scalar, scalar::q5_0_q8_0),
    kernel!(Q5_1, Dot, Portable, Scalar, scalar::q5_1_q8_1),
    kernel!(Q8_0, Dot, Portable, Scalar, scalar::q8_0_q8_0),
    kernel!(Q2_K, Dot, Portable, Scalar, scalar::q2_k_q8_k),
    kernel!(Q3_K, Dot, Portable, Scalar, scalar::q3_k_q8_k),
    kernel!(Q4_K, Dot, Portable, Scalar, scalar::q4_k_q8_k),
    kernel!(Q5_K, Dot, Portable, Scalar, scalar::q5_k_q8_k),
    kernel!(Q6_K, Dot, Portable, Scalar, scalar::q6_k_q8_k),
    kernel!(IQ4_NL, Dot, Portable, Scalar, scalar::iq4_nl_q8_0),
    kernel!(IQ4_XS, Dot, Portable, Scalar, scalar::iq4_xs_q8_k),
    kernel!(MXFP4, Dot, Portable, Scalar, scalar::mxfp4_q8_0),
    kernel!(IQ2_XXS, Dot, Portable, Scalar, scalar::iq2_xxs_q8_k),
    kernel!(IQ2_XS, Dot, Portable, Scalar, scalar::iq2_xs_q8_k),
    kernel!(IQ2_S, Dot, Portable, Scalar, scalar::iq2_s_q8_k),
    kernel!(IQ3_XXS, Dot, Portable, Scalar, scalar::iq3_xxs_q8_k),
    kernel!(IQ3_S, Dot, Portable, Scalar, scalar::iq3_s_q8_k),
    kernel!(IQ1_S, Dot, Portable, Scalar, scalar::iq1_s_q8_k),
    kernel!(IQ1_M, Dot, Portable, Scalar, scalar::iq1_m_q8_k),
    kernel!(TQ1_0, Dot, Portable, Scalar, scalar::tq1_0_q8_k),
    kernel!(TQ2_0, Dot, Portable, Scalar, scalar::tq2_0_q8_k),
    kernel!(F32, FloatTiles, Portable, Dequantized, twins::gemm_f32act_f32),
    kernel!(F16, FloatTiles, Portable, Dequantized, twins::gemm_f32act_f16),
    kernel!(BF16, FloatTiles, Portable, Dequantized, twins::gemm_f32act_bf16),
    kernel!(Q4_0, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q4_0),
    kernel!(Q4_1, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q4_1),
    kernel!(Q5_0, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q5_0),
    kernel!(Q5_1, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q5_1),
    kernel!(Q8_0, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q8_0),
    kernel!(Q2_K, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q2_k),
    kernel!(Q3_K, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q3_k),
    kernel!(Q4_K, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q4_k),
    kernel!(Q5_K, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q5_k),
    kernel!(Q6_K, FloatTiles, Portable, Dequantized, twins::gemm_f32act_q6_k),
    kernel!(IQ4_NL, FloatTiles, Portable, Dequantized, twins::gemm_f32act_iq4_nl),
    kernel!(IQ4_XS, FloatTiles, Portable, Dequantized, twins::gemm_f32act_iq4_xs),
    kernel!(MXFP4, FloatTiles, Portable, Dequantized, twins::gemm_f32act_mxfp4),
    kernel!(IQ2_XXS, FloatTiles, Portable, Dequantized, twins::gemm_f32act_iq2_xxs),
    kernel!(IQ2_XS, FloatTiles, Portable, Dequantized, twins::gemm_f32act_iq2_xs),
    kernel!(IQ2_S, FloatTiles, Portable, Dequantized, twins::gemm_f32act_iq2_s),
    kernel!(IQ3_XXS, FloatTiles, Portable, Dequantized, twins::gemm_f32act_iq3_xxs),
    kernel!(IQ3_S, FloatTiles, Portable, Dequantized, twins::gemm_f32act_iq3_s),
    kernel!(IQ1_S, FloatTiles, Portable, Dequantized, twins::gemm_f32act_iq1_s),
    kernel!(IQ1_M, FloatTiles, Portable, Dequantized, twins::gemm_f32act_iq1_m),
    kernel!(TQ1_0, FloatTiles, Portable, Dequantized, twins::gemm_f32act_tq1_0),
    kernel!(TQ2_0, FloatTiles, Portable, Dequantized, twins::gemm_f32act_tq2_0),
];

#[cfg(not(target_arch = "x86_64"))]
static SIMD: &[Kernel] = &[];

#[cfg(target_arch = "x86_64")]
use super::{
    blocks_float, blocks_grid, blocks_iq4_xs, blocks_k, blocks_q32, float_acts, interleaved_amx,
    interleaved_int16, interleaved_q32, interleaved_super, unpacking_grid,
};

#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
static SIMD: &[Kernel] = &[
    // Pairs: the float types and the AVX2 tiles' single-pair entries.
    kernel!(F32, Dot, Avx2, ScalarRounded, blocks_float::f32_f32),
    kernel!(F16, Dot, Avx2, ScalarRounded, blocks_float::f16_f32),
    kernel!(BF16, Dot, Avx2, ScalarRounded, blocks_float::bf16_f32),
    kernel!(Q4_0, Dot, Avx2, Tiled, blocks_q32::q4_0_q8_0),
    kernel!(Q4_1, Dot, Avx2, Tiled, blocks_q32::q4_1_q8_1),
    kernel!(Q5_0, Dot, Avx2, Tiled, blocks_q32::q5_0_q8_0),
    kernel!(Q5_1, Dot, Avx2, Tiled, blocks_q32::q5_1_q8_1),
    kernel!(Q8_0, Dot, Avx2, Tiled, blocks_q32::q8_0_q8_0),
    kernel!(Q4_K, Dot, Avx2, Tiled, blocks_k::q4_k_q8_k),
    kernel!(Q5_K, Dot, Avx2, ScalarRounded, blocks_float::q5_k_q8_k),
    kernel!(Q6_K, Dot, Avx2, Tiled, blocks_k::q6_k_q8_k),
    kernel!(IQ4_NL, Dot, Avx2, Tiled, blocks_q32::iq4_nl_q8_0),
    kernel!(IQ4_XS, Dot, Avx2, Scalar, blocks_iq4_xs::iq4_xs_q8_k),
    kernel!(MXFP4, Dot, Avx2, Tiled, blocks_q32::mxfp4_q8_0),
    kernel!(IQ2_XXS, Dot, Avx2, Scalar, blocks_grid::iq2_xxs_q8_k),
    kernel!(IQ2_XS, Dot, Avx2, Scalar, blocks_grid::iq2_xs_q8_k),
    kernel!(IQ2_S, Dot, Avx2, Scalar, blocks_grid::iq2_s_q8_k),
    kernel!(IQ3_XXS, Dot, Avx2, Scalar, blocks_grid::iq3_xxs_q8_k),
    kernel!(IQ3_S, Dot, Avx2, Scalar, blocks_grid::iq3_s_q8_k),
    kernel!(IQ1_S, Dot, Avx2, Scalar, blocks_grid::iq1_s_q8_k),
    kernel!(IQ1_M, Dot, Avx2, Scalar, blocks_grid::iq1_m_q8_k),
    kernel!(TQ1_0, Dot, Avx2, Scalar, blocks_grid::tq1_0_q8_k),
    kernel!(TQ2_0, Dot, Avx2, Scalar, blocks_grid::tq2_0_q8_k),
    kernel!(Q4_0, Dot, Avx512Vnni, Tiled, blocks_q32::q4_0_q8_0_vnni),
    kernel!(Q4_1, Dot, Avx512Vnni, Tiled, blocks_q32::q4_1_q8_1_vnni),
    kernel!(Q5_0, Dot, Avx512Vnni, Tiled, blocks_q32::q5_0_q8_0_vnni),
    kernel!(Q5_1, Dot, Avx512Vnni, Tiled, blocks_q32::q5_1_q8_1_vnni),
    kernel!(Q8_0, Dot, Avx512Vnni, Tiled, blocks_q32::q8_0_q8_0_vnni),
    kernel!(IQ4_NL, Dot, Avx512Vnni, Tiled, blocks_q32::iq4_nl_q8_0_vnni),
    kernel!(MXFP4, Dot, Avx512Vnni, Tiled, blocks_q32::mxfp4_q8_0_vnni),
    kernel!(IQ2_XXS, Dot, Avx512Vnni, Scalar, unpacking_grid::iq2_xxs_q8_k_vnni),
    kernel!(IQ2_XS, Dot, Avx512Vnni, Scalar, unpacking_grid::iq2_xs_q8_k_vnni),
    kernel!(IQ2_S, Dot, Avx512Vnni, Scalar, unpacking_grid::iq2_s_q8_k_vnni),
    kernel!(IQ3_XXS, Dot, Avx512Vnni, Scalar, unpacking_grid::iq3_xxs_q8_k_vnni),
    kernel!(IQ3_S, Dot, Avx512Vnni, Scalar, unpacking_grid::iq3_s_q8_k_vnni),
    kernel!(IQ1_S, Dot, Avx512Vnni, Scalar, unpacking_grid::iq1_s_q8_k_vnni),
    kernel!(IQ1_M, Dot, Avx512Vnni, Scalar, unpacking_grid::iq1_m_q8_k_vnni),
    kernel!(TQ1_0, Dot, Avx512Vnni, Scalar, unpacking_grid::tq1_0_q8_k_vnni),
    kernel!(TQ2_0, Dot, Avx512Vnni, Scalar, unpacking_grid::tq2_0_q8_k_vnni),
    kernel!(Q2_K, Dot, Avx512Vnni, Scalar, unpacking_grid::q2_k_q8_k_vnni),
    kernel!(Q3_K, Dot, Avx512Vnni, Scalar, unpacking_grid::q3_k_q8_k_vnni),
    // Tiles over the file's blocks.
    kernel!(Q4_0, Tiles(Blocks), Avx2, Tiled, blocks_q32::gemm_q4_0),
    kernel!(Q4_1, Tiles(Blocks), Avx2, Tiled, blocks_q32::gemm_q4_1),
    kernel!(Q5_0, Tiles(Blocks), Avx2, Tiled, blocks_q32::gemm_q5_0),
    kernel!(Q5_1, Tiles(Blocks), Avx2, Tiled, blocks_q32::gemm_q5_1),
    kernel!(Q8_0, Tiles(Blocks), Avx2, Tiled, blocks_q32::gemm_q8_0),
    kernel!(Q4_K, Tiles(Blocks), Avx2, Tiled, blocks_k::gemm_q4_k),
    kernel!(Q6_K, Tiles(Blocks), Avx2, Tiled, blocks_k::gemm_q6_k),
    kernel!(IQ4_XS, Tiles(Blocks), Avx2, Scalar, blocks_iq4_xs::gemm_iq4_xs),
    kernel!(IQ4_NL, Tiles(Blocks), Avx2, Tiled, blocks_q32::gemm_iq4_nl),
    kernel!(MXFP4, Tiles(Blocks), Avx2, Tiled, blocks_q32::gemm_mxfp4),
    kernel!(IQ2_XXS, Tiles(Blocks), Avx2, Scalar, blocks_grid::gemm_iq2_xxs),
    kernel!(IQ2_XS, Tiles(Blocks), Avx2, Scalar, blocks_grid::gemm_iq2_xs),
    kernel!(IQ2_S, Tiles(Blocks), Avx2, Scalar, blocks_grid::gemm_iq2_s),
    kernel!(IQ3_XXS, Tiles(Blocks), Avx2, Scalar, blocks_grid::gemm_iq3_xxs),
    kernel!(IQ3_S, Tiles(Blocks), Avx2, Scalar, blocks_grid::gemm_iq3_s),
    kernel!(IQ1_S, Tiles(Blocks), Avx2, Scalar, blocks_grid::gemm_iq1_s),
    kernel!(IQ1_M, Tiles(Blocks), Avx2, Scalar, blocks_grid::gemm_iq1_m),
    kernel!(TQ1_0, Tiles(Blocks), Avx2, Scalar, blocks_grid::gemm_tq1_0),
    kernel!(TQ2_0, Tiles(Blocks), Avx2, Scalar, blocks_grid::gemm_tq2_0),
    kernel!(Q4_0, Tiles(Blocks), Avx512Vnni, Tiled, blocks_q32::gemm_q4_0_vnni),
    kernel!(Q4_1, Tiles(Blocks), Avx512Vnni, Tiled, blocks_q32::gemm_q4_1_vnni),
    kernel!(Q5_0, Tiles(Blocks), Avx512Vnni, Tiled, blocks_q32::gemm_q5_0_vnni),
    kernel!(Q5_1, Tiles(Blocks), Avx512Vnni, Tiled, blocks_q32::gemm_q5_1_vnni),
    kernel!(Q8_0, Tiles(Blocks), Avx512Vnni, Tiled, blocks_q32::gemm_q8_0_vnni),
    kernel!(Q4_K, Tiles(Blocks), Avx512Vnni, Tiled, blocks_k::gemm_q4_k_wide),
    kernel!(IQ4_NL, Tiles(Blocks), Avx512Vnni, Tiled, blocks_q32::gemm_iq4_nl_vnni),
    kernel!(MXFP4, Tiles(Blocks), Avx512Vnni, Tiled, blocks_q32::gemm_mxfp4_vnni),
    kernel!(IQ2_XXS, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_iq2_xxs_vnni),
    kernel!(IQ2_XS, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_iq2_xs_vnni),
    kernel!(IQ2_S, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_iq2_s_vnni),
    kernel!(IQ3_XXS, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_iq3_xxs_vnni),
    kernel!(IQ3_S, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_iq3_s_vnni),
    kernel!(IQ1_S, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_iq1_s_vnni),
    kernel!(IQ1_M, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_iq1_m_vnni),
    kernel!(TQ1_0, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_tq1_0_vnni),
    kernel!(TQ2_0, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_tq2_0_vnni),
    kernel!(Q2_K, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_q2_k_vnni),
    kernel!(Q3_K, UnpackingTiles, Avx512Vnni, Scalar, unpacking_grid::gemm_q3_k_vnni),
    // Tiles over scales-first rows.
    kernel!(Q4_0, Tiles(ScalesFirst), Avx2, Tiled, blocks_q32::gemm_q4_0_sf),
    kernel!(Q4_1, Tiles(ScalesFirst), Avx2, Tiled, blocks_q32::gemm_q4_1_sf),
    kernel!(Q5_0, Tiles(ScalesFirst), Avx2, Tiled, blocks_q32::gemm_q5_0_sf),
    kernel!(Q5_1, Tiles(ScalesFirst), Avx2, Tiled, blocks_q32::gemm_q5_1_sf),
    kernel!(Q8_0, Tiles(ScalesFirst), Avx2, Tiled, blocks_q32::gemm_q8_0_sf),
    kernel!(Q4_0, Tiles(ScalesFirst), Avx512Vnni, Tiled, blocks_q32::gemm_q4_0_sf_vnni),
    kernel!(Q4_1, Tiles(ScalesFirst), Avx512Vnni, Tiled, blocks_q32::gemm_q4_1_sf_vnni),
    kernel!(Q5_0, Tiles(ScalesFirst), Avx512Vnni, Tiled, blocks_q32::gemm_q5_0_sf_vnni),
    kernel!(Q5_1, Tiles(ScalesFirst), Avx512Vnni, Tiled, blocks_q32::gemm_q5_1_sf_vnni),
    kernel!(Q8_0, Tiles(ScalesFirst), Avx512Vnni, Tiled, blocks_q32::gemm_q8_0_sf_vnni),
    // Tiles over row-interleaved groups of 16 rows.
    kernel!(Q4_0, Tiles(RowInterleaved), Avx512Vnni, Interleaved, interleaved_q32::gemm_q4_0_rows),
    kernel!(Q4_1, Tiles(RowInterleaved), Avx512Vnni, Interleaved, interleaved_q32::gemm_q4_1_rows),
    kernel!(Q5_0, Tiles(RowInterleaved), Avx512Vnni, Interleaved, interleaved_q32::gemm_q5_0_rows),
    kernel!(Q8_0, Tiles(RowInterleaved), Avx512Vnni, Interleaved, interleaved_q32::gemm_q8_0_rows),
    kernel!(IQ4_NL, Tiles(RowInterleaved), Avx512Vnni, Interleaved, interleaved_q32::gemm_iq4_nl_rows),
    kernel!(MXFP4, Tiles(RowInterleaved), Avx512Vnni, Interleaved, interleaved_q32::gemm_mxfp4_rows),
    kernel!(Q4_K, Tiles(RowInterleaved), Avx512Vnni, Scalar, interleaved_super::gemm_q4_k_rows_i8),
    kernel!(IQ4_XS, Tiles(RowInterleaved), Avx512Vnni, Scalar, interleaved_super::gemm_iq4_xs_rows),
    kernel!(Q5_K, Tiles(RowInterleaved), Avx512Vnni, Scalar, interleaved_super::gemm_q5_k_rows),
    kernel!(Q6_K, Tiles(RowInterleavedNibbles), Avx512Vnni, Scalar, interleaved_super::gemm_q6_k_nibbles),
    kernel!(Q4_K, Tiles(RowInterleaved), Amx, Scalar, interleaved_amx::gemm_q4_k_rows_i8_amx),
    kernel!(IQ4_XS, Tiles(RowInterleaved), Amx, Scalar, interleaved_amx::gemm_iq4_xs_rows_amx),
    kernel!(Q5_K, Tiles(RowInterleaved), Amx, Scalar, interleaved_amx::gemm_q5_k_rows_amx),
    kernel!(Q6_K, Tiles(RowInterleavedNibbles), Amx, Scalar, interleaved_amx::gemm_q6_k_nibbles_amx),
    kernel!(Q4_K, Int16Tiles, Avx512Vnni, Int16, interleaved_int16::gemm_q4_k_rows),
    kernel!(Q6_K, Int16Tiles, Avx512Vnni, Int16, interleaved_int16::gemm_q6_k_rows),
    // Float activations against dequantized weights.
    kernel!(F32, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_f32),
    kernel!(F16, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_f16),
    kernel!(BF16, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_bf16),
    kernel!(Q4_0, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q4_0),
    kernel!(Q4_1, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q4_1),
    kernel!(Q5_0, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q5_0),
    kernel!(Q5_1, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q5_1),
    kernel!(Q8_0, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q8_0),
    kernel!(Q2_K, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q2_k),
    kernel!(Q3_K, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q3_k),
    kernel!(Q4_K, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q4_k),
    kernel!(Q5_K, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q5_k),
    kernel!(Q6_K, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_q6_k),
    kernel!(IQ4_NL, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_iq4_nl),
    kernel!(IQ4_XS, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_iq4_xs),
    kernel!(MXFP4, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_mxfp4),
    kernel!(IQ2_XXS, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_iq2_xxs),
    kernel!(IQ2_XS, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_iq2_xs),
    kernel!(IQ2_S, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_iq2_s),
    kernel!(IQ3_XXS, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_iq3_xxs),
    kernel!(IQ3_S, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_iq3_s),
    kernel!(IQ1_S, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_iq1_s),
    kernel!(IQ1_M, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_iq1_m),
    kernel!(TQ1_0, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_tq1_0),
    kernel!(TQ2_0, FloatTiles, Avx2, Dequantized, float_acts::gemm_f32act_tq2_0),
    kernel!(F32, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_f32_wide),
    kernel!(F16, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_f16_wide),
    kernel!(BF16, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_bf16_wide),
    kernel!(Q4_0, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q4_0_wide),
    kernel!(Q4_1, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q4_1_wide),
    kernel!(Q5_0, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q5_0_wide),
    kernel!(Q5_1, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q5_1_wide),
    kernel!(Q8_0, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q8_0_wide),
    kernel!(Q2_K, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q2_k_wide),
    kernel!(Q3_K, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q3_k_wide),
    kernel!(Q4_K, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q4_k_wide),
    kernel!(Q5_K, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q5_k_wide),
    kernel!(Q6_K, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_q6_k_wide),
    kernel!(IQ4_NL, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_iq4_nl_wide),
    kernel!(IQ4_XS, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_iq4_xs_wide),
    kernel!(MXFP4, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_mxfp4_wide),
    kernel!(IQ2_XXS, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_iq2_xxs_wide),
    kernel!(IQ2_XS, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_iq2_xs_wide),
    kernel!(IQ2_S, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_iq2_s_wide),
    kernel!(IQ3_XXS, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_iq3_xxs_wide),
    kernel!(IQ3_S, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_iq3_s_wide),
    kernel!(IQ1_S, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_iq1_s_wide),
    kernel!(IQ1_M, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_iq1_m_wide),
    kernel!(TQ1_0, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_tq1_0_wide),
    kernel!(TQ2_0, FloatTiles, Avx512Vnni, Dequantized, float_acts::gemm_f32act_tq2_0_wide),
];
