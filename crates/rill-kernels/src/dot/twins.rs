//! Portable twins of the tiled AVX2 kernels (`blocks_q32/`, `blocks_k.rs`) that reproduce their arithmetic **bit
//! for bit**: the same 8-lane integer grouping, the same f32 scale products, one fused
//! multiply-add per lane per block in block order, the min term accumulated by block index
//! modulo 8, and the same horizontal reduction tree. Used to test the SIMD kernels exactly (the
//! [`scalar`](super::scalar) kernels are the plain reference and only agree to rounding).

use crate::dequant::scale_min_k4;
use crate::dot::GemmCall;
use crate::fp16::{rd_f16, rd_f32, rd_u16};
use crate::quant_types::BlockQ8K;
use crate::{QuantType, QK_K};

/// The 32 quants of a weight block of type `ty` as signed integers (element `i` at index `i`),
/// together with the block's offsets: (quants, act block bytes, act quant offset, has min).
fn weight_quants(ty: QuantType, x: &[u8]) -> [i32; 32] {
    let mut q = [0i32; 32];
    match ty {
        QuantType::Q4_0 | QuantType::Q4_1 => {
            let (qs, off) = if ty == QuantType::Q4_0 {
                (&x[2..18], 8)
            } else {
                (&x[4..20], 0)
            };
            for j in 0..16 {
                q[j] = (qs[j] & 0x0F) as i32 - off;
                q[j + 16] = (qs[j] >> 4) as i32 - off;
            }
        }
        QuantType::Q5_0 | QuantType::Q5_1 => {
            // Q5_0's codes stay unsigned too: its offset of 16 is a min term (see below).
            let (h, qs, off) = if ty == QuantType::Q5_0 {
                (2, &x[6..22], 0)
            } else {
                (4, &x[8..24], 0)
            };
            let qh = u32::from_le_bytes([x[h], x[h + 1], x[h + 2], x[h + 3]]);
            for j in 0..16 {
                let h0 = (((qh >> j) & 1) << 4) as i32;
                let h1 = (((qh >> (j + 16)) & 1) << 4) as i32;
                q[j] = ((qs[j] & 0x0F) as i32 | h0) - off;
                q[j + 16] = ((qs[j] >> 4) as i32 | h1) - off;
            }
        }
        QuantType::Q8_0 => {
            for (j, v) in q.iter_mut().enumerate() {
                *v = x[2 + j] as i8 as i32;
            }
        }
        QuantType::IQ4_NL | QuantType::MXFP4 => {
            let (levels, at) = if ty == QuantType::IQ4_NL {
                (&crate::dequant::IQ4_LEVELS, 2)
            } else {
                (&crate::dequant::FP4_LEVELS, 1)
            };
            for j in 0..16 {
                q[j] = i32::from(levels[(x[at + j] & 0x0F) as usize]);
                q[j + 16] = i32::from(levels[(x[at + j] >> 4) as usize]);
            }
        }
        _ => unreachable!("not a 32-element weight type"),
    }
    q
}

/// The fixed reduction tree of the SIMD horizontal sum.
pub(crate) fn hsum8(l: &[f32; 8]) -> f32 {
    let s = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (s[0] + s[2]) + (s[1] + s[3])
}

/// Bit-exact scalar twin of the AVX2 Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/IQ4_NL/MXFP4 kernels. `None` for
/// other types.
pub fn q32_bitexact(ty: QuantType, w: &[u8], a: &[u8], n: usize) -> Option<f32> {
    let (wb, ab, aq, has_min) = match ty {
        QuantType::Q4_0 => (18, 34, 2, false),
        QuantType::Q4_1 => (20, 36, 4, true),
        QuantType::Q5_0 => (22, 34, 2, true),
        QuantType::Q5_1 => (24, 36, 4, true),
        QuantType::Q8_0 => (34, 34, 2, false),
        QuantType::IQ4_NL => (18, 34, 2, false),
        QuantType::MXFP4 => (17, 34, 2, false),
        _ => return None,
    };
    let nb = n / 32;
    let mut acc = [0f32; 8];
    let mut macc = [0f32; 8];
    for b in 0..nb {
        let x = &w[b * wb..(b + 1) * wb];
        let y = &a[b * ab..(b + 1) * ab];
        let q = weight_quants(ty, x);
        let dx = if ty == QuantType::MXFP4 {
            crate::dequant::e8m0_half(x[0])
        } else {
            rd_f16(x, 0)
        };
        let d = dx * rd_f16(y, 0);
        for (l, acc_l) in acc.iter_mut().enumerate() {
            let s: i32 = (4 * l..4 * l + 4)
                .map(|i| q[i] * (y[aq + i] as i8 as i32))
                .sum();
            *acc_l = d.mul_add(s as f32, *acc_l);
        }
        if has_min {
            let (mx, sy) = if ty == QuantType::Q5_0 {
                // `d · (u - 16)`: the min is `-16 · d`, against the activation block's exact
                // quant sum times its scale.
                let sum: i32 = y[aq..aq + 32].iter().map(|&v| v as i8 as i32).sum();
                (rd_f16(x, 0) * -16.0, rd_f16(y, 0) * sum as f32)
            } else {
                (rd_f16(x, 2), rd_f16(y, 2))
            };
            let k = b % 8;
            macc[k] = mx.mul_add(sy, macc[k]);
        }
    }
    let mut v = hsum8(&acc);
    if has_min {
        v += hsum8(&macc);
    }
    Some(v)
}

/// Bit-exact scalar twin of the kernels over Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL and MXFP4 rows in the
/// [row-interleaved](crate::WeightLayout::RowInterleaved) layout, given the row in GGUF blocks
/// (`w`) and a Q8_0 (Q4_1: Q8_1) activation row (`a`): per block, in order,
/// `acc = fma(f32(Σ q · y), dx · dy, acc)` with the integer sum exact, then for Q4_1
/// `acc = fma(mx, sy, acc)` (the Q8_1 block's `s`). `None` for other types.
pub fn rows_bitexact(ty: QuantType, w: &[u8], a: &[u8], n: usize) -> Option<f32> {
    // (weight block bytes, what `weight_quants` leaves to subtract, activation block bytes and
    // quant offset, has a min)
    let (wb, offset, ab, aq, has_min) = match ty {
        QuantType::Q4_0 => (18, 0, 34, 2, false),
        QuantType::Q4_1 => (20, 0, 36, 4, true),
        QuantType::Q5_0 => (22, 16, 34, 2, false),
        QuantType::Q8_0 => (34, 0, 34, 2, false),
        QuantType::IQ4_NL => (18, 0, 34, 2, false),
        QuantType::MXFP4 => (17, 0, 34, 2, false),
        _ => return None,
    };
    let mut acc = 0f32;
    for b in 0..n / 32 {
        let x = &w[b * wb..(b + 1) * wb];
        let y = &a[b * ab..(b + 1) * ab];
        let q = weight_quants(ty, x);
        let s: i32 = (0..32)
            .map(|i| (q[i] - offset) * (y[aq + i] as i8 as i32))
            .sum();
        let dx = if ty == QuantType::MXFP4 {
            crate::dequant::e8m0_half(x[0])
        } else {
            rd_f16(x, 0)
        };
        acc = (s as f32).mul_add(dx * rd_f16(y, 0), acc);
        if has_min {
            acc = rd_f16(x, 2).mul_add(rd_f16(y, 2), acc);
        }
    }
    Some(acc)
}

/// Bit-exact scalar twin of the kernels over Q4_K and Q6_K rows in the
/// [row-interleaved](crate::WeightLayout::RowInterleaved) layout against 16-bit activations,
/// given the row in GGUF blocks (`w`) and a [`quantize_row_i16`](crate::quantize_row_i16) row
/// (`a`): per super-block, `acc = fma(f32(Σ w'·y), dx · dy, acc)` and, for Q4_K,
/// `acc = fma(f32(Σ m · Σ y), (-dmin) · dy, acc)`, the integer sums exact (see `interleaved_q32.rs`).
/// `None` for other types.
pub fn k_rows_i16_bitexact(ty: QuantType, w: &[u8], a: &[u8], n: usize) -> Option<f32> {
    use crate::layout::{q4_k_codes, q6_k_codes};
    use crate::quantize::{I16_BLOCK_BYTES, I16_QUANTS};
    let wb = match ty {
        QuantType::Q4_K => 144,
        QuantType::Q6_K => 210,
        _ => return None,
    };
    let mut acc = 0f32;
    for b in 0..n / QK_K {
        let x = &w[b * wb..(b + 1) * wb];
        let y = &a[b * I16_BLOCK_BYTES..(b + 1) * I16_BLOCK_BYTES];
        let dy = rd_f32(y, 0);
        let yq = |e: usize| rd_u16(y, I16_QUANTS + 2 * e) as i16 as i32;
        if ty == QuantType::Q6_K {
            let (codes, scales) = q6_k_codes(x);
            let isum: i32 = (0..QK_K)
                .map(|e| scales[e / 16] as i32 * (codes[e] as i32 - 32) * yq(e))
                .sum();
            acc = (isum as f32).mul_add(rd_f16(x, 208) * dy, acc);
        } else {
            let (codes, scales) = q4_k_codes(x);
            let isum: i32 = (0..QK_K)
                .map(|e| scales[e / 32].0 as i32 * codes[e] as i32 * yq(e))
                .sum();
            let msum: i32 = (0..8)
                .map(|j| {
                    let sum = i32::from_le_bytes([
                        y[4 + 4 * j],
                        y[5 + 4 * j],
                        y[6 + 4 * j],
                        y[7 + 4 * j],
                    ]);
                    scales[j].1 as i32 * sum
                })
                .sum();
            acc = (isum as f32).mul_add(rd_f16(x, 0) * dy, acc);
            acc = (msum as f32).mul_add(-rd_f16(x, 2) * dy, acc);
        }
    }
    Some(acc)
}

/// Bit-exact scalar twin of the AVX2 Q4_K and Q6_K kernels (`blocks_k.rs`). `None` for other
/// types.
pub fn k_bitexact(ty: QuantType, w: &[u8], a: &[u8], n: usize) -> Option<f32> {
    let wb = match ty {
        QuantType::Q4_K => 144,
        QuantType::Q6_K => 210,
        _ => return None,
    };
    let ab = BlockQ8K::BYTES;
    let mut acc = [0f32; 8];
    let mut summ = 0f32;
    for b in 0..n / QK_K {
        let x = &w[b * wb..(b + 1) * wb];
        let y = &a[b * ab..(b + 1) * ab];
        let yq = |i: usize| y[BlockQ8K::QS + i] as i8 as i32;
        let dy = rd_f32(y, 0);
        // lanes[l]: the scaled products of elements 4l..4l+4 of every 32-element chunk.
        let mut lanes = [0i32; 8];
        let d = if ty == QuantType::Q4_K {
            let mut sc = [0i32; 8];
            let mut mn = [0i32; 8];
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, &x[4..16]);
                sc[j] = s as i32;
                mn[j] = m as i32;
            }
            let bs = |g: usize| rd_u16(y, BlockQ8K::BSUMS + 2 * g) as i16 as i32;
            let m: i32 = (0..8).map(|j| mn[j] * (bs(2 * j) + bs(2 * j + 1))).sum();
            summ += (dy * rd_f16(x, 2)) * m as f32;
            for j in 0..4 {
                for e in 0..32 {
                    let q = x[16 + 32 * j + e];
                    let lo = (q & 0x0F) as i32 * yq(64 * j + e);
                    let hi = (q >> 4) as i32 * yq(64 * j + 32 + e);
                    lanes[e / 4] += sc[2 * j] * lo + sc[2 * j + 1] * hi;
                }
            }
            dy * rd_f16(x, 0)
        } else {
            for nn in 0..2 {
                for k in 0..4 {
                    for e in 0..32 {
                        let l = x[64 * nn + 32 * (k & 1) + e];
                        let l = if k < 2 { l & 0x0F } else { l >> 4 };
                        let h = (x[128 + 32 * nn + e] >> (2 * k)) & 3;
                        let q = (l | (h << 4)) as i32 - 32;
                        let s = x[192 + 8 * nn + 2 * k + e / 16] as i8 as i32;
                        lanes[e / 4] += s * q * yq(128 * nn + 32 * k + e);
                    }
                }
            }
            dy * rd_f16(x, 208)
        };
        for (acc_l, &s) in acc.iter_mut().zip(&lanes) {
            *acc_l = d.mul_add(s as f32, *acc_l);
        }
    }
    Some(hsum8(&acc) - summ)
}

/// Bit-exact scalar twin of every tiled AVX2 kernel (see [`q32_bitexact`], [`k_bitexact`]).
pub fn bitexact(ty: QuantType, w: &[u8], a: &[u8], n: usize) -> Option<f32> {
    q32_bitexact(ty, w, a, n).or_else(|| k_bitexact(ty, w, a, n))
}

thread_local! {
    /// Per-thread dequantized row for the portable float-activation kernels.
    static DEQ_ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The float-activation tiles' arithmetic for one (dequantized row, token) pair: per lane `l`
/// the fused multiply-add chain over the elements `k ≡ l (mod 8)` in increasing `k`, then the
/// fixed reduction tree. `row.len()` is a multiple of 8.
fn fma8_dot(row: &[f32], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wk, xk) in row.chunks_exact(8).zip(x.chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = wk[l].mul_add(xk[l], acc[l]);
        }
    }
    hsum8(&acc)
}

/// Bit-exact scalar twin of the float-activation tiles (`float_acts.rs`): the weight row
/// dequantized exactly ([`dequantize_row`](crate::dequantize_row)), then [`fma8_dot`]. `None`
/// when the row cannot be dequantized or `n` is no multiple of 8.
pub fn deq_bitexact(ty: QuantType, w: &[u8], x: &[f32], n: usize) -> Option<f32> {
    if !n.is_multiple_of(8) || x.len() < n {
        return None;
    }
    let mut row = vec![0.0f32; n];
    crate::dequantize_row(ty, w, &mut row).ok()?;
    Some(fma8_dot(&row, &x[..n]))
}

/// The portable float-activation kernel over a rectangle ([`GemmKernel`](super::GemmKernel)
/// shape): each weight row dequantized once into a thread-local buffer, then [`fma8_dot`] with
/// every token. For CPUs without the AVX2 tiles; the same bits as they give.
///
/// # Safety
/// Pointers valid for `nr` weight rows `ldw` bytes apart (whole blocks of `ty`), `nt` f32
/// activation rows `lda` bytes apart at f32-aligned addresses, and the outputs.
unsafe fn gemm_f32act(ty: QuantType, c: &GemmCall) {
    let GemmCall {
        w,
        ldw,
        a,
        lda,
        n,
        nr,
        nt,
        out,
        ldo,
    } = *c;
    let row_bytes = n / ty.block_size() * ty.block_bytes();
    DEQ_ROW.with(|cell| {
        let mut row = cell.borrow_mut();
        if row.len() < n {
            row.resize(n, 0.0);
        }
        for r in 0..nr {
            let src = std::slice::from_raw_parts(w.add(r * ldw), row_bytes);
            // Cannot fail: whole blocks of a dequantizable type (validated by the driver).
            let _ = crate::dequantize_row(ty, src, &mut row[..n]);
            for t in 0..nt {
                let x = std::slice::from_raw_parts(a.add(t * lda) as *const f32, n);
                *out.add(t * ldo + r) = fma8_dot(&row[..n], x);
            }
        }
    });
}

/// [`gemm_f32act`] for each quantized weight type.
macro_rules! f32act_gemms {
    ($($name:ident => $ty:ident;)*) => {$(
        gemm_entry!(pub(crate) $name, |c| gemm_f32act(QuantType::$ty, c));
    )*};
}

f32act_gemms! {
    gemm_f32act_f32 => F32;
    gemm_f32act_f16 => F16;
    gemm_f32act_bf16 => BF16;
    gemm_f32act_q4_0 => Q4_0;
    gemm_f32act_q4_1 => Q4_1;
    gemm_f32act_q5_0 => Q5_0;
    gemm_f32act_q5_1 => Q5_1;
    gemm_f32act_q8_0 => Q8_0;
    gemm_f32act_q2_k => Q2_K;
    gemm_f32act_q3_k => Q3_K;
    gemm_f32act_q4_k => Q4_K;
    gemm_f32act_q5_k => Q5_K;
    gemm_f32act_q6_k => Q6_K;
    gemm_f32act_iq4_nl => IQ4_NL;
    gemm_f32act_iq4_xs => IQ4_XS;
    gemm_f32act_mxfp4 => MXFP4;
    gemm_f32act_iq2_xxs => IQ2_XXS;
    gemm_f32act_iq2_xs => IQ2_XS;
    gemm_f32act_iq2_s => IQ2_S;
    gemm_f32act_iq3_xxs => IQ3_XXS;
    gemm_f32act_iq3_s => IQ3_S;
    gemm_f32act_iq1_s => IQ1_S;
    gemm_f32act_iq1_m => IQ1_M;
    gemm_f32act_tq1_0 => TQ1_0;
    gemm_f32act_tq2_0 => TQ2_0;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The portable float-activation kernel gives the twin's bits for every row and token.
    #[test]
    fn portable_float_activation_gemm_equals_the_twin() {
        let mut seed = 0x5EEDu64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for ty in [QuantType::Q8_0, QuantType::Q4_K, QuantType::Q6_K] {
            let (n, nr, nt) = (512usize, 5usize, 3usize);
            let rb = ty.row_bytes(n).unwrap();
            let mut w: Vec<u8> = (0..rb * nr).map(|_| next() as u8).collect();
            // Finite f16 scales (0x2000 ≈ 0.0078) where each type keeps them.
            for blk in w.chunks_exact_mut(ty.block_bytes()) {
                let at = if ty == QuantType::Q6_K { 208 } else { 0 };
                blk[at..at + 2].copy_from_slice(&0x2000u16.to_le_bytes());
                if ty == QuantType::Q4_K {
                    blk[2..4].copy_from_slice(&0x2000u16.to_le_bytes());
                }
            }
            let x: Vec<f32> = (0..n * nt)
                .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                .collect();
            let mut out = vec![0f32; nr * nt];
            // SAFETY: sizes as the kernel expects; `x` is an f32 slice.
            unsafe {
                gemm_f32act(
                    ty,
                    &GemmCall {
                        w: w.as_ptr(),
                        ldw: rb,
                        a: x.as_ptr() as *const u8,
                        lda: 4 * n,
                        n,
                        nr,
                        nt,
                        out: out.as_mut_ptr(),
                        ldo: nr,
                    },
                )
            };
            for t in 0..nt {
                for r in 0..nr {
                    let twin =
                        deq_bitexact(ty, &w[r * rb..(r + 1) * rb], &x[t * n..(t + 1) * n], n)
                            .unwrap();
                    assert_eq!(out[t * nr + r].to_bits(), twin.to_bits(), "{ty} r{r} t{t}");
                }
            }
        }
    }
}
