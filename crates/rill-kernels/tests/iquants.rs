//! The i-quants (IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M), the
//! ternary types (TQ1_0, TQ2_0) and MXFP4 (dequantized against gguf-py in
//! `reference_dequant.rs`): their
//! integer dot products against 8-bit activations equal the dot product of the dequantized
//! weights with the dequantized activations (the integer sums are exact, so only the final
//! scaling rounds), and every matmul path (8-bit and float activations, 1-3 threads) agrees with
//! the exact one within the activations' quantization.

use rill_kernels::{
    dequantize_row, matmul_exact, matmul_quant_with, quantize_row, vec_dot, Activations, Matrix,
    QuantType, ThreadPool,
};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random blocks of `ty` with sane scales: f16 `d` in ±[0.001, 0.05] (IQ4_*), E8M0 exponents
/// 2^-8..2^-4 (MXFP4).
fn random_row(ty: QuantType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = ty.block_bytes();
    let mut row: Vec<u8> = (0..ty.row_bytes(n).unwrap())
        .map(|_| rng.next() as u8)
        .collect();
    for block in row.chunks_exact_mut(bb) {
        let d = half::f16::from_f32((0.001 + 0.049 * rng.f32().abs()) * rng.f32().signum());
        let d = d.to_bits();
        match ty {
            QuantType::MXFP4 => block[0] = 120 + (rng.next() % 5) as u8,
            QuantType::IQ1_M => {
                for k in 0..4 {
                    let nib = ((d >> (4 * k)) & 0xF) as u8;
                    block[49 + 2 * k] = (block[49 + 2 * k] & 0x0F) | (nib << 4);
                }
            }
            QuantType::TQ1_0 => block[52..54].copy_from_slice(&d.to_le_bytes()),
            QuantType::TQ2_0 => block[64..66].copy_from_slice(&d.to_le_bytes()),
            _ => block[..2].copy_from_slice(&d.to_le_bytes()),
        }
    }
    row
}

fn dequant(ty: QuantType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

/// The i-quants and ternary types: `QuantType::ALL` from IQ4_NL on.
fn types() -> impl Iterator<Item = QuantType> {
    QuantType::ALL
        .into_iter()
        .skip_while(|&t| t != QuantType::IQ4_NL)
}

#[test]
fn integer_dots_equal_the_dequantized_dot() {
    let mut rng = Rng(0x05ee_d1a4);
    for ty in types() {
        let n = 512;
        let act_ty = ty.vec_dot_type().unwrap();
        for _ in 0..20 {
            let w = random_row(ty, n, &mut rng);
            let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
            let mut a = vec![0u8; act_ty.row_bytes(n).unwrap()];
            quantize_row(act_ty, &x, &mut a).unwrap();
            let (wd, ad) = (dequant(ty, &w, n), dequant(act_ty, &a, n));
            let truth: f64 = wd
                .iter()
                .zip(&ad)
                .map(|(p, q)| f64::from(*p) * f64::from(*q))
                .sum();
            let scale: f64 = wd
                .iter()
                .zip(&ad)
                .map(|(p, q)| f64::from((p * q).abs()))
                .sum();
            let got = f64::from(vec_dot(ty, &w, &a, n).unwrap());
            assert!(
                (got - truth).abs() <= 1e-5 * scale + 1e-30,
                "{ty}: {got} vs {truth}"
            );
        }
    }
}

#[test]
fn every_matmul_path_agrees_with_the_exact_product() {
    let mut rng = Rng(0xABCDEF);
    let (rows, cols, tokens) = (24, 512, 9);
    for ty in types() {
        let w: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(ty, cols, &mut rng))
            .collect();
        let x: Vec<f32> = (0..cols * tokens).map(|_| rng.f32()).collect();
        let pool = ThreadPool::new(2);
        let mut exact = vec![0.0; rows * tokens];
        matmul_exact(
            Matrix::new(ty, &w, rows, cols),
            &x,
            tokens,
            &mut exact,
            &pool,
        )
        .unwrap();
        // Σ |w x| per output, the scale of its rounding.
        let wd = dequant(ty, &w, rows * cols);
        let magnitude: Vec<f32> = (0..tokens)
            .flat_map(|t| {
                let (wd, x) = (&wd, &x);
                (0..rows).map(move |r| {
                    (0..cols)
                        .map(|c| (wd[r * cols + c] * x[t * cols + c]).abs())
                        .sum()
                })
            })
            .collect();
        for threads in [1, 2, 3] {
            let pool = ThreadPool::new(threads);
            for activations in [Activations::Int8, Activations::Float] {
                let mut out = vec![0.0; rows * tokens];
                let mut scratch = Vec::new();
                matmul_quant_with(
                    Matrix::new(ty, &w, rows, cols),
                    &x,
                    tokens,
                    &mut out,
                    &mut scratch,
                    &pool,
                    activations,
                )
                .unwrap();
                for (i, (a, b)) in out.iter().zip(&exact).enumerate() {
                    // 8-bit activations move each term by at most half a step (1/254 of its
                    // block's largest activation, below 1/127 of the term's own scale here).
                    let rel = match activations {
                        Activations::Float => 1e-5,
                        _ => 1.0 / 127.0,
                    };
                    let tol = rel * magnitude[i];
                    assert!(
                        (a - b).abs() <= tol,
                        "{ty} {activations:?} {threads}t [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }
}
