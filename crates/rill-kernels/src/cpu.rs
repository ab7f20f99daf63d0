//! Run-time CPU feature detection.
//!
//! The binary is built for baseline x86-64 (or aarch64), so SIMD paths are compiled with
//! `#[target_feature]` and selected here once, at first use, from what the running CPU reports.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Which implementation family the dispatching functions use on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuPath {
    /// Portable scalar code.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
}

static PATH: OnceLock<CpuPath> = OnceLock::new();

fn detect() -> CpuPath {
    if std::env::var_os("RILL_FORCE_SCALAR").is_some() {
        return CpuPath::Scalar;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return CpuPath::Avx2;
        }
    }
    CpuPath::Scalar
}

/// The path chosen for this process (cached after the first call). Setting the environment
/// variable `RILL_FORCE_SCALAR` before the first call forces the scalar path, which is useful for
/// debugging and for comparing numerics.
#[inline]
pub fn cpu_path() -> CpuPath {
    *PATH.get_or_init(detect)
}

/// True when the AVX2+FMA+F16C kernels are in use.
#[inline]
pub fn has_avx2_fma_f16c() -> bool {
    cpu_path() == CpuPath::Avx2
}

static VNNI: OnceLock<bool> = OnceLock::new();

/// Whether the 512-bit kernels may run (see [`set_wide_tiles`]); `RILL_NO_WIDE` (set before
/// the first use) starts it off.
static WIDE_TILES: AtomicBool = AtomicBool::new(true);
static WIDE_FROM_ENV: OnceLock<()> = OnceLock::new();

/// Turns the 512-bit kernels on or off (on by default where [`has_vnni`]): the 32-element block
/// types' token tiles and paired decode, the Q4_K and float-activation tiles, attention over long
/// heads. Both widths give the same bits; this lets a benchmark time one against the other in
/// one process (`prefill_bench` with `RILL_BENCH_WIDE=ab`). It also decides, when a model loads,
/// whether its matrices are repacked row-interleaved
/// ([`WeightLayout::fastest_for_product`](crate::WeightLayout::fastest_for_product)), a layout
/// with its own bits whose kernels run whatever this is set to later.
pub fn set_wide_tiles(on: bool) {
    wide_from_env();
    WIDE_TILES.store(on, Ordering::Relaxed);
}

/// True when the 512-bit kernels run: [`has_vnni`] (which implies AVX512-F/BW here) and not
/// turned off by [`set_wide_tiles`] or `RILL_NO_WIDE`.
#[inline]
pub fn wide_tiles() -> bool {
    wide_from_env();
    has_vnni() && WIDE_TILES.load(Ordering::Relaxed)
}

fn wide_from_env() {
    WIDE_FROM_ENV.get_or_init(|| {
        if std::env::var_os("RILL_NO_WIDE").is_some() {
            WIDE_TILES.store(false, Ordering::Relaxed);
        }
    });
}

/// True when the AVX2 path is in use and the CPU also has AVX512-VNNI (with AVX512-F, BW and
/// VL): the 32-element block kernels then use `vpdpbusd`, and 512-bit registers for whole token
/// tiles, with bit-identical results. `RILL_NO_VNNI` (set before the first call) turns it off.
#[inline]
pub fn has_vnni() -> bool {
    *VNNI.get_or_init(|| {
        if cpu_path() != CpuPath::Avx2 || std::env::var_os("RILL_NO_VNNI").is_some() {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}
