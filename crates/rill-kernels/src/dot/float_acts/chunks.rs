//! Each weight type's exact dequantization of one chunk of a row, as the float-activation tiles
//! of `float_acts.rs` read it: scalar for most types, AVX2 for Q4_K and Q6_K; the same values
//! as [`dequantize_row`](crate::dequantize_row).

use std::arch::x86_64::*;

use super::CHUNK;
use crate::dequant::scale_min_k4;
use crate::dot::blocks_q32::{idx, prefetch_ahead, DUP};
use crate::{dequantize_row, QuantType};

/// Where dequantized weights go, eight at a time.
pub(crate) trait Sink {
    /// Elements `k..k + 8` of the chunk are `v`.
    unsafe fn put(&mut self, k: usize, v: __m256);
}

/// Into a panel row.
pub(super) struct Store(pub(super) *mut f32);

impl Sink for Store {
    #[inline(always)]
    unsafe fn put(&mut self, k: usize, v: __m256) {
        _mm256_storeu_ps(self.0.add(k), v);
    }
}

/// Into a panel row with every element twice (`2k` and `2k + 1`), for the 512-bit tiles that
/// hold two tokens' lanes interleaved.
pub(super) struct StoreDup(pub(super) *mut f32);

impl Sink for StoreDup {
    #[inline(always)]
    unsafe fn put(&mut self, k: usize, v: __m256) {
        let dup = _mm512_permutexvar_ps(idx(DUP), _mm512_castps256_ps512(v));
        _mm512_storeu_ps(self.0.add(2 * k), dup);
    }
}

/// Straight into one token's accumulator (decoding: no panel round trip). The same FMA, in
/// the same order, as the panel tiles.
pub(super) struct Dot {
    x: *const f32,
    acc: __m256,
}

impl Sink for Dot {
    #[inline(always)]
    unsafe fn put(&mut self, k: usize, v: __m256) {
        self.acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(self.x.add(k)), self.acc);
    }
}

/// Exact dequantization of whole blocks into f32, as [`dequantize_row`] does.
pub(crate) trait ChunkDequant {
    const TY: QuantType;
    /// Dequantizes the `n` elements (whole blocks, `n ≤ CHUNK`) starting at `src` into `sink`,
    /// in increasing element order.
    unsafe fn chunk<S: Sink>(src: *const u8, n: usize, sink: &mut S);

    /// The accumulators of `R` rows (`ldw` bytes apart from `w`) against one token's f32
    /// activations `x` over `n` elements (whole blocks): exactly the FMA chains that
    /// [`chunk`](Self::chunk) into a [`Dot`] gives, row by row. Types with a SIMD dequantizer
    /// interleave the rows, so that `R` independent chains hide the FMA latency.
    #[inline(always)]
    unsafe fn dot_rows<const R: usize>(
        w: *const u8,
        ldw: usize,
        x: *const f32,
        n: usize,
    ) -> [__m256; R] {
        let (bs, bb) = (Self::TY.block_size(), Self::TY.block_bytes());
        let mut accs = [_mm256_setzero_ps(); R];
        for (r, acc) in accs.iter_mut().enumerate() {
            let mut sink = Dot { x, acc: *acc };
            let mut k = 0;
            while k < n {
                let kl = CHUNK.min(n - k);
                sink.x = x.add(k);
                let src = w.add(r * ldw + k / bs * bb);
                // Decode streams the matrix once: ask for the next call's rows now.
                prefetch_ahead(src, R * ldw, kl / bs * bb);
                Self::chunk(src, kl, &mut sink);
                k += kl;
            }
            *acc = sink.acc;
        }
        accs
    }
}

/// Any dequantizable type, through the scalar reference dequantizer.
macro_rules! scalar_dequant {
    ($($name:ident => $ty:ident;)*) => {$(
        pub(crate) struct $name;
        impl ChunkDequant for $name {
            const TY: QuantType = QuantType::$ty;
            #[inline(always)]
            unsafe fn chunk<S: Sink>(src: *const u8, n: usize, sink: &mut S) {
                let bytes = n / Self::TY.block_size() * Self::TY.block_bytes();
                let src = std::slice::from_raw_parts(src, bytes);
                let mut buf = [0.0f32; CHUNK];
                // Cannot fail: whole blocks of a dequantizable type, sizes derived above.
                let _ = dequantize_row(Self::TY, src, &mut buf[..n]);
                for k in (0..n).step_by(8) {
                    sink.put(k, _mm256_loadu_ps(buf.as_ptr().add(k)));
                }
            }
        }
    )*};
}

scalar_dequant! {
    DeqQ4_0 => Q4_0;
    DeqQ4_1 => Q4_1;
    DeqQ5_0 => Q5_0;
    DeqQ5_1 => Q5_1;
    DeqQ8_0 => Q8_0;
    DeqQ2K => Q2_K;
    DeqQ3K => Q3_K;
    DeqQ5K => Q5_K;
    DeqIq4Nl => IQ4_NL;
    DeqIq4Xs => IQ4_XS;
    DeqMxfp4 => MXFP4;
    DeqIq2Xxs => IQ2_XXS;
    DeqIq2Xs => IQ2_XS;
    DeqIq2S => IQ2_S;
    DeqIq3Xxs => IQ3_XXS;
    DeqIq3S => IQ3_S;
    DeqIq1S => IQ1_S;
    DeqIq1M => IQ1_M;
    DeqTq1 => TQ1_0;
    DeqTq2 => TQ2_0;
}

/// Float weights (F32, F16, BF16), eight elements at a time: every conversion to f32 is exact.
/// Their rows are taken in chunks of whole eights (the product's driver sends float rows here
/// only when their length is a multiple of 8).
macro_rules! float_dequant {
    ($($name:ident => $ty:ident, |$p:ident| $load:expr;)*) => {$(
        pub(crate) struct $name;
        impl ChunkDequant for $name {
            const TY: QuantType = QuantType::$ty;
            #[inline(always)]
            unsafe fn chunk<S: Sink>(src: *const u8, n: usize, sink: &mut S) {
                let width = Self::TY.block_bytes();
                for k in (0..n).step_by(8) {
                    let $p = src.add(k * width);
                    sink.put(k, $load);
                }
            }
        }
    )*};
}

float_dequant! {
    DeqF32 => F32, |p| _mm256_loadu_ps(p as *const f32);
    DeqF16 => F16, |p| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
    DeqBf16 => BF16, |p| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
        _mm_loadu_si128(p as *const __m128i),
    )));
}

/// The f16 at `p` widened (F16C; exact, like every f16 → f32 conversion).
#[inline(always)]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Eight consecutive i32 lanes as f32, times `s` (one f32 multiply, as the scalar code does).
#[inline(always)]
pub(super) unsafe fn scaled(q: __m256i, s: f32) -> __m256 {
    _mm256_mul_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(q))
}

/// Stores 32 signed bytes as f32: elements 0..16 times `s0`, 16..32 times `s1`.
#[inline(always)]
pub(super) unsafe fn put_i8x32<S: Sink>(q: __m256i, s0: f32, s1: f32, sink: &mut S, k0: usize) {
    // Widening straight from memory (`vpmovsxbd ymm, m64`) spares the shuffle port the
    // extracts and unpacks that register sources need.
    let mut buf = std::mem::MaybeUninit::<[u8; 32]>::uninit();
    let b = buf.as_mut_ptr() as *mut u8;
    _mm256_storeu_si256(b as *mut __m256i, q);
    for k in 0..4 {
        let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(8 * k) as *const __m128i));
        sink.put(k0 + 8 * k, scaled(v, if k < 2 { s0 } else { s1 }));
    }
}

/// Q6_K (210-byte super-blocks of 256): `y = (d · scale) · (q - 32)`.
pub(crate) struct DeqQ6K;

impl ChunkDequant for DeqQ6K {
    const TY: QuantType = QuantType::Q6_K;
    #[inline(always)]
    unsafe fn chunk<S: Sink>(src: *const u8, n: usize, sink: &mut S) {
        for b in 0..n / 256 {
            let blk = src.add(b * 210);
            let d = f16_at(blk.add(208));
            for half in 0..2 {
                let sc = blk.add(192 + 8 * half) as *const i8;
                let y = 256 * b + 128 * half;
                for (m, qm) in q6k_codes(blk, half).into_iter().enumerate() {
                    let s0 = d * *sc.add(2 * m) as f32;
                    let s1 = d * *sc.add(2 * m + 1) as f32;
                    put_i8x32(qm, s0, s1, sink, y + 32 * m);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn dot_rows<const R: usize>(
        w: *const u8,
        ldw: usize,
        x: *const f32,
        n: usize,
    ) -> [__m256; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        // Per row and super-block: the 256 codes minus 32 as bytes, and the 16 scales `d · sc`.
        let mut codes = [Codes([0; 256]); R];
        let mut scales = [Scales16([0.0; 16]); R];
        for b in 0..n / 256 {
            for r in 0..R {
                let blk = w.add(r * ldw + b * 210);
                prefetch_ahead(blk, R * ldw, 210);
                let d = _mm256_set1_ps(f16_at(blk.add(208)));
                let sc = _mm_loadu_si128(blk.add(192) as *const __m128i);
                let s = scales[r].0.as_mut_ptr();
                _mm256_store_ps(
                    s,
                    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))),
                );
                let sc_hi = _mm_unpackhi_epi64(sc, sc);
                let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc_hi));
                _mm256_store_ps(s.add(8), _mm256_mul_ps(d, f));
                let dst = codes[r].0.as_mut_ptr();
                for half in 0..2 {
                    for (m, q) in q6k_codes(blk, half).into_iter().enumerate() {
                        let at = dst.add(128 * half + 32 * m) as *mut __m256i;
                        _mm256_store_si256(at, q);
                    }
                }
            }
            // Read the codes back through an opaque pointer, so that the widening loads come
            // from memory (`vpmovsxbd ymm, m64`) rather than from shuffles of registers.
            let codes_p: *const Codes = std::hint::black_box(codes.as_ptr());
            let scales_p: *const Scales16 = std::hint::black_box(scales.as_ptr());
            let xb = x.add(256 * b);
            for g in 0..32 {
                let xv = _mm256_loadu_ps(xb.add(8 * g));
                // Element 8g's scale: sub-blocks of 16 elements.
                let si = g / 2;
                for (r, a) in acc.iter_mut().enumerate() {
                    let c = (*codes_p.add(r)).0.as_ptr().add(8 * g);
                    let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(c as *const __m128i));
                    let s = _mm256_broadcast_ss(&(*scales_p.add(r)).0[si]);
                    *a = _mm256_fmadd_ps(_mm256_mul_ps(s, _mm256_cvtepi32_ps(v)), xv, *a);
                }
            }
        }
        acc
    }
}

/// 256 signed bytes, aligned for vector stores.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(super) struct Codes([i8; 256]);

/// 16 f32 scales, aligned for vector stores.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(super) struct Scales16([f32; 16]);

/// The 4 × 32 six-bit codes of half `half` of the Q6_K super-block at `blk`, minus 32, in
/// element order (elements `128 · half + 32 · m ..` in vector `m`).
#[inline(always)]
pub(super) unsafe fn q6k_codes(blk: *const u8, half: usize) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0F);
    let ql = blk.add(64 * half);
    let qh = _mm256_loadu_si256(blk.add(128 + 32 * half) as *const __m256i);
    let la = _mm256_loadu_si256(ql as *const __m256i);
    let lb = _mm256_loadu_si256(ql.add(32) as *const __m256i);
    let h1 = _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)), 4);
    let h2 = _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)), 2);
    let h3 = _mm256_and_si256(qh, _mm256_set1_epi8(0x30));
    let hm = _mm256_set1_epi8(0xC0u8 as i8);
    let h4 = _mm256_srli_epi16(_mm256_and_si256(qh, hm), 2);
    let off = _mm256_set1_epi8(32);
    [
        _mm256_or_si256(_mm256_and_si256(la, m4), h1),
        _mm256_or_si256(_mm256_and_si256(lb, m4), h2),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), m4), h3),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), m4), h4),
    ]
    .map(|q| _mm256_sub_epi8(q, off))
}

/// Q4_K (144-byte super-blocks of 256): `y = (d · scale) · q - dmin · min`.
pub(crate) struct DeqQ4K;

impl ChunkDequant for DeqQ4K {
    const TY: QuantType = QuantType::Q4_K;
    #[inline(always)]
    unsafe fn chunk<S: Sink>(src: *const u8, n: usize, sink: &mut S) {
        let m4 = _mm256_set1_epi8(0x0F);
        for b in 0..n / 256 {
            for j in 0..4 {
                {
                    let blk = src.add(b * 144);
                    let d = f16_at(blk);
                    let dmin = f16_at(blk.add(2));
                    let scales = std::slice::from_raw_parts(blk.add(4), 12);
                    let (s1, m1) = scale_min_k4(2 * j, scales);
                    let (s2, m2) = scale_min_k4(2 * j + 1, scales);
                    let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
                    let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
                    let q = _mm256_loadu_si256(blk.add(16 + 32 * j) as *const __m256i);
                    let y = 256 * b + 64 * j;
                    for (part, (dl, ml)) in [(d1, m1), (d2, m2)].into_iter().enumerate() {
                        let nib = if part == 0 {
                            _mm256_and_si256(q, m4)
                        } else {
                            _mm256_and_si256(_mm256_srli_epi16(q, 4), m4)
                        };
                        // Widening from memory spares the shuffle port (see `put_i8x32`).
                        let mut buf = std::mem::MaybeUninit::<[u8; 32]>::uninit();
                        let bp = buf.as_mut_ptr() as *mut u8;
                        _mm256_storeu_si256(bp as *mut __m256i, nib);
                        let (vd, vm) = (_mm256_set1_ps(dl), _mm256_set1_ps(ml));
                        for k in 0..4 {
                            let v = _mm_loadl_epi64(bp.add(8 * k) as *const __m128i);
                            let f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                            // Multiply, then subtract: two roundings, as the scalar dequantizer.
                            let val = _mm256_sub_ps(_mm256_mul_ps(vd, f), vm);
                            sink.put(y + 32 * part + 8 * k, val);
                        }
                    }
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn dot_rows<const R: usize>(
        w: *const u8,
        ldw: usize,
        x: *const f32,
        n: usize,
    ) -> [__m256; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        // Per row and super-block: the 8 sub-block scales `d · sc` then the 8 mins `dmin · m`.
        let mut scales = [Scales16([0.0; 16]); R];
        let low = _mm256_set1_epi32(0x0F);
        for b in 0..n / 256 {
            for (r, s) in scales.iter_mut().enumerate() {
                let blk = w.add(r * ldw + b * 144);
                prefetch_ahead(blk, R * ldw, 144);
                let (sc, mn) = q4k_scales_mins(blk.add(4));
                let d = _mm256_set1_ps(f16_at(blk));
                let dmin = _mm256_set1_ps(f16_at(blk.add(2)));
                _mm256_store_ps(s.0.as_mut_ptr(), _mm256_mul_ps(d, sc));
                _mm256_store_ps(s.0.as_mut_ptr().add(8), _mm256_mul_ps(dmin, mn));
            }
            let scales_p: *const Scales16 = std::hint::black_box(scales.as_ptr());
            let xb = x.add(256 * b);
            // Sub-block `sb` (32 elements) is the low (even) or high (odd) nibbles of the 32
            // bytes at 16 + 32 · (sb / 2); each group of 8 elements is widened from memory.
            for j in 0..4 {
                // The 32 bytes of sub-blocks 2j (low nibbles) and 2j + 1 (high), widened once.
                let bytes: [[__m256i; R]; 4] = std::array::from_fn(|g| {
                    std::array::from_fn(|r| {
                        let q = w.add(r * ldw + b * 144 + 16 + 32 * j + 8 * g);
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(q as *const __m128i))
                    })
                });
                for half in 0..2 {
                    let sb = 2 * j + half;
                    for (g, rows) in bytes.iter().enumerate() {
                        let xv = _mm256_loadu_ps(xb.add(32 * sb + 8 * g));
                        for (r, (a, &v)) in acc.iter_mut().zip(rows).enumerate() {
                            let v = if half == 0 {
                                _mm256_and_si256(v, low)
                            } else {
                                _mm256_srli_epi32(v, 4)
                            };
                            let s = &(*scales_p.add(r)).0;
                            let (vd, vm) =
                                (_mm256_broadcast_ss(&s[sb]), _mm256_broadcast_ss(&s[8 + sb]));
                            // Multiply, then subtract: two roundings, as the scalar dequantizer.
                            let val = _mm256_sub_ps(_mm256_mul_ps(vd, _mm256_cvtepi32_ps(v)), vm);
                            *a = _mm256_fmadd_ps(val, xv, *a);
                        }
                    }
                }
            }
        }
        acc
    }
}

/// The 8 six-bit scales and 8 six-bit mins packed in a Q4_K super-block's 12 bytes at `p`
/// (see [`scale_min_k4`]), as f32 lanes.
#[inline(always)]
pub(super) unsafe fn q4k_scales_mins(p: *const u8) -> (__m256, __m256) {
    let word = |k: usize| (p.add(4 * k) as *const u32).read_unaligned();
    let (a, b, c) = (word(0), word(1), word(2));
    // Bytewise: scales 0..4 = a & 63, mins 0..4 = b & 63; scales 4..8 = low nibbles of c with
    // a's top two bits above them, mins 4..8 = high nibbles of c with b's top two bits.
    let sc =
        (a & 0x3F3F_3F3F) as u64 | (((c & 0x0F0F_0F0F) | ((a >> 2) & 0x3030_3030)) as u64) << 32;
    let mn = (b & 0x3F3F_3F3F) as u64
        | ((((c >> 4) & 0x0F0F_0F0F) | ((b >> 2) & 0x3030_3030)) as u64) << 32;
    let widen = |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
    (widen(sc), widen(mn))
}

/// Dequantizes a whole row of `ty` with this module's dequantizer (SIMD for Q4_K and Q6_K):
/// for tests comparing it bit for bit with [`dequantize_row`].
///
/// # Safety
/// Requires AVX2, FMA and F16C; `src` holds `ty.row_bytes(dst.len())` bytes of whole blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dequantize_row_simd(ty: QuantType, src: &[u8], dst: &mut [f32]) -> bool {
    match ty {
        QuantType::Q4_K => deq_row::<DeqQ4K>(src, dst),
        QuantType::Q6_K => deq_row::<DeqQ6K>(src, dst),
        _ => return false,
    }
    true
}

#[inline(always)]
pub(super) unsafe fn deq_row<D: ChunkDequant>(src: &[u8], dst: &mut [f32]) {
    let (bs, bb) = (D::TY.block_size(), D::TY.block_bytes());
    let mut k = 0;
    while k < dst.len() {
        let kl = CHUNK.min(dst.len() - k);
        let mut sink = Store(dst.as_mut_ptr().add(k));
        D::chunk(src.as_ptr().add(k / bs * bb), kl, &mut sink);
        k += kl;
    }
}
