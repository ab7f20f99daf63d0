//! The grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) and the ternary
//! types (TQ1_0, TQ2_0): where each element of a block comes from, written once.
//!
//! Two forms of every block:
//!
//! * **exact dequantization** ([`dequantize_block`]), with the f32 operations in the order of
//!   gguf-py's numpy reference (`gguf.quants`), so its values are bit-identical to it;
//! * **the integer form** ([`unpack`]): 256 small signed integers `w`, an integer scale per 16
//!   elements and one f32 factor `d`, with `element = d · scale · w` exactly (every type's
//!   fractional parts, `(0.5 + s) / 4`, `(0.5 + s) / 2` and IQ1's `±1/8` shift, are powers of two
//!   folded into `d`). The dot products multiply `w` with 8-bit activations in integers, so a
//!   block's sum is exact and only the f32 combination of blocks rounds.
//!
//! The grids themselves are in `iq_grids.rs`.

use crate::fp16::{f16_to_f32, rd_f16, rd_u16};
use crate::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::{QuantType, QK_K};

/// Seven stored sign bits plus an eighth that makes the number of negative elements even (the
/// IQ2/IQ3 "ksigns" code): bit `j` set means element `j` of the 8 is negated.
pub(crate) const fn ksigns(i: usize) -> u8 {
    let b = (i & 0x7F) as u8;
    b | (((b.count_ones() & 1) as u8) << 7)
}

/// For every byte `b`, the u64 whose byte `j` is `0xFF` where bit `j` of `b` is set: the sign
/// bits of eight elements as a byte mask (`(x ^ m) - m` negates the masked bytes).
pub(crate) static BYTE_MASKS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 8 {
            if (b >> j) & 1 == 1 {
                t[b] |= 0xFF << (8 * j);
            }
            j += 1;
        }
        b += 1;
    }
    t
};

/// [`BYTE_MASKS`] of the 128 [`ksigns`] codes.
pub(crate) static KSIGN_MASKS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = BYTE_MASKS[ksigns(i) as usize];
        i += 1;
    }
    t
};

/// True for the types of this module.
pub(crate) const fn is_grid_type(ty: QuantType) -> bool {
    use QuantType::*;
    matches!(
        ty,
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | TQ1_0 | TQ2_0
    )
}

fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Byte `j` of a grid entry.
#[inline(always)]
fn byte(entry: u64, j: usize) -> u8 {
    (entry >> (8 * j)) as u8
}

/// IQ2_XS / IQ2_S / IQ1_M scale index of 16-element group `g`: nibble `g % 2` of byte `g / 2`.
#[inline(always)]
fn nibble(b: u8, hi: bool) -> u32 {
    u32::from(if hi { b >> 4 } else { b & 0x0F })
}

// ---------------------------------------------------------------------------------------------
// Where the elements come from. Each type is described once, as a visitor over its 8-element
// groups (4-element for IQ3's grids, in pairs): `group(g, entry, signs, scale)` with `entry`
// the grid entry (bytes = magnitudes, or -1/0/1 for IQ1), `signs` a bit per element, and the
// group's scale parameters. Dequantization and unpacking both walk these.
// ---------------------------------------------------------------------------------------------

/// One 8-element group of a grid block.
struct Group {
    /// The eight grid values (magnitudes; IQ1: -1, 0 or 1).
    values: [i8; 8],
    /// Bit `j`: element `j` negated.
    signs: u8,
    /// The 4-bit (IQ1: 3-bit) sub-scale of the group.
    sub_scale: u32,
    /// IQ1 only: the shift is -1/8 (else +1/8).
    minus_delta: bool,
}

fn entry8(e: u64) -> [i8; 8] {
    std::array::from_fn(|j| byte(e, j) as i8)
}

fn entry4x2(a: u32, b: u32) -> [i8; 8] {
    std::array::from_fn(|j| {
        let e = if j < 4 { a } else { b };
        (e >> (8 * (j % 4))) as u8 as i8
    })
}

/// The 32 groups of a block of a grid type, in element order.
fn groups(ty: QuantType, b: &[u8], mut f: impl FnMut(usize, Group)) {
    use QuantType::*;
    match ty {
        IQ2_XXS => {
            for ib in 0..8 {
                let o = 2 + 8 * ib;
                let aux = rd_u32(b, o + 4);
                for l in 0..4 {
                    f(
                        4 * ib + l,
                        Group {
                            values: entry8(IQ2XXS_GRID[b[o + l] as usize]),
                            signs: ksigns(((aux >> (7 * l)) & 127) as usize),
                            sub_scale: aux >> 28,
                            minus_delta: false,
                        },
                    );
                }
            }
        }
        IQ2_XS => {
            for g in 0..32 {
                let q = rd_u16(b, 2 + 2 * g);
                f(
                    g,
                    Group {
                        values: entry8(IQ2XS_GRID[(q & 511) as usize]),
                        signs: ksigns((q >> 9) as usize),
                        sub_scale: nibble(b[66 + g / 4], (g / 2) % 2 == 1),
                        minus_delta: false,
                    },
                );
            }
        }
        IQ2_S => {
            for g in 0..32 {
                let high = ((b[66 + g / 4] >> (2 * (g % 4))) & 3) as usize;
                f(
                    g,
                    Group {
                        values: entry8(IQ2S_GRID[b[2 + g] as usize | high << 8]),
                        signs: b[34 + g],
                        sub_scale: nibble(b[74 + g / 4], (g / 2) % 2 == 1),
                        minus_delta: false,
                    },
                );
            }
        }
        IQ3_XXS => {
            for ib in 0..8 {
                let aux = rd_u32(b, 66 + 4 * ib);
                for l in 0..4 {
                    let q = 2 + 8 * ib + 2 * l;
                    f(
                        4 * ib + l,
                        Group {
                            values: entry4x2(
                                IQ3XXS_GRID[b[q] as usize],
                                IQ3XXS_GRID[b[q + 1] as usize],
                            ),
                            signs: ksigns(((aux >> (7 * l)) & 127) as usize),
                            sub_scale: aux >> 28,
                            minus_delta: false,
                        },
                    );
                }
            }
        }
        IQ3_S => {
            let index =
                |i: usize| b[2 + i] as usize | (((b[66 + i / 8] >> (i % 8)) & 1) as usize) << 8;
            for g in 0..32 {
                f(
                    g,
                    Group {
                        values: entry4x2(IQ3S_GRID[index(2 * g)], IQ3S_GRID[index(2 * g + 1)]),
                        signs: b[74 + g],
                        sub_scale: nibble(b[106 + g / 8], (g / 4) % 2 == 1),
                        minus_delta: false,
                    },
                );
            }
        }
        IQ1_S => {
            for ib in 0..8 {
                let qh = rd_u16(b, 34 + 2 * ib);
                for l in 0..4 {
                    let high = ((qh >> (3 * l)) & 7) as usize;
                    f(
                        4 * ib + l,
                        Group {
                            values: entry8(IQ1S_GRID[b[2 + 4 * ib + l] as usize | high << 8]),
                            signs: 0,
                            sub_scale: u32::from((qh >> 12) & 7),
                            minus_delta: qh & 0x8000 != 0,
                        },
                    );
                }
            }
        }
        IQ1_M => {
            for g in 0..32 {
                let qh = (b[32 + g / 2] >> (4 * (g % 2))) & 0x0F;
                let s = g / 2; // 16-element scale index
                let sc = rd_u16(b, 48 + 2 * (s / 4));
                f(
                    g,
                    Group {
                        values: entry8(IQ1S_GRID[b[g] as usize | ((qh & 7) as usize) << 8]),
                        signs: 0,
                        sub_scale: u32::from((sc >> (3 * (s % 4))) & 7),
                        minus_delta: qh & 8 != 0,
                    },
                );
            }
        }
        _ => unreachable!("not a grid type"),
    }
}

/// IQ1_M's f16 scale, spread over the top nibbles of its four sub-scale words.
pub(crate) fn iq1_m_d(b: &[u8]) -> f32 {
    let sc = |k: usize| rd_u16(b, 48 + 2 * k);
    let bits = (sc(0) >> 12) | ((sc(1) >> 8) & 0x00F0) | ((sc(2) >> 4) & 0x0F00) | (sc(3) & 0xF000);
    f16_to_f32(bits)
}

/// The ternary value (0, 1 or 2; the element is that minus one) of element `k` of a TQ1_0
/// block: five trits a byte in base 3, stored as the fixed-point fraction `byte / 256`.
fn tq1_trit(b: &[u8], k: usize) -> i8 {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let (byte, n) = if k < 160 {
        (b[k % 32], k / 32)
    } else if k < 240 {
        (b[32 + (k - 160) % 16], (k - 160) / 16)
    } else {
        (b[48 + (k - 240) % 4], (k - 240) / 4)
    };
    let v = byte.wrapping_mul(POW3[n]);
    ((u16::from(v) * 3) >> 8) as i8
}

/// Element `k` of a TQ2_0 block, plus one (0, 1 or 2).
fn tq2_code(b: &[u8], k: usize) -> i8 {
    let (j, l, m) = (k / 128, (k % 128) / 32, k % 32);
    ((b[32 * j + m] >> (2 * l)) & 3) as i8
}

/// A ternary block's scale and its element decoder (the element plus one).
type TernaryCode = fn(&[u8], usize) -> i8;

fn ternary(ty: QuantType, b: &[u8]) -> (f32, TernaryCode) {
    if ty == QuantType::TQ1_0 {
        (rd_f16(b, 52), tq1_trit)
    } else {
        (rd_f16(b, 64), tq2_code)
    }
}

/// Dequantizes one block of a type of this module, bit-identical to gguf-py.
pub(crate) fn dequantize_block(ty: QuantType, b: &[u8], y: &mut [f32]) {
    use QuantType::*;
    match ty {
        TQ1_0 | TQ2_0 => {
            let (d, code) = ternary(ty, b);
            for (k, v) in y[..QK_K].iter_mut().enumerate() {
                *v = d * f32::from(code(b, k) - 1);
            }
        }
        IQ1_S | IQ1_M => {
            let d = if ty == IQ1_S {
                rd_f16(b, 0)
            } else {
                iq1_m_d(b)
            };
            groups(ty, b, |g, grp| {
                let dl = d * (2 * grp.sub_scale + 1) as f32;
                let delta = if grp.minus_delta { -0.125 } else { 0.125 };
                for j in 0..8 {
                    y[8 * g + j] = dl * (f32::from(grp.values[j]) + delta);
                }
            });
        }
        _ => {
            let d = rd_f16(b, 0);
            groups(ty, b, |g, grp| {
                let db = match ty {
                    IQ3_S => d * (1 + 2 * grp.sub_scale) as f32,
                    IQ3_XXS => d * (0.5 + grp.sub_scale as f32) * 0.5,
                    _ => d * (0.5 + grp.sub_scale as f32) * 0.25,
                };
                for j in 0..8 {
                    let v = db * f32::from(grp.values[j]);
                    y[8 * g + j] = if (grp.signs >> j) & 1 == 1 { -v } else { v };
                }
            });
        }
    }
}

/// A block in integer form: `element k = d · scales[k / 16] · w[k]`, exactly.
#[derive(Debug, Clone)]
pub struct IntBlock {
    pub w: [i8; QK_K],
    pub scales: [i16; QK_K / 16],
    pub d: f32,
}

impl Default for IntBlock {
    fn default() -> IntBlock {
        IntBlock {
            w: [0; QK_K],
            scales: [0; QK_K / 16],
            d: 0.0,
        }
    }
}

/// The integer form of one block of a type of this module (see the module docs).
pub fn unpack(ty: QuantType, b: &[u8], out: &mut IntBlock) {
    use QuantType::*;
    match ty {
        TQ1_0 | TQ2_0 => {
            let (d, code) = ternary(ty, b);
            for (k, w) in out.w.iter_mut().enumerate() {
                *w = code(b, k) - 1;
            }
            out.scales = [1; QK_K / 16];
            out.d = d;
        }
        IQ1_S | IQ1_M => {
            out.d = if ty == IQ1_S {
                rd_f16(b, 0)
            } else {
                iq1_m_d(b)
            } * 0.125;
            let (w, scales) = (&mut out.w, &mut out.scales);
            groups(ty, b, |g, grp| {
                let delta = if grp.minus_delta { -1 } else { 1 };
                for j in 0..8 {
                    w[8 * g + j] = 8 * grp.values[j] + delta;
                }
                scales[g / 2] = (2 * grp.sub_scale + 1) as i16;
            });
        }
        _ => {
            out.d = rd_f16(b, 0)
                * match ty {
                    IQ3_S => 1.0,
                    IQ3_XXS => 0.25,
                    _ => 0.125,
                };
            let (w, scales) = (&mut out.w, &mut out.scales);
            groups(ty, b, |g, grp| {
                for j in 0..8 {
                    let v = grp.values[j];
                    w[8 * g + j] = if (grp.signs >> j) & 1 == 1 { -v } else { v };
                }
                scales[g / 2] = (2 * grp.sub_scale + 1) as i16;
            });
        }
    }
}
