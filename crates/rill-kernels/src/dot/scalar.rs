//! Portable scalar dot products: the twins every SIMD kernel is tested against, and the
//! fallback on CPUs without AVX2.
//!
//! Each function takes a weight row of `n / block_size` blocks and an activation row in the
//! paired format (see [`QuantType::vec_dot_type`](crate::QuantType::vec_dot_type)); the caller
//! has validated the lengths. Per block the integer dot product is exact; blocks are combined in
//! f32 in block order.

use crate::dequant::{e8m0_half, iq4_xs_scale, q3_k_scales, scale_min_k4, FP4_LEVELS, IQ4_LEVELS};
use crate::fp16::{bf16_to_f32, rd_f16, rd_f32, rd_u16};
use crate::quant_types::BlockQ8K;
use crate::{QK8_0, QK_K};

#[inline(always)]
fn i8at(b: &[u8], i: usize) -> i32 {
    b[i] as i8 as i32
}

#[inline(always)]
fn bsum(y: &[u8], g: usize) -> i32 {
    rd_u16(y, BlockQ8K::BSUMS + 2 * g) as i16 as i32
}

/// Q4_0 weights · Q8_0 activations.
pub fn q4_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK8_0 {
        let x = &w[i * 18..i * 18 + 18];
        let y = &a[i * 34..i * 34 + 34];
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += ((x[2 + j] & 0x0F) as i32 - 8) * i8at(y, 2 + j);
            sumi += ((x[2 + j] >> 4) as i32 - 8) * i8at(y, 18 + j);
        }
        sumf += sumi as f32 * (rd_f16(x, 0) * rd_f16(y, 0));
    }
    sumf
}

/// Nibble-indexed weights (IQ4_NL, MXFP4: `levels`, the block's scale from `scale`) · Q8_0
/// activations: `d_x d_y Σ level(q_x) q_y` per block.
fn nibble_q8_0(
    w: &[u8],
    a: &[u8],
    n: usize,
    (block, qs_at): (usize, usize),
    levels: &[i8; 16],
    scale: fn(&[u8]) -> f32,
) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK8_0 {
        let x = &w[i * block..(i + 1) * block];
        let y = &a[i * 34..i * 34 + 34];
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += i32::from(levels[(x[qs_at + j] & 0x0F) as usize]) * i8at(y, 2 + j);
            sumi += i32::from(levels[(x[qs_at + j] >> 4) as usize]) * i8at(y, 18 + j);
        }
        sumf += sumi as f32 * (scale(x) * rd_f16(y, 0));
    }
    sumf
}

/// IQ4_NL weights · Q8_0 activations.
pub fn iq4_nl_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    nibble_q8_0(w, a, n, (18, 2), &IQ4_LEVELS, |x| rd_f16(x, 0))
}

/// MXFP4 weights · Q8_0 activations.
pub fn mxfp4_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    nibble_q8_0(w, a, n, (17, 1), &FP4_LEVELS, |x| e8m0_half(x[0]))
}

/// IQ4_XS weights · Q8_K activations: per sub-block of 32, `(scale - 32) Σ level(q_x) q_y`,
/// summed in i32, times `d_x d_y` per super-block.
pub fn iq4_xs_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK_K {
        let x = &w[i * 136..(i + 1) * 136];
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let mut sumi = 0i32;
        for ib in 0..8 {
            let qs = &x[8 + 16 * ib..24 + 16 * ib];
            let mut s = 0i32;
            for j in 0..16 {
                s += i32::from(IQ4_LEVELS[(qs[j] & 0x0F) as usize])
                    * i8at(y, BlockQ8K::QS + 32 * ib + j);
                s += i32::from(IQ4_LEVELS[(qs[j] >> 4) as usize])
                    * i8at(y, BlockQ8K::QS + 32 * ib + 16 + j);
            }
            sumi += iq4_xs_scale(x, ib) * s;
        }
        let dy = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        sumf += sumi as f32 * (rd_f16(x, 0) * dy);
    }
    sumf
}

/// Q4_1 weights · Q8_1 activations: `d_x d_y Σ q_x q_y + m_x s_y` per block.
pub fn q4_1_q8_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK8_0 {
        let x = &w[i * 20..i * 20 + 20];
        let y = &a[i * 36..i * 36 + 36];
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += (x[4 + j] & 0x0F) as i32 * i8at(y, 4 + j);
            sumi += (x[4 + j] >> 4) as i32 * i8at(y, 20 + j);
        }
        sumf += rd_f16(x, 0) * rd_f16(y, 0) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2);
    }
    sumf
}

/// Q5_0 weights · Q8_0 activations.
pub fn q5_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK8_0 {
        let x = &w[i * 22..i * 22 + 22];
        let y = &a[i * 34..i * 34 + 34];
        let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
        let mut sumi = 0i32;
        for j in 0..16 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            let x0 = ((x[6 + j] & 0x0F) as u32 | h0) as i32 - 16;
            let x1 = ((x[6 + j] >> 4) as u32 | h1) as i32 - 16;
            sumi += x0 * i8at(y, 2 + j) + x1 * i8at(y, 18 + j);
        }
        sumf += sumi as f32 * (rd_f16(x, 0) * rd_f16(y, 0));
    }
    sumf
}

/// Q5_1 weights · Q8_1 activations.
pub fn q5_1_q8_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK8_0 {
        let x = &w[i * 24..i * 24 + 24];
        let y = &a[i * 36..i * 36 + 36];
        let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
        let mut sumi = 0i32;
        for j in 0..16 {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            let x0 = ((x[8 + j] & 0x0F) as u32 | h0) as i32;
            let x1 = ((x[8 + j] >> 4) as u32 | h1) as i32;
            sumi += x0 * i8at(y, 4 + j) + x1 * i8at(y, 20 + j);
        }
        sumf += rd_f16(x, 0) * rd_f16(y, 0) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2);
    }
    sumf
}

/// Q8_0 weights · Q8_0 activations.
pub fn q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK8_0 {
        let x = &w[i * 34..i * 34 + 34];
        let y = &a[i * 34..i * 34 + 34];
        let mut sumi = 0i32;
        for j in 0..32 {
            sumi += i8at(x, 2 + j) * i8at(y, 2 + j);
        }
        sumf += sumi as f32 * (rd_f16(x, 0) * rd_f16(y, 0));
    }
    sumf
}

/// Q2_K weights · Q8_K activations.
pub fn q2_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK_K {
        let x = &w[i * 84..i * 84 + 84];
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let dy = rd_f32(y, 0);
        let scales = &x[0..16];
        let mut summs = 0i32;
        for (g, &sc) in scales.iter().enumerate() {
            summs += (sc >> 4) as i32 * bsum(y, g);
        }
        let mut isum = 0i32;
        let mut is = 0;
        let mut yi = BlockQ8K::QS;
        for nn in 0..2 {
            let q = &x[16 + 32 * nn..16 + 32 * nn + 32];
            for shift in [0u32, 2, 4, 6] {
                for half in 0..2 {
                    let mut s = 0i32;
                    for l in 0..16 {
                        s += ((q[16 * half + l] >> shift) & 3) as i32 * i8at(y, yi + l);
                    }
                    isum += (scales[is] & 0x0F) as i32 * s;
                    is += 1;
                    yi += 16;
                }
            }
        }
        sumf += dy * rd_f16(x, 80) * isum as f32 - dy * rd_f16(x, 82) * summs as f32;
    }
    sumf
}

/// Q3_K weights · Q8_K activations.
pub fn q3_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK_K {
        let x = &w[i * 110..i * 110 + 110];
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let hmask = &x[0..32];
        let sc = q3_k_scales(&x[96..108]);
        let mut isum = 0i32;
        let mut is = 0;
        let mut yi = BlockQ8K::QS;
        let mut m = 1u8;
        for nn in 0..2 {
            let q = &x[32 + 32 * nn..32 + 32 * nn + 32];
            for shift in [0u32, 2, 4, 6] {
                for half in 0..2 {
                    let mut s = 0i32;
                    for l in 0..16 {
                        let k = 16 * half + l;
                        let v =
                            ((q[k] >> shift) & 3) as i32 - if hmask[k] & m != 0 { 0 } else { 4 };
                        s += v * i8at(y, yi + l);
                    }
                    isum += sc[is] as i32 * s;
                    is += 1;
                    yi += 16;
                }
                m <<= 1;
            }
        }
        sumf += rd_f16(x, 108) * rd_f32(y, 0) * isum as f32;
    }
    sumf
}

/// Q4_K weights · Q8_K activations.
pub fn q4_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK_K {
        let x = &w[i * 144..i * 144 + 144];
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let dy = rd_f32(y, 0);
        let scales = &x[4..16];
        let mut isum = 0i32;
        let mut summs = 0i32;
        for j in 0..4 {
            let (s1, m1) = scale_min_k4(2 * j, scales);
            let (s2, m2) = scale_min_k4(2 * j + 1, scales);
            let q = &x[16 + 32 * j..16 + 32 * j + 32];
            let yb = BlockQ8K::QS + 64 * j;
            let (mut lo, mut hi) = (0i32, 0i32);
            for (l, &qv) in q.iter().enumerate() {
                lo += (qv & 0x0F) as i32 * i8at(y, yb + l);
                hi += (qv >> 4) as i32 * i8at(y, yb + 32 + l);
            }
            isum += s1 as i32 * lo + s2 as i32 * hi;
            summs += m1 as i32 * (bsum(y, 4 * j) + bsum(y, 4 * j + 1))
                + m2 as i32 * (bsum(y, 4 * j + 2) + bsum(y, 4 * j + 3));
        }
        sumf += dy * rd_f16(x, 0) * isum as f32 - dy * rd_f16(x, 2) * summs as f32;
    }
    sumf
}

/// Q5_K weights · Q8_K activations.
pub fn q5_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK_K {
        let x = &w[i * 176..i * 176 + 176];
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let dy = rd_f32(y, 0);
        let scales = &x[4..16];
        let qh = &x[16..48];
        let mut isum = 0i32;
        let mut summs = 0i32;
        for j in 0..4 {
            let (s1, m1) = scale_min_k4(2 * j, scales);
            let (s2, m2) = scale_min_k4(2 * j + 1, scales);
            let u1 = 1u8 << (2 * j);
            let u2 = 2u8 << (2 * j);
            let q = &x[48 + 32 * j..48 + 32 * j + 32];
            let yb = BlockQ8K::QS + 64 * j;
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                lo += ((q[l] & 0x0F) as i32 + h1) * i8at(y, yb + l);
                hi += ((q[l] >> 4) as i32 + h2) * i8at(y, yb + 32 + l);
            }
            isum += s1 as i32 * lo + s2 as i32 * hi;
            summs += m1 as i32 * (bsum(y, 4 * j) + bsum(y, 4 * j + 1))
                + m2 as i32 * (bsum(y, 4 * j + 2) + bsum(y, 4 * j + 3));
        }
        sumf += dy * rd_f16(x, 0) * isum as f32 - dy * rd_f16(x, 2) * summs as f32;
    }
    sumf
}

/// Q6_K weights · Q8_K activations.
pub fn q6_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sumf = 0.0f32;
    for i in 0..n / QK_K {
        let x = &w[i * 210..i * 210 + 210];
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let mut isum = 0i32;
        for nn in 0..2 {
            let ql = &x[64 * nn..64 * nn + 64];
            let qh = &x[128 + 32 * nn..128 + 32 * nn + 32];
            let sc = &x[192 + 8 * nn..192 + 8 * nn + 8];
            let yb = BlockQ8K::QS + 128 * nn;
            let mut s = [0i32; 8];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                s[is] += q1 * i8at(y, yb + l);
                s[is + 2] += q2 * i8at(y, yb + 32 + l);
                s[is + 4] += q3 * i8at(y, yb + 64 + l);
                s[is + 6] += q4 * i8at(y, yb + 96 + l);
            }
            for k in 0..8 {
                isum += (sc[k] as i8 as i32) * s[k];
            }
        }
        sumf += rd_f16(x, 208) * rd_f32(y, 0) * isum as f32;
    }
    sumf
}

/// f32 weights (little-endian bytes) · f32 activations (little-endian bytes).
pub fn f32_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = [0.0f32; 8];
    for i in 0..n {
        acc[i % 8] += rd_f32(w, 4 * i) * rd_f32(a, 4 * i);
    }
    acc.iter().sum()
}

/// f16 weights · f32 activations.
pub fn f16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = [0.0f32; 8];
    for i in 0..n {
        acc[i % 8] += rd_f16(w, 2 * i) * rd_f32(a, 4 * i);
    }
    acc.iter().sum()
}

/// bf16 weights · f32 activations.
pub fn bf16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut acc = [0.0f32; 8];
    for i in 0..n {
        acc[i % 8] += bf16_to_f32(rd_u16(w, 2 * i)) * rd_f32(a, 4 * i);
    }
    acc.iter().sum()
}

/// Plain f32 dot product with eight interleaved partial sums (so the compiler can vectorise it
/// on baseline targets and its rounding is close to the SIMD version's).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        for k in 0..8 {
            acc[k] += a[8 * c + k] * b[8 * c + k];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    s
}

/// Grid i-quant and ternary weights · Q8_K activations: per block the exact integer sum
/// `Σ_g scale_g Σ_(k in g) w_k q_k` of the block's integer form (`grid_quants::unpack`), then
/// `sum += isum · (d_x · d_y)` in block order.
fn grid_q8_k(ty: crate::QuantType, w: &[u8], a: &[u8], n: usize) -> f32 {
    let bb = ty.block_bytes();
    let mut blk = crate::grid_quants::IntBlock::default();
    let mut sumf = 0.0f32;
    for i in 0..n / QK_K {
        crate::grid_quants::unpack(ty, &w[i * bb..(i + 1) * bb], &mut blk);
        let y = &a[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
        let mut isum = 0i32;
        for g in 0..QK_K / 16 {
            let s: i32 = (16 * g..16 * g + 16)
                .map(|k| i32::from(blk.w[k]) * i8at(y, BlockQ8K::QS + k))
                .sum();
            isum += s * i32::from(blk.scales[g]);
        }
        sumf += isum as f32 * (blk.d * rd_f32(y, BlockQ8K::D));
    }
    sumf
}

macro_rules! grid_scalar {
    ($($name:ident => $ty:ident;)*) => {$(
        #[doc = concat!(stringify!($ty), " weights · Q8_K activations.")]
        pub fn $name(w: &[u8], a: &[u8], n: usize) -> f32 {
            grid_q8_k(crate::QuantType::$ty, w, a, n)
        }
    )*};
}

grid_scalar! {
    iq2_xxs_q8_k => IQ2_XXS;
    iq2_xs_q8_k => IQ2_XS;
    iq2_s_q8_k => IQ2_S;
    iq3_xxs_q8_k => IQ3_XXS;
    iq3_s_q8_k => IQ3_S;
    iq1_s_q8_k => IQ1_S;
    iq1_m_q8_k => IQ1_M;
    tq1_0_q8_k => TQ1_0;
    tq2_0_q8_k => TQ2_0;
}
