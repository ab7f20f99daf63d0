//! Exact scalar dequantization, written from ggml's reference dequantizers.
//!
//! This is the ground truth the SIMD dot products are tested against and the basis of the
//! f32-activation "exact" matmul path. It is deliberately simple scalar code: it runs once per
//! weight row per call, which is cheap next to the dot products that follow.

use crate::error::check_len;
use crate::fp16::{bf16_to_f32, f16_to_f32, rd_f16, rd_f32, rd_u16};
use crate::{KernelError, QuantType, QK_K};

/// Dequantizes one row (any whole number of blocks) of `ty` from `src` into `dst`.
///
/// `dst.len()` is the element count; `src` must hold exactly `ty.row_bytes(dst.len())` bytes.
pub fn dequantize_row(ty: QuantType, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    let n = dst.len();
    let need = ty.row_bytes_checked(n)?;
    check_len("dequantize_row source bytes", need, src.len())?;
    let bb = ty.block_bytes();
    let bs = ty.block_size();
    use QuantType::*;
    match ty {
        F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
            }
        }
        _ if crate::grid_quants::is_grid_type(ty) => {
            for (s, d) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(bs)) {
                crate::grid_quants::dequantize_block(ty, s, d);
            }
        }
        _ => {
            let f: fn(&[u8], &mut [f32]) = match ty {
                Q4_0 => block_q4_0,
                Q4_1 => block_q4_1,
                Q5_0 => block_q5_0,
                Q5_1 => block_q5_1,
                Q8_0 => block_q8_0,
                Q8_1 => block_q8_1,
                Q2_K => block_q2_k,
                Q3_K => block_q3_k,
                Q4_K => block_q4_k,
                Q5_K => block_q5_k,
                Q6_K => block_q6_k,
                Q8_K => block_q8_k,
                IQ4_NL => block_iq4_nl,
                IQ4_XS => block_iq4_xs,
                MXFP4 => block_mxfp4,
                F32 | F16 | BF16 | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M
                | TQ1_0 | TQ2_0 => unreachable!(),
            };
            for (s, d) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(bs)) {
                f(s, d);
            }
        }
    }
    Ok(())
}

/// IQ4_NL's (and IQ4_XS's) 16 levels, a non-linear grid denser near zero (GGUF's format).
pub const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4's E2M1 values, doubled so they are integers (the scale is halved to match).
pub const FP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of the power of two an E8M0 exponent byte encodes: `2^(e - 128)` (the halving pairs
/// with [`FP4_LEVELS`]' doubling), exact in f32 for every byte.
pub fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        // 2^-128 and 2^-127 are subnormal in f32: built from their bits.
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e as u32) - 1) << 23)
    }
}

/// 16 bytes of nibble indices into `levels`: low nibbles are elements 0..16, high ones 16..32.
fn nibbles(qs: &[u8], levels: &[i8; 16], d: f32, y: &mut [f32]) {
    for j in 0..16 {
        y[j] = d * f32::from(levels[(qs[j] & 0x0F) as usize]);
        y[j + 16] = d * f32::from(levels[(qs[j] >> 4) as usize]);
    }
}

fn block_iq4_nl(b: &[u8], y: &mut [f32]) {
    nibbles(&b[2..18], &IQ4_LEVELS, rd_f16(b, 0), y);
}

/// The 6-bit scale (minus 32) of IQ4_XS sub-block `ib`: low four bits from `scales_l`, high two
/// from `scales_h`.
pub fn iq4_xs_scale(b: &[u8], ib: usize) -> i32 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
    let high = ((scales_h >> (2 * ib)) & 3) as u8;
    i32::from(low | (high << 4)) - 32
}

fn block_iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = rd_f16(b, 0);
    for ib in 0..8 {
        let dl = d * iq4_xs_scale(b, ib) as f32;
        nibbles(
            &b[8 + 16 * ib..24 + 16 * ib],
            &IQ4_LEVELS,
            dl,
            &mut y[32 * ib..32 * ib + 32],
        );
    }
}

fn block_mxfp4(b: &[u8], y: &mut [f32]) {
    nibbles(&b[1..17], &FP4_LEVELS, e8m0_half(b[0]), y);
}

fn block_q4_0(b: &[u8], y: &mut [f32]) {
    let d = rd_f16(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

fn block_q4_1(b: &[u8], y: &mut [f32]) {
    let d = rd_f16(b, 0);
    let m = rd_f16(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        y[j] = (qs[j] & 0x0F) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

fn block_q5_0(b: &[u8], y: &mut [f32]) {
    let d = rd_f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        let x0 = (((qs[j] & 0x0F) as u32 | h0) as i32) - 16;
        let x1 = (((qs[j] >> 4) as u32 | h1) as i32) - 16;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

fn block_q5_1(b: &[u8], y: &mut [f32]) {
    let d = rd_f16(b, 0);
    let m = rd_f16(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        let x0 = (qs[j] & 0x0F) as u32 | h0;
        let x1 = (qs[j] >> 4) as u32 | h1;
        y[j] = x0 as f32 * d + m;
        y[j + 16] = x1 as f32 * d + m;
    }
}

fn block_q8_0(b: &[u8], y: &mut [f32]) {
    let d = rd_f16(b, 0);
    for j in 0..32 {
        y[j] = b[2 + j] as i8 as f32 * d;
    }
}

fn block_q8_1(b: &[u8], y: &mut [f32]) {
    let d = rd_f16(b, 0);
    for j in 0..32 {
        y[j] = b[4 + j] as i8 as f32 * d;
    }
}

fn block_q8_k(b: &[u8], y: &mut [f32]) {
    let d = rd_f32(b, 0);
    for j in 0..QK_K {
        y[j] = b[4 + j] as i8 as f32 * d;
    }
}

fn block_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = rd_f16(b, 80);
    let dmin = rd_f16(b, 82);
    let mut is = 0;
    let mut out = 0;
    for n in 0..2 {
        let q = &qs[n * 32..n * 32 + 32];
        for shift in [0u32, 2, 4, 6] {
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                for l in 0..16 {
                    y[out] = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
        }
    }
}

/// Unpacks Q3_K's twelve bytes of 6-bit scales into sixteen signed scales (already minus 32).
#[inline]
pub(crate) fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for j in 0..16 {
        let low = if j < 8 { s[j] & 0x0F } else { s[j - 8] >> 4 };
        let high = (s[8 + (j % 4)] >> (2 * (j / 4))) & 3;
        out[j] = ((low | (high << 4)) as i8).wrapping_sub(32);
    }
    out
}

fn block_q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = q3_k_scales(&b[96..108]);
    let d = rd_f16(b, 108);
    let mut is = 0;
    let mut out = 0;
    let mut m = 1u8;
    for n in 0..2 {
        let q = &qs[n * 32..n * 32 + 32];
        for shift in [0u32, 2, 4, 6] {
            for half in 0..2 {
                let dl = d * sc[is] as f32;
                is += 1;
                for l in 0..16 {
                    let i = l + 16 * half;
                    let v = ((q[i] >> shift) & 3) as i32 - if hmask[i] & m != 0 { 0 } else { 4 };
                    y[out] = dl * v as f32;
                    out += 1;
                }
            }
            m <<= 1;
        }
    }
}

/// ggml's `get_scale_min_k4`: 6-bit scale and min number `j` (0..8) of Q4_K/Q5_K.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn block_q4_k(b: &[u8], y: &mut [f32]) {
    let d = rd_f16(b, 0);
    let dmin = rd_f16(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..4 {
        let (s1, m1) = scale_min_k4(2 * j, scales);
        let (s2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let q = &qs[32 * j..32 * j + 32];
        let yo = &mut y[64 * j..64 * j + 64];
        for l in 0..32 {
            yo[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            yo[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

fn block_q5_k(b: &[u8], y: &mut [f32]) {
    let d = rd_f16(b, 0);
    let dmin = rd_f16(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..4 {
        let (s1, m1) = scale_min_k4(2 * j, scales);
        let (s2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        let u1 = 1u8 << (2 * j);
        let u2 = 2u8 << (2 * j);
        let q = &qs[32 * j..32 * j + 32];
        let yo = &mut y[64 * j..64 * j + 64];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            yo[l] = d1 * ((q[l] & 0x0F) + h1) as f32 - m1;
            yo[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

fn block_q6_k(b: &[u8], y: &mut [f32]) {
    let ql_all = &b[0..128];
    let qh_all = &b[128..192];
    let sc_all = &b[192..208];
    let d = f16_to_f32(rd_u16(b, 208));
    for n in 0..2 {
        let ql = &ql_all[64 * n..64 * n + 64];
        let qh = &qh_all[32 * n..32 * n + 32];
        let sc = &sc_all[8 * n..8 * n + 8];
        let yo = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            yo[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            yo[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            yo[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            yo[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}
