//! Every SIMD kernel against its scalar twin, and the scalar dot products against the exact
//! dequantizers, on random inputs of awkward sizes.

mod common;

use common::*;
use proptest::prelude::*;
use rill_kernels::*;

/// Element counts: several blocks, not powers of two.
fn n_for(ty: QuantType, blocks: usize, extra: usize) -> usize {
    match ty.block_size() {
        1 => blocks * 32 + extra, // float types: ragged tails too
        bs => blocks * bs,
    }
}

fn check_dot(ty: QuantType, seed: u64, blocks: usize, extra: usize, exp: i32) {
    let mut rng = Rng(seed);
    let n = n_for(ty, blocks, extra);
    let w = random_weights(ty, n, &mut rng, exp);
    let x = random_acts(n, &mut rng);
    let (a, adeq) = quantize_acts(ty, &x);
    let mag = magnitude_weights(ty, &w);
    let bound: f64 = mag
        .iter()
        .zip(&adeq)
        .map(|(m, a)| (*m as f64) * (a.abs() as f64))
        .sum();

    let fast = vec_dot(ty, &w, &a, n).unwrap();
    let slow = vec_dot_scalar(ty, &w, &a, n).unwrap();
    let tol = 1e-5 * bound + 1e-30;
    assert!(
        ((fast - slow) as f64).abs() <= tol,
        "{ty}: simd {fast} vs scalar {slow} (n={n}, bound {bound})"
    );

    // Scalar kernel vs exact f64 dot of the dequantized rows. Q8_1 stores the block sum as f16,
    // which perturbs the min term by up to 2^-11 relative.
    let mut wd = vec![0f32; n];
    dequantize_row(ty, &w, &mut wd).unwrap();
    let exact: f64 = wd
        .iter()
        .zip(&adeq)
        .map(|(w, a)| *w as f64 * *a as f64)
        .sum();
    let rel = if ty.vec_dot_type() == Some(QuantType::Q8_1) {
        1e-3
    } else {
        1e-5
    };
    assert!(
        (slow as f64 - exact).abs() <= rel * bound + 1e-30,
        "{ty}: scalar {slow} vs dequantized {exact} (n={n}, bound {bound})"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn vec_dot_simd_matches_scalar(seed in any::<u64>(), blocks in 1usize..10, extra in 0usize..32, exp in -10i32..6) {
        for ty in weight_types() {
            check_dot(ty, seed, blocks, extra, exp);
        }
    }

    #[test]
    fn quantizers_simd_match_scalar_bitwise(seed in any::<u64>(), blocks in 1usize..5, exp in -150i32..20) {
        let mut rng = Rng(seed);
        let n = blocks * 256;
        let x: Vec<f32> = random_acts(n, &mut rng).iter().map(|v| v * 2f32.powi(exp)).collect();
        for ty in [QuantType::Q8_0, QuantType::Q8_1, QuantType::Q8_K] {
            let len = ty.row_bytes(n).unwrap();
            let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
            match ty {
                QuantType::Q8_0 => { quantize_row_q8_0(&x, &mut a).unwrap(); quantize_row_q8_0_scalar(&x, &mut b).unwrap(); }
                QuantType::Q8_1 => { quantize_row_q8_1(&x, &mut a).unwrap(); quantize_row_q8_1_scalar(&x, &mut b).unwrap(); }
                _ => { quantize_row_q8_k(&x, &mut a).unwrap(); quantize_row_q8_k_scalar(&x, &mut b).unwrap(); }
            }
            prop_assert_eq!(&a, &b, "{} differs", ty);
            if !(-6..8).contains(&exp) {
                continue; // scales outside f16's comfortable range: only the bitwise check
            }
            // Quantization error is at most half a step per element.
            let mut d = vec![0f32; n];
            dequantize_row(ty, &a, &mut d).unwrap();
            for blk in 0..n / ty.block_size() {
                let r = blk * ty.block_size()..(blk + 1) * ty.block_size();
                let amax = x[r.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
                for i in r {
                    prop_assert!((d[i] - x[i]).abs() <= amax / 127.0 * 0.5 * 1.01 + amax * 1e-3);
                }
            }
        }
    }

    #[test]
    fn i16_quantizer_simd_matches_scalar_bitwise(seed in any::<u64>(), blocks in 1usize..5, exp in -160i32..30, case in 0usize..5) {
        let mut rng = Rng(seed);
        let n = blocks * 256;
        // Scales down to subnormal ones (whose reciprocal overflows) and zero.
        let mut x: Vec<f32> = random_acts(n, &mut rng).iter().map(|v| v * 2f32.powi(exp)).collect();
        match case {
            // A non-finite value in each block, at a different place each time.
            1 => {
                let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
                for blk in 0..blocks {
                    x[blk * 256 + (blk * 37 + exp.unsigned_abs() as usize) % 256] = special[blk % 3];
                }
            }
            // A zero block.
            2 => x[..256].iter_mut().for_each(|v| *v = 0.0),
            // Exact halves of the step (the maximum 2047 makes the scale 1).
            3 => {
                for (i, v) in x.iter_mut().enumerate() {
                    *v = (i % 256) as f32 * 0.5 - 64.0;
                }
                x[255] = 2047.0;
            }
            // Signed zeros beside tiny values.
            4 => x.iter_mut().step_by(3).for_each(|v| *v = -0.0),
            _ => {}
        }
        let len = i16_row_bytes(n).unwrap();
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        quantize_row_i16(&x, &mut a).unwrap();
        quantize_row_i16_scalar(&x, &mut b).unwrap();
        prop_assert_eq!(a, b);
    }

    #[test]
    fn dot_f32_simd_matches_scalar(seed in any::<u64>(), n in 0usize..300) {
        let mut rng = Rng(seed);
        let a = random_acts(n, &mut rng);
        let b = random_acts(n, &mut rng);
        let bound: f64 = a.iter().zip(&b).map(|(x, y)| (x * y).abs() as f64).sum();
        let fast = dot_f32(&a, &b);
        let slow = dot_f32_scalar(&a, &b);
        prop_assert!(((fast - slow) as f64).abs() <= 1e-5 * bound + 1e-30, "{} vs {}", fast, slow);
    }
}

#[test]
fn quantizer_rounding_matches_ggml_reference() {
    // amax = 127 makes the scale exactly 1, so x * id hits exact halves.
    let mut x = vec![0f32; 256];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 3.5;
    x[4] = 0.5;
    x[5] = -0.49999997;
    let mut q = vec![0u8; 34];
    quantize_row_q8_0(&x[..32], &mut q).unwrap();
    // roundf: half away from zero.
    assert_eq!(&q[2..8], &[127u8, 3, (-3i8) as u8, 4, 1, 0]);
    // Q8_K uses -127/max and round-half-to-even; max = -127 makes iscale exactly 1.
    let mut y: Vec<f32> = x.iter().map(|v| -v).collect();
    y[0] = -127.0;
    let mut k = vec![0u8; 292];
    quantize_row_q8_k(&y, &mut k).unwrap();
    // iscale = 1: q = nearest_int(y): -2.5 -> -2, 2.5 -> 2, -3.5 -> -4, -0.5 -> 0.
    assert_eq!(
        &k[4..10],
        &[(-127i8) as u8, (-2i8) as u8, 2, (-4i8) as u8, 0, 0]
    );
    assert_eq!(f32::from_le_bytes([k[0], k[1], k[2], k[3]]), 1.0);
    let mut s = vec![0u8; 292];
    quantize_row_q8_k_scalar(&y, &mut s).unwrap();
    assert_eq!(k, s);
}

#[test]
fn vec_dot_rejects_bad_lengths() {
    let w = vec![0u8; 20 * 2];
    let a = vec![0u8; 36 * 2];
    assert!(vec_dot(QuantType::Q4_1, &w, &a, 64).is_ok());
    assert!(vec_dot(QuantType::Q4_1, &w, &a, 32).is_err());
    assert!(vec_dot(QuantType::Q4_1, &w[..39], &a, 64).is_err());
    assert!(vec_dot(QuantType::Q4_1, &w, &a[..70], 64).is_err());
    assert!(vec_dot(QuantType::Q8_K, &w, &a, 64).is_err());
    assert!(vec_dot(QuantType::Q4_K, &[0u8; 144], &[0u8; 292], 255).is_err());
}

/// The path follows what the CPU reports and the switches the environment sets: AVX2 wherever
/// AVX2, FMA and F16C are (unless `RILL_FORCE_SCALAR`), each wider path only on top of the one
/// below it and never against its switch.
#[test]
fn the_cpu_path_follows_the_cpu_and_its_switches() {
    let set = |v: &str| std::env::var_os(v).is_some();
    #[cfg(target_arch = "x86_64")]
    let avx2 = std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c");
    #[cfg(not(target_arch = "x86_64"))]
    let avx2 = false;
    let want = if avx2 && !set("RILL_FORCE_SCALAR") {
        CpuPath::Avx2
    } else {
        CpuPath::Scalar
    };
    assert_eq!(cpu_path(), want);
    assert!(!has_vnni() || (cpu_path() == CpuPath::Avx2 && !set("RILL_NO_VNNI")));
    assert!(!wide_tiles() || (has_vnni() && !set("RILL_NO_WIDE")));
    assert!(!has_amx() || (has_vnni() && !set("RILL_NO_AMX")));
    eprintln!(
        "kernel path: {:?}, VNNI {}, 512-bit tiles {}, AMX {}",
        cpu_path(),
        has_vnni(),
        wide_tiles(),
        has_amx()
    );
}

/// The table-indexed types' (IQ4_XS, the grid i-quants and the ternary types; IQ4_NL and MXFP4
/// are tiled types, held to their bit-exact twin in `tiled.rs`) SIMD dot
/// products sum each block in integers and scale and accumulate in their scalar twin's order:
/// the same bits.
#[test]
fn table_indexed_dots_equal_their_twin_bit_for_bit() {
    use QuantType::*;
    for ty in [
        IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0,
    ] {
        for seed in 0..50u64 {
            let mut rng = Rng(seed * 7919 + ty.ggml_id() as u64);
            let n = ty.block_size() * (1 + (seed as usize % 9));
            let w = random_weights(ty, n, &mut rng, -4 + (seed % 5) as i32);
            let x = random_acts(n, &mut rng);
            let (a, _) = quantize_acts(ty, &x);
            let fast = vec_dot(ty, &w, &a, n).unwrap();
            let twin = vec_dot_scalar(ty, &w, &a, n).unwrap();
            assert_eq!(
                fast.to_bits(),
                twin.to_bits(),
                "{ty} n={n}: {fast} vs {twin}"
            );
            // Every SIMD path of this CPU (IQ4_XS: AVX2 and AVX512-VNNI).
            for k in runnable_dot_kernels(ty) {
                let v = k.dot(&w, &a, n).unwrap();
                assert_eq!(
                    v.to_bits(),
                    twin.to_bits(),
                    "{ty} {} n={n}: {v} vs {twin}",
                    k.name
                );
            }
        }
    }
}

/// The two-pass head's upper bounds on this CPU's path (AVX-512, AVX2 or scalar, per CI leg)
/// against the scalar twin, bit for bit, over ragged row counts (a partial last group) and a
/// whole-part split as the model makes it over its pool.
#[test]
fn head_upper_bounds_equal_their_twin_bit_for_bit() {
    use rill_kernels::ops::{head_upper_bounds, head_upper_bounds_scalar, HeadBounds, BOUND_GROUP};
    let mut rng = Rng(41);
    for (rows, blocks) in [(1usize, 1usize), (16, 20), (37, 18), (1000, 24), (4099, 2)] {
        let groups = rows.div_ceil(BOUND_GROUP);
        let estimate: Vec<f32> = (0..rows).map(|_| rng.f() * 30.0).collect();
        let codes = rng.bytes(groups * blocks * BOUND_GROUP);
        let unit: Vec<f32> = (0..rows).map(|_| rng.f().abs() * 0.01).collect();
        let norm: Vec<f32> = (0..rows).map(|_| rng.f().abs() * 2.0).collect();
        let block_norms: Vec<f32> = (0..blocks).map(|_| rng.f().abs() * 50.0).collect();
        let b = HeadBounds {
            estimate: &estimate,
            codes: &codes,
            unit: &unit,
            norm: &norm,
            block_norms: &block_norms,
            per_norm: 1.7,
        };
        let (mut fast, mut slow) = (vec![0f32; rows], vec![0f32; rows]);
        head_upper_bounds(&b, &mut fast).unwrap();
        head_upper_bounds_scalar(&b, &mut slow).unwrap();
        for r in 0..rows {
            assert_eq!(
                fast[r].to_bits(),
                slow[r].to_bits(),
                "{rows}x{blocks} row {r}"
            );
            // Each bound covers its row's worst case: estimate plus every code at its block.
            assert!(slow[r] >= estimate[r]);
        }
        assert!(head_upper_bounds(&b, &mut fast[..rows - 1]).is_err());
    }
}
