//! Shared helpers for the integration tests (included with `mod common;`).
#![allow(dead_code)]

use rill_kernels::{dequantize_row, quantize_row, QuantType};

/// splitmix64: deterministic random numbers from a proptest-chosen seed.
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}

/// Offsets of the f16 scale fields of one block: (scale fields, min fields).
fn scale_fields(ty: QuantType) -> (&'static [usize], &'static [usize]) {
    use QuantType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 => (&[0], &[]),
        Q4_1 | Q5_1 => (&[0], &[2]),
        Q2_K => (&[80], &[82]),
        Q3_K => (&[108], &[]),
        Q4_K | Q5_K => (&[0], &[2]),
        Q6_K => (&[208], &[]),
        IQ4_NL | IQ4_XS => (&[0], &[]),
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S => (&[0], &[]),
        TQ1_0 => (&[52], &[]),
        TQ2_0 => (&[64], &[]),
        _ => (&[], &[]),
    }
}

/// IQ1_M's f16 scale, spread over the high nibbles of its four sub-scale words.
pub fn put_iq1_m_scale(blk: &mut [u8], v: f32) {
    let bits = half::f16::from_f32(v).to_bits();
    for k in 0..4 {
        let nib = ((bits >> (4 * k)) & 0xF) as u8;
        blk[49 + 2 * k] = (blk[49 + 2 * k] & 0x0F) | (nib << 4);
    }
}

/// A random weight row of `n` elements: random quant bytes, random signed finite scales of
/// magnitude around 2^`exp`.
/// `rows` rows of [`random_weights`], one after another.
pub fn random_matrix(ty: QuantType, rows: usize, n: usize, rng: &mut Rng, exp: i32) -> Vec<u8> {
    (0..rows)
        .flat_map(|_| random_weights(ty, n, rng, exp))
        .collect()
}

pub fn random_weights(ty: QuantType, n: usize, rng: &mut Rng, exp: i32) -> Vec<u8> {
    let bytes = ty.row_bytes(n).unwrap();
    let mag = 2f32.powi(exp);
    match ty {
        QuantType::F32 => (0..n).flat_map(|_| (rng.f() * mag).to_le_bytes()).collect(),
        QuantType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32(rng.f() * mag).to_bits().to_le_bytes())
            .collect(),
        QuantType::BF16 => (0..n)
            .flat_map(|_| (((rng.f() * mag).to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let mut w = rng.bytes(bytes);
            let (sc, mn) = scale_fields(ty);
            for blk in w.chunks_exact_mut(ty.block_bytes()) {
                for &o in sc.iter().chain(mn) {
                    put_f16(blk, o, rng.f() * mag);
                }
                if ty == QuantType::MXFP4 {
                    // The E8M0 exponent: 2^(exp ± 3), the levels are up to 6 (doubled: 12).
                    blk[0] = (128 + exp - 3 + (rng.bytes(1)[0] % 7) as i32) as u8;
                }
                if ty == QuantType::IQ1_M {
                    put_iq1_m_scale(blk, rng.f() * mag);
                }
            }
            w
        }
    }
}

/// The same row with scale signs arranged so every dequantized element is the sum of the
/// magnitudes of its terms: used to bound the f32 rounding error of a dot product.
pub fn magnitude_weights(ty: QuantType, w: &[u8]) -> Vec<f32> {
    let n = w.len() / ty.block_bytes() * ty.block_size();
    let mut w = w.to_vec();
    let (sc, mn) = scale_fields(ty);
    let k_quant = matches!(ty, QuantType::Q2_K | QuantType::Q4_K | QuantType::Q5_K);
    for blk in w.chunks_exact_mut(ty.block_bytes().max(1)) {
        for &o in sc {
            blk[o + 1] &= 0x7F;
        }
        for &o in mn {
            if k_quant {
                blk[o + 1] |= 0x80; // y = d*q - dmin*m: negative dmin adds |dmin|*m
            } else {
                blk[o + 1] &= 0x7F; // y = d*q + m
            }
        }
    }
    let mut out = vec![0f32; n];
    dequantize_row(ty, &w, &mut out).unwrap();
    out.iter().map(|v| v.abs()).collect()
}

/// Random activations with a spread of magnitudes and signs.
pub fn random_acts(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let e = (rng.next_u64() % 12) as i32 - 6;
            let v = rng.f() * 2f32.powi(e);
            if i % 97 == 5 {
                0.0
            } else {
                v
            }
        })
        .collect()
}

/// Quantizes activations into the type `weight_ty` pairs with; returns bytes and their
/// dequantized values (f32 activations pass through as LE bytes).
pub fn quantize_acts(weight_ty: QuantType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let act = weight_ty.vec_dot_type().unwrap();
    if act == QuantType::F32 {
        return (x.iter().flat_map(|v| v.to_le_bytes()).collect(), x.to_vec());
    }
    let mut q = vec![0u8; act.row_bytes(x.len()).unwrap()];
    quantize_row(act, x, &mut q).unwrap();
    let mut d = vec![0f32; x.len()];
    dequantize_row(act, &q, &mut d).unwrap();
    (q, d)
}

/// Every weight type (all but the activation-only Q8_1 and Q8_K).
pub fn weight_types() -> impl Iterator<Item = QuantType> {
    QuantType::ALL
        .into_iter()
        .filter(|t| t.vec_dot_type().is_some())
}

/// Every registered pair kernel of `ty` this CPU can run (whatever the switches say), scalar
/// and SIMD alike.
pub fn runnable_dot_kernels(ty: QuantType) -> Vec<&'static rill_kernels::dot::registry::Kernel> {
    use rill_kernels::dot::registry::{kernels, Operation};
    kernels()
        .filter(|k| k.ty == ty && k.operation == Operation::Dot && k.level.in_hardware())
        .collect()
}
