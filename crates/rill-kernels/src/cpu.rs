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

/// Whether this CPU can run the AVX2 kernels (AVX2, FMA and F16C), whatever the switches say.
pub(crate) fn avx2_in_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether this CPU can run the AVX512-VNNI kernels, whatever the switches say: what their own
/// tests need to call them directly (on every CI leg, `RILL_NO_VNNI` included).
pub(crate) fn vnni_in_hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2_in_hardware()
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

static AMX: OnceLock<bool> = OnceLock::new();

/// True when [`has_vnni`] and the CPU has AMX-TILE and AMX-INT8 and the kernel granted this
/// process the tile data (Linux asks a program to request it, `arch_prctl(ARCH_REQ_XCOMP_PERM)`;
/// the request is made here, once): the super-block types' row-interleaved prompt tiles then
/// use the tile multiply (`dot/interleaved_amx.rs`), with bit-identical results. `RILL_NO_AMX` (set before
/// the first call) turns it off.
#[inline]
pub fn has_amx() -> bool {
    *AMX.get_or_init(|| {
        has_vnni() && std::env::var_os("RILL_NO_AMX").is_none() && amx_in_hardware()
    })
}

static AMX_HARDWARE: OnceLock<bool> = OnceLock::new();

/// Whether this CPU can run the AMX kernels (AMX-TILE, AMX-INT8 and AVX512-VNNI with F, BW and
/// VL) and Linux granted this process the tile data, whatever the switches say: what the AMX
/// kernels' own tests need to call them directly.
pub(crate) fn amx_in_hardware() -> bool {
    *AMX_HARDWARE.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
            let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
            leaf7.edx & (3 << 24) == 3 << 24
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && request_tile_data()
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// Asks Linux for this process's permission to use the AMX tile data (XFEATURE 18), and
/// checks that it was granted.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_GET_XCOMP_PERM: i64 = 0x1022;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let syscall = |code: i64, arg: i64| -> i64 {
        let ret: i64;
        // SAFETY: arch_prctl with these codes reads its integer argument or writes one u64
        // through the pointer given, which outlives the call.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") code,
                in("rsi") arg,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack)
            );
        }
        ret
    };
    if syscall(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0 {
        return false;
    }
    let mut granted = 0u64;
    syscall(ARCH_GET_XCOMP_PERM, &mut granted as *mut u64 as i64) == 0
        && granted & (1 << XFEATURE_XTILEDATA) != 0
}
