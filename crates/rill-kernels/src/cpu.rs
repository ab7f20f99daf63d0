//! Run-time CPU feature detection.
//!
//! The binary is built for baseline x86-64 (or aarch64), so SIMD paths are compiled with
//! `#[target_feature]` and selected here once, at first use, from what the running CPU reports.

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

/// True when the AVX2 path is in use and the CPU also has AVX512-VNNI on 256-bit registers
/// (`avx512vnni` + `avx512vl`): the 32-element block kernels then use `vpdpbusd`, with
/// bit-identical results. `RILL_NO_VNNI` (set before the first call) turns it off.
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
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}
