//! Tells the tests whether the CPU building them has AMX (`cfg(rill_amx_host)`) and AVX512-VNNI
//! (`cfg(rill_vnni_host)`): a test of those kernels alone is ignored, with its reason, where it
//! cannot run, instead of passing without running. The kernels themselves choose at run time
//! (`cpu.rs`).

fn main() {
    println!("cargo:rustc-check-cfg=cfg(rill_amx_host)");
    println!("cargo:rustc-check-cfg=cfg(rill_vnni_host)");
    println!("cargo:rerun-if-changed=build.rs");
    if amx_host() {
        println!("cargo:rustc-cfg=rill_amx_host");
    }
    if vnni_host() {
        println!("cargo:rustc-cfg=rill_vnni_host");
    }
}

/// AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), when building for this machine.
fn amx_host() -> bool {
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target != host {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        leaf7.edx & (3 << 24) == 3 << 24
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AVX512-VNNI with F, BW and VL, when building for this machine.
fn vnni_host() -> bool {
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    if target != host {
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
}
