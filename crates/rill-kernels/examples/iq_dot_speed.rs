//! Rough per-byte speed of the table-indexed dot products (4-bit, grid i-quants, ternary) (SIMD and scalar twin) against
//! Q4_0's, on one thread: `cargo run --release -p rill-kernels --example iq_dot_speed`.

use rill_kernels::{quantize_row, vec_dot, vec_dot_scalar, QuantType};
use std::time::Instant;

fn main() {
    let n = 4096;
    let reps = 20_000;
    // Q4_0 and Q4_K for scale, then the i-quants and ternary types (`ALL` from IQ4_NL on).
    let types = [QuantType::Q4_0, QuantType::Q4_K].into_iter().chain(
        QuantType::ALL
            .into_iter()
            .skip_while(|&t| t != QuantType::IQ4_NL),
    );
    for ty in types {
        let bytes = ty.row_bytes(n).unwrap();
        let mut w: Vec<u8> = (0..bytes).map(|i| (i * 131 % 251) as u8).collect();
        for b in w.chunks_exact_mut(ty.block_bytes()) {
            if ty == QuantType::MXFP4 {
                b[0] = 120;
            } else {
                b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
            }
        }
        let act = ty.vec_dot_type().unwrap();
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let mut a = vec![0u8; act.row_bytes(n).unwrap()];
        quantize_row(act, &x, &mut a).unwrap();
        for (name, f) in [
            ("simd", vec_dot as fn(QuantType, &[u8], &[u8], usize) -> _),
            ("scalar", vec_dot_scalar),
        ] {
            let t = Instant::now();
            let mut s = 0.0;
            for _ in 0..reps {
                s += f(ty, &w, &a, n).unwrap();
            }
            let secs = t.elapsed().as_secs_f64();
            println!(
                "{ty:>6} {name:>6}: {:6.2} GB/s of weights ({s:.1})",
                (bytes * reps) as f64 / secs / 1e9
            );
        }
    }
}
