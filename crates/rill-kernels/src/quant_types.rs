//! Tensor element types and their block layouts, identical to ggml's (`ggml-common.h`).
//!
//! All multi-byte fields are little-endian. Layouts (bytes per block / elements per block):
//!
//! | type | layout | bytes | elems |
//! |---|---|---|---|
//! | Q4_0 | `d: f16, qs: [u8; 16]` (low nibbles = elements 0..16, high = 16..32) | 18 | 32 |
//! | Q4_1 | `d: f16, m: f16, qs: [u8; 16]` | 20 | 32 |
//! | Q5_0 | `d: f16, qh: [u8; 4], qs: [u8; 16]` (bit j of qh = 5th bit of element j) | 22 | 32 |
//! | Q5_1 | `d: f16, m: f16, qh: [u8; 4], qs: [u8; 16]` | 24 | 32 |
//! | Q8_0 | `d: f16, qs: [i8; 32]` | 34 | 32 |
//! | Q8_1 | `d: f16, s: f16 (= d * sum(qs)), qs: [i8; 32]` | 36 | 32 |
//! | Q2_K | `scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16` | 84 | 256 |
//! | Q3_K | `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d: f16` | 110 | 256 |
//! | Q4_K | `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]` | 144 | 256 |
//! | Q5_K | `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]` | 176 | 256 |
//! | Q6_K | `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16` | 210 | 256 |
//! | Q8_K | `d: f32, qs: [i8; 256], bsums: [i16; 16]` | 292 | 256 |
//! | IQ4_NL | `d: f16, qs: [u8; 16]` (nibble indices into 16 levels) | 18 | 32 |
//! | IQ4_XS | `d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]` | 136 | 256 |
//! | MXFP4 | `e: u8 (E8M0), qs: [u8; 16]` (E2M1 nibbles) | 17 | 32 |
//! | IQ2_XXS | `d: f16, qs: [u32; 16]` (per 32: four grid bytes, then 4×7 sign bits and a 4-bit scale) | 66 | 256 |
//! | IQ2_XS | `d: f16, qs: [u16; 32] (9-bit index, 7-bit signs), scales: [u8; 8]` | 74 | 256 |
//! | IQ2_S | `d: f16, qs: [u8; 32], signs: [u8; 32], qh: [u8; 8], scales: [u8; 8]` | 82 | 256 |
//! | IQ3_XXS | `d: f16, qs: [u8; 64], scales_signs: [u32; 8]` | 98 | 256 |
//! | IQ3_S | `d: f16, qs: [u8; 64], qh: [u8; 8], signs: [u8; 32], scales: [u8; 4]` | 110 | 256 |
//! | IQ1_S | `d: f16, qs: [u8; 32], qh: [u16; 8]` | 50 | 256 |
//! | IQ1_M | `qs: [u8; 32], qh: [u8; 16], scales: [u16; 4]` (f16 scale in the top nibbles) | 56 | 256 |
//! | TQ1_0 | `qs: [u8; 48] (5 trits a byte), qh: [u8; 4] (4 a byte), d: f16` | 54 | 256 |
//! | TQ2_0 | `qs: [u8; 64] (4 two-bit values a byte), d: f16` | 66 | 256 |
//!
//! The i-quants' grids are in `iq_grids.rs`; their element order is in `grid_quants.rs`.

/// Elements per block of Q4_0.
pub const QK4_0: usize = 32;
/// Elements per block of Q4_1.
pub const QK4_1: usize = 32;
/// Elements per block of Q5_0.
pub const QK5_0: usize = 32;
/// Elements per block of Q5_1.
pub const QK5_1: usize = 32;
/// Elements per block of Q8_0.
pub const QK8_0: usize = 32;
/// Elements per block of Q8_1.
pub const QK8_1: usize = 32;
/// Elements per super-block of the K-quants.
pub const QK_K: usize = 256;

/// Byte offsets inside a Q8_K block (`d: f32, qs: [i8; 256], bsums: [i16; 16]`).
pub struct BlockQ8K;
impl BlockQ8K {
    /// Offset of the f32 scale.
    pub const D: usize = 0;
    /// Offset of the 256 quants.
    pub const QS: usize = 4;
    /// Offset of the 16 i16 sums of groups of 16 quants.
    pub const BSUMS: usize = 4 + QK_K;
    /// Block size in bytes.
    pub const BYTES: usize = 4 + QK_K + 2 * (QK_K / 16);
}

/// Element type of a tensor row, with ggml's numbering and block layout.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    /// 4-bit non-linear: 32 elements, an f16 scale and 16 bytes of indices into a fixed table.
    IQ4_NL,
    /// IQ4_NL's table in 256-element super-blocks with 6-bit scales per 32.
    IQ4_XS,
    /// OCP microscaling FP4 (gpt-oss's experts): 32 E2M1 values and one E8M0 exponent.
    MXFP4,
    /// 2.06 bits: per 32, four 8-element entries of a 256-entry grid, 7-bit signs, 4-bit scale.
    IQ2_XXS,
    /// 2.31 bits: 9-bit indices into a 512-entry grid with 7-bit signs, 4-bit scales per 16.
    IQ2_XS,
    /// 2.5 bits: 10-bit indices into a 1024-entry grid, explicit sign bits, 4-bit scales per 16.
    IQ2_S,
    /// 3.06 bits: 4-element entries of a 256-entry grid, 7-bit signs, 4-bit scale per 32.
    IQ3_XXS,
    /// 3.44 bits: 9-bit indices into a 512-entry grid, explicit signs, 4-bit scales per 32.
    IQ3_S,
    /// 1.56 bits: 11-bit indices into a ternary 2048-entry grid, 3-bit scale and a ±1/8 shift per 32.
    IQ1_S,
    /// 1.75 bits: IQ1_S's grid with 3-bit scales per 16 and shifts per 8; the f16 scale is spread
    /// over the top nibbles of the sub-scales.
    IQ1_M,
    /// Ternary (-1, 0, 1), five per byte in base 3, one f16 scale per 256.
    TQ1_0,
    /// Ternary (-1, 0, 1), four per byte in two bits, one f16 scale per 256.
    TQ2_0,
}

impl QuantType {
    /// All supported types.
    pub const ALL: [QuantType; 27] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::BF16,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q8_1,
        QuantType::Q2_K,
        QuantType::Q3_K,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
        QuantType::Q8_K,
        QuantType::IQ4_NL,
        QuantType::IQ4_XS,
        QuantType::MXFP4,
        QuantType::IQ2_XXS,
        QuantType::IQ2_XS,
        QuantType::IQ2_S,
        QuantType::IQ3_XXS,
        QuantType::IQ3_S,
        QuantType::IQ1_S,
        QuantType::IQ1_M,
        QuantType::TQ1_0,
        QuantType::TQ2_0,
    ];

    /// Elements per block (1 for the float types).
    pub const fn block_size(self) -> usize {
        use QuantType::*;
        match self {
            F32 | F16 | BF16 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ4_XS => QK_K,
            IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | TQ1_0 | TQ2_0 => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        use QuantType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => BlockQ8K::BYTES,
            IQ4_NL => 18,
            IQ4_XS => 136,
            MXFP4 => 17,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ2_S => 82,
            IQ3_XXS => 98,
            IQ3_S => 110,
            IQ1_S => 50,
            IQ1_M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
        }
    }

    /// Bytes needed for `n_elements` elements, or `None` when `n_elements` is not a whole number
    /// of blocks or the size overflows.
    pub fn row_bytes(self, n_elements: usize) -> Option<usize> {
        let bs = self.block_size();
        if (n_elements / bs) * bs != n_elements {
            return None;
        }
        (n_elements / bs).checked_mul(self.block_bytes())
    }

    /// Like [`row_bytes`](Self::row_bytes) but with a typed error.
    pub fn row_bytes_checked(self, n_elements: usize) -> Result<usize, crate::KernelError> {
        let bs = self.block_size();
        if (n_elements / bs) * bs != n_elements {
            return Err(crate::KernelError::NotBlockMultiple {
                ty: self,
                n: n_elements,
                block: bs,
            });
        }
        (n_elements / bs)
            .checked_mul(self.block_bytes())
            .ok_or(crate::KernelError::Overflow)
    }

    /// Maps ggml's `enum ggml_type` value to a type, `None` for types rill does not handle.
    pub const fn from_ggml_id(id: u32) -> Option<QuantType> {
        use QuantType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            29 => IQ1_M,
            34 => TQ1_0,
            35 => TQ2_0,
            30 => BF16,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// ggml's `enum ggml_type` value.
    pub const fn ggml_id(self) -> u32 {
        use QuantType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ4_NL => 20,
            IQ4_XS => 23,
            BF16 => 30,
            MXFP4 => 39,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ1_M => 29,
            TQ1_0 => 34,
            TQ2_0 => 35,
        }
    }

    /// ggml's name for the type (`"Q4_K"`, `"F16"`, ...).
    pub const fn name(self) -> &'static str {
        use QuantType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            BF16 => "BF16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ4_NL => "IQ4_NL",
            IQ4_XS => "IQ4_XS",
            MXFP4 => "MXFP4",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ2_S => "IQ2_S",
            IQ3_XXS => "IQ3_XXS",
            IQ3_S => "IQ3_S",
            IQ1_S => "IQ1_S",
            IQ1_M => "IQ1_M",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
        }
    }

    /// Parses ggml's name (case-insensitive).
    pub fn from_name(s: &str) -> Option<QuantType> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }

    /// The activation format [`vec_dot`](crate::vec_dot) expects for weights of this type, as
    /// llama.cpp pairs them: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, Q8_K for the K-quants
    /// and F32 for the float types. `None` for the activation-only types Q8_1 and Q8_K.
    pub const fn vec_dot_type(self) -> Option<QuantType> {
        use QuantType::*;
        match self {
            F32 | F16 | BF16 => Some(F32),
            Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Some(Q8_0),
            Q4_1 | Q5_1 => Some(Q8_1),
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS => Some(Q8_K),
            IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | TQ1_0 | TQ2_0 => {
                Some(Q8_K)
            }
            Q8_1 | Q8_K => None,
        }
    }

    /// True for the block-quantized (non-float) types.
    pub const fn is_quantized(self) -> bool {
        !matches!(self, QuantType::F32 | QuantType::F16 | QuantType::BF16)
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
