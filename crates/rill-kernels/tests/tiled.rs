//! The tiled AVX2 kernels (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, IQ4_NL, MXFP4) against their bit-exact
//! scalar twins, on random inputs with awkward block counts (partial groups of 8 blocks included).

mod common;

use common::*;
use proptest::prelude::*;
use rill_kernels::dot::vec_dot_scalar_bitexact;
use rill_kernels::*;

const TILED: [QuantType; 9] = [
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
    QuantType::Q4_K,
    QuantType::Q6_K,
    QuantType::IQ4_NL,
    QuantType::MXFP4,
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, .. ProptestConfig::default() })]

    #[test]
    fn tiled_simd_matches_bitexact_scalar(seed in any::<u64>(), blocks in 1usize..40, exp in -10i32..6) {
        for ty in TILED {
            let mut rng = Rng(seed);
            // 1..40 blocks of 32, or 1..6 super-blocks of 256.
            let n = if ty.block_size() == 32 { blocks * 32 } else { (1 + blocks % 6) * 256 };
            let w = random_weights(ty, n, &mut rng, exp);
            let x = random_acts(n, &mut rng);
            let (a, _) = quantize_acts(ty, &x);
            let exact = vec_dot_scalar_bitexact(ty, &w, &a, n).unwrap();
            let reference = vec_dot_scalar(ty, &w, &a, n).unwrap();
            let mag: f32 = magnitude_weights(ty, &w).iter().zip(&x).map(|(m, v)| m * v.abs()).sum();
            // The bit-exact twin is a valid dot product: close to the plain scalar reference.
            prop_assert!((exact - reference).abs() <= 1e-3 * mag + 1e-30, "{}: {} vs {}", ty, exact, reference);
            if cpu_path() == CpuPath::Avx2 {
                let simd = vec_dot(ty, &w, &a, n).unwrap();
                prop_assert_eq!(simd.to_bits(), exact.to_bits(), "{}: simd {} vs scalar {} (n={})", ty, simd, exact, n);
                // Every tiled path of this CPU (AVX2, AVX512-VNNI), not only the one picked.
                for k in runnable_dot_kernels(ty).into_iter().filter(|k| k.twin == dot::registry::Twin::Tiled) {
                    let v = k.dot(&w, &a, n).unwrap();
                    prop_assert_eq!(v.to_bits(), exact.to_bits(), "{} {}: {} vs scalar {} (n={})", ty, k.name, v, exact, n);
                }
            }
        }
    }
}

#[test]
fn bitexact_scalar_rejects_untiled_types() {
    let w = vec![0u8; 210];
    let a = vec![0u8; 292];
    assert!(vec_dot_scalar_bitexact(QuantType::Q5_K, &w[..176], &a, 256).is_err());
    assert!(vec_dot_scalar_bitexact(QuantType::Q4_K, &w[..144], &a, 256).is_ok());
    assert!(vec_dot_scalar_bitexact(QuantType::Q6_K, &w, &a, 256).is_ok());
    assert!(vec_dot_scalar_bitexact(QuantType::Q6_K, &w, &a[..291], 256).is_err());
    assert!(vec_dot_scalar_bitexact(QuantType::Q4_1, &w[..20], &a[..36], 32).is_ok());
    assert!(vec_dot_scalar_bitexact(QuantType::Q4_1, &w[..19], &a[..36], 32).is_err());
}
