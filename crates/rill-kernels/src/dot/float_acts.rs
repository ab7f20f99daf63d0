//! Float-activation tiles: weight rows dequantized exactly to f32 (a panel of [`PANEL_ROWS`]
//! rows, [`CHUNK`] elements at a time) and multiplied with **unquantized** f32 activations. For
//! products whose inputs have outliers that 8-bit blocks resolve poorly (Gemma's GeGLU output
//! going into `ffn_down`), this is both more accurate and cheaper than two-level 8-bit
//! activations: the dequantization is paid once per panel and shared by every token, and the
//! inner loop is one FMA per 8 products.
//!
//! # Canonical arithmetic (what makes the results batch invariant)
//!
//! Every (row, token) value is `hsum(acc)`, where lane `l` of the 8-lane accumulator is the
//! fused multiply-add chain `acc = fma(w[k], x[k], acc)` over the elements `k ≡ l (mod 8)` in
//! increasing `k`, `w` being exactly what [`dequantize_row`](crate::dequantize_row) produces, and
//! `hsum` the fixed tree of [`hsum_ps`]. The tile shape, the chunking (accumulators are stored
//! and reloaded unchanged between chunks), the batch size and the thread split never change a
//! bit. [`crate::dot::twins::deq_bitexact`] reproduces it in portable code.
//!
//! Where the CPU has AVX512-F (and [`crate::wide_tiles`] is on), three tokens or more go in
//! pairs through 512-bit registers ([`gemm_wide`]): each register holds a pair's two
//! accumulators with their lanes interleaved, against a panel stored with every element twice,
//! so every lane runs the same chain.
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA and F16C, and pointers valid for the rows,
//! activations and outputs they are told to touch.

use crate::dot::GemmCall;
use std::arch::x86_64::*;

use super::blocks_q32::{hsum4_paired, hsum_ps, idx, prefetch_ahead, DUP, PAIR};
use crate::dequant::scale_min_k4;
use crate::{dequantize_row, QuantType};

/// Elements dequantized per panel row at a time: one K-quant super-block, eight 32-blocks.
pub(crate) const CHUNK: usize = 256;
/// Weight rows per panel: eight independent accumulator chains when decoding one token.
pub(crate) const PANEL_ROWS: usize = 8;
/// Rows interleaved when decoding one token: independent FMA chains in flight.
const DECODE_ROWS: usize = 2;
/// Tokens per call the accumulator buffer is first sized for (the drivers' token block).
const START_TOKENS: usize = 64;

/// Where dequantized weights go, eight at a time.
pub(crate) trait Sink {
    /// Elements `k..k + 8` of the chunk are `v`.
    unsafe fn put(&mut self, k: usize, v: __m256);
}

/// Into a panel row.
struct Store(*mut f32);

impl Sink for Store {
    #[inline(always)]
    unsafe fn put(&mut self, k: usize, v: __m256) {
        _mm256_storeu_ps(self.0.add(k), v);
    }
}

/// Into a panel row with every element twice (`2k` and `2k + 1`), for the 512-bit tiles that
/// hold two tokens' lanes interleaved.
struct StoreDup(*mut f32);

impl Sink for StoreDup {
    #[inline(always)]
    unsafe fn put(&mut self, k: usize, v: __m256) {
        let dup = _mm512_permutexvar_ps(idx(DUP), _mm512_castps256_ps512(v));
        _mm512_storeu_ps(self.0.add(2 * k), dup);
    }
}

/// Straight into one token's accumulator (decoding: no panel round trip). The same FMA, in
/// the same order, as the panel tiles.
struct Dot {
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

/// The f16 at `p` widened (F16C; exact, like every f16 → f32 conversion).
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Eight consecutive i32 lanes as f32, times `s` (one f32 multiply, as the scalar code does).
#[inline(always)]
unsafe fn scaled(q: __m256i, s: f32) -> __m256 {
    _mm256_mul_ps(_mm256_set1_ps(s), _mm256_cvtepi32_ps(q))
}

/// Stores 32 signed bytes as f32: elements 0..16 times `s0`, 16..32 times `s1`.
#[inline(always)]
unsafe fn put_i8x32<S: Sink>(q: __m256i, s0: f32, s1: f32, sink: &mut S, k0: usize) {
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
struct Codes([i8; 256]);

/// 16 f32 scales, aligned for vector stores.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
struct Scales16([f32; 16]);

/// The 4 × 32 six-bit codes of half `half` of the Q6_K super-block at `blk`, minus 32, in
/// element order (elements `128 · half + 32 · m ..` in vector `m`).
#[inline(always)]
unsafe fn q6k_codes(blk: *const u8, half: usize) -> [__m256i; 4] {
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
unsafe fn q4k_scales_mins(p: *const u8) -> (__m256, __m256) {
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

/// `acc[c][r] += panel row r · x row c` over `kl` elements (a multiple of 8), the R × C tile's
/// accumulators loaded from and stored back to `accs` (token `c`'s at `accs + c * PANEL_ROWS`),
/// or started from zero when `first`.
#[inline(always)]
unsafe fn micro<const R: usize, const C: usize>(
    panel: *const f32,
    x: *const f32,
    ldx: usize,
    kl: usize,
    accs: *mut __m256,
    first: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    if !first {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            for (c, a) in acc_r.iter_mut().enumerate() {
                *a = *accs.add(c * PANEL_ROWS + r);
            }
        }
    }
    let mut k = 0;
    while k < kl {
        let mut xv = [_mm256_setzero_ps(); C];
        for (c, v) in xv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(x.add(c * ldx + k));
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let w = _mm256_loadu_ps(panel.add(r * CHUNK + k));
            for (c, a) in acc_r.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(w, xv[c], *a);
            }
        }
        k += 8;
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (c, a) in acc_r.iter().enumerate() {
            *accs.add(c * PANEL_ROWS + r) = *a;
        }
    }
}

/// Tokens per 512-bit float tile: two pairs.
const WIDE_PAIRS: usize = 2;

/// The 512-bit twin of [`micro`]: `R` rows of a duplicated panel ([`StoreDup`]) against `P`
/// token pairs (`xs[p]`: a pair's activations for this chunk, interleaved by [`pair_tokens`]),
/// each register holding a pair's two 8-lane accumulators interleaved. Every lane takes exactly
/// the FMA chain of [`micro`]. Pair `p`'s row `r` accumulator lives at
/// `accs + p * PANEL_ROWS + r`.
#[inline(always)]
unsafe fn micro_wide<const R: usize, const P: usize>(
    panel: *const f32,
    xs: &[*const f32; P],
    kl: usize,
    accs: *mut __m512,
    first: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    if !first {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            for (p, a) in acc_r.iter_mut().enumerate() {
                *a = *accs.add(p * PANEL_ROWS + r);
            }
        }
    }
    let mut k = 0;
    while k < kl {
        let mut xv = [_mm512_setzero_ps(); P];
        for (p, v) in xv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(xs[p].add(2 * k));
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let w = _mm512_loadu_ps(panel.add(2 * (r * CHUNK + k)));
            for (p, a) in acc_r.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(w, xv[p], *a);
            }
        }
        k += 8;
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (p, a) in acc_r.iter().enumerate() {
            *accs.add(p * PANEL_ROWS + r) = *a;
        }
    }
}

/// Lays out `nt` tokens' f32 activations (rows `ldx` floats apart, `n` elements) for
/// [`micro_wide`]: chunk `c` of pair `p` is `2 * CHUNK` floats at `((c * pairs) + p) * 2 *
/// CHUNK`, the two tokens' elements interleaved (a lone last token pairs with itself). The
/// tiles then read one sequential stream per pair.
#[inline(always)]
unsafe fn pair_tokens(x: *const f32, ldx: usize, n: usize, nt: usize, dst: *mut f32) {
    let pair = idx(PAIR);
    let pairs = nt.div_ceil(2);
    for p in 0..pairs {
        let x0 = x.add(2 * p * ldx);
        let x1 = x.add((2 * p + 1).min(nt - 1) * ldx);
        let mut k = 0;
        while k < n {
            let v = _mm512_permutex2var_ps(
                _mm512_castps256_ps512(_mm256_loadu_ps(x0.add(k))),
                pair,
                _mm512_castps256_ps512(_mm256_loadu_ps(x1.add(k))),
            );
            let at = ((k / CHUNK) * pairs + p) * 2 * CHUNK + 2 * (k % CHUNK);
            _mm512_storeu_ps(dst.add(at), v);
            k += 8;
        }
    }
}

/// One chunk of a duplicated panel of `rq` rows against `pairs` token pairs laid out by
/// [`pair_tokens`] (`xc`: this chunk's first pair), pair `p`'s accumulators at
/// `accs + p * PANEL_ROWS`.
#[inline(always)]
unsafe fn panel_pairs(
    panel: *const f32,
    rq: usize,
    xc: *const f32,
    pairs: usize,
    kl: usize,
    accs: *mut __m512,
    first: bool,
) {
    let mut p = 0;
    while p < pairs {
        let (a, x) = (accs.add(p * PANEL_ROWS), xc.add(p * 2 * CHUNK));
        if pairs - p >= WIDE_PAIRS {
            let mut xs = [x; WIDE_PAIRS];
            for (i, xp) in xs.iter_mut().enumerate() {
                *xp = x.add(i * 2 * CHUNK);
            }
            rows_wide(panel, rq, &xs, kl, a, first);
            p += WIDE_PAIRS;
        } else {
            rows_wide(panel, rq, &[x], kl, a, first);
            p += 1;
        }
    }
}

/// [`micro_wide`] over the `rq` rows of a panel: eight, four or one at a time.
#[inline(always)]
unsafe fn rows_wide<const P: usize>(
    panel: *const f32,
    rq: usize,
    xs: &[*const f32; P],
    kl: usize,
    accs: *mut __m512,
    first: bool,
) {
    if rq == PANEL_ROWS {
        return micro_wide::<PANEL_ROWS, P>(panel, xs, kl, accs, first);
    }
    let mut r = 0;
    while r < rq {
        let (pr, ar) = (panel.add(2 * r * CHUNK), accs.add(r));
        if rq - r >= 4 {
            micro_wide::<4, P>(pr, xs, kl, ar, first);
            r += 4;
        } else {
            micro_wide::<1, P>(pr, xs, kl, ar, first);
            r += 1;
        }
    }
}

/// One chunk of a panel of `rq` rows against `nt` tokens (token `t`'s activations at
/// `x + t * ldx`, its accumulators at `accs + t * PANEL_ROWS`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn panel_tokens(
    panel: *const f32,
    rq: usize,
    x: *const f32,
    ldx: usize,
    nt: usize,
    kl: usize,
    accs: *mut __m256,
    first: bool,
) {
    if rq == PANEL_ROWS && nt < 3 {
        // Two tokens (one goes through `decode`): all eight rows per token, eight independent
        // accumulator chains.
        for t in 0..nt {
            let (xt, at) = (x.add(t * ldx), accs.add(t * PANEL_ROWS));
            micro::<PANEL_ROWS, 1>(panel, xt, ldx, kl, at, first);
        }
        return;
    }
    let mut r = 0;
    while r < rq {
        let quad = rq - r >= 4;
        let (p, a) = (panel.add(r * CHUNK), accs.add(r));
        let mut t = 0;
        while quad && t + 3 <= nt {
            micro::<4, 3>(p, x.add(t * ldx), ldx, kl, a.add(t * PANEL_ROWS), first);
            t += 3;
        }
        while t < nt {
            let (xt, at) = (x.add(t * ldx), a.add(t * PANEL_ROWS));
            if quad {
                micro::<4, 1>(p, xt, ldx, kl, at, first);
            } else {
                micro::<1, 1>(p, xt, ldx, kl, at, first);
            }
            t += 1;
        }
        r += if quad { 4 } else { 1 };
    }
}

thread_local! {
    /// Per-thread dequantized panel and accumulators for [`gemm`], kept for reuse.
    static BUFS: std::cell::RefCell<(Vec<f32>, Vec<__m256>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    /// Per-thread paired accumulators and paired activations of the 512-bit tiles.
    static WIDE_BUFS: std::cell::RefCell<(Vec<__m512>, Vec<__m512>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Allocates this thread's buffers at their starting size (see `matmul::prepare_thread`).
pub(crate) fn prepare_thread() {
    BUFS.with(|cell| {
        let mut bufs = cell.borrow_mut();
        bufs.0.resize(PANEL_ROWS * CHUNK, 0.0);
        if bufs.1.len() < START_TOKENS * PANEL_ROWS {
            // All-zero bits are a valid __m256; `zeroed` needs no AVX instruction, so this runs
            // on any x86-64 CPU (every pool thread prepares, whatever the kernels in use).
            let zero = unsafe { std::mem::zeroed::<__m256>() };
            bufs.1.resize(START_TOKENS * PANEL_ROWS, zero);
        }
    });
    if crate::cpu::has_vnni() {
        WIDE_BUFS.with(|cell| {
            let accs = &mut cell.borrow_mut().0;
            if accs.len() < START_TOKENS / 2 * PANEL_ROWS {
                // As above: all-zero bits, no AVX-512 instruction needed.
                let zero = unsafe { std::mem::zeroed::<__m512>() };
                accs.resize(START_TOKENS / 2 * PANEL_ROWS, zero);
            }
        });
    }
}

/// `out[t * ldo + r] = dot(dequantized w row r, x row t)` for `r < nr`, `t < nt`, rows `ldw`
/// bytes apart and f32 activation rows `lda` bytes apart, over `n` elements (whole blocks).
#[inline(always)]
unsafe fn gemm<D: ChunkDequant, const WIDE: bool>(c: &GemmCall) {
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
    let (bs, bb) = (D::TY.block_size(), D::TY.block_bytes());
    let (x, ldx) = (a as *const f32, lda / 4);
    if nt == 1 {
        return decode::<D>(w, ldw, x, n, nr, out);
    }
    if WIDE && nt >= 3 && crate::cpu::wide_tiles() {
        return gemm_wide::<D>(w, ldw, x, ldx, n, nr, nt, out, ldo);
    }
    // Out of the thread-local rather than inside a `with` closure, which would not inherit
    // this function's target features.
    let (mut panel, mut accs) = BUFS.with(|cell| cell.take());
    if panel.len() < PANEL_ROWS * CHUNK {
        panel.resize(PANEL_ROWS * CHUNK, 0.0);
    }
    if accs.len() < nt * PANEL_ROWS {
        // Large steps: which thread gets which token count is decided at run time.
        accs.resize((nt * PANEL_ROWS).next_power_of_two(), _mm256_setzero_ps());
    }
    let (pp, ap) = (panel.as_mut_ptr(), accs.as_mut_ptr());
    let mut r0 = 0;
    while r0 < nr {
        let rq = PANEL_ROWS.min(nr - r0);
        let mut kc = 0;
        while kc < n {
            let kl = CHUNK.min(n - kc);
            let boff = kc / bs * bb;
            if nt < 3 {
                // Decode streams the matrix once: ask for the next panel's chunk now.
                for r in 0..PANEL_ROWS {
                    prefetch_ahead(w, (r0 + PANEL_ROWS + r) * ldw + boff, kl / bs * bb);
                }
            }
            let src = w.add(r0 * ldw + boff);
            for r in 0..rq {
                D::chunk(src.add(r * ldw), kl, &mut Store(pp.add(r * CHUNK)));
            }
            panel_tokens(pp, rq, x.add(kc), ldx, nt, kl, ap, kc == 0);
            kc += kl;
        }
        for t in 0..nt {
            for r in 0..rq {
                *out.add(t * ldo + r0 + r) = hsum_ps(*ap.add(t * PANEL_ROWS + r));
            }
        }
        r0 += rq;
    }
    BUFS.with(|cell| cell.replace((panel, accs)));
}

/// [`gemm`] for three tokens or more in 512-bit registers: the panel is stored duplicated and
/// the tokens go in pairs (see [`micro_wide`]); the same bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_wide<D: ChunkDequant>(
    w: *const u8,
    ldw: usize,
    x: *const f32,
    ldx: usize,
    n: usize,
    nr: usize,
    nt: usize,
    out: *mut f32,
    ldo: usize,
) {
    let (bs, bb) = (D::TY.block_size(), D::TY.block_bytes());
    let (mut panel, accs_256) = BUFS.with(|cell| cell.take());
    let (mut accs, mut paired) = WIDE_BUFS.with(|cell| cell.take());
    if panel.len() < 2 * PANEL_ROWS * CHUNK {
        panel.resize(2 * PANEL_ROWS * CHUNK, 0.0);
    }
    let pairs = nt.div_ceil(2);
    if accs.len() < pairs * PANEL_ROWS {
        accs.resize(
            (pairs * PANEL_ROWS).next_power_of_two(),
            _mm512_setzero_ps(),
        );
    }
    // 16 floats per unit.
    let paired_units = n.div_ceil(CHUNK) * pairs * 2 * CHUNK / 16;
    if paired.len() < paired_units {
        paired.resize(paired_units.next_power_of_two(), _mm512_setzero_ps());
    }
    let (pp, ap, xp) = (
        panel.as_mut_ptr(),
        accs.as_mut_ptr(),
        paired.as_mut_ptr().cast::<f32>(),
    );
    pair_tokens(x, ldx, n, nt, xp);
    let mut r0 = 0;
    while r0 < nr {
        let rq = PANEL_ROWS.min(nr - r0);
        let mut kc = 0;
        while kc < n {
            let kl = CHUNK.min(n - kc);
            let src = w.add(r0 * ldw + kc / bs * bb);
            for r in 0..rq {
                D::chunk(src.add(r * ldw), kl, &mut StoreDup(pp.add(2 * r * CHUNK)));
            }
            let xc = xp.add(kc / CHUNK * pairs * 2 * CHUNK);
            panel_pairs(pp, rq, xc, pairs, kl, ap, kc == 0);
            kc += kl;
        }
        for p in 0..pairs {
            for r4 in (0..rq).step_by(4) {
                let mut quad = [_mm512_setzero_ps(); 4];
                for (i, v) in quad.iter_mut().enumerate().take(rq - r4) {
                    *v = *ap.add(p * PANEL_ROWS + r4 + i);
                }
                let mut lanes = [0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), hsum4_paired(quad));
                for h in 0..2.min(nt - 2 * p) {
                    for i in 0..4.min(rq - r4) {
                        *out.add((2 * p + h) * ldo + r0 + r4 + i) = lanes[4 * i + h];
                    }
                }
            }
        }
        r0 += rq;
    }
    BUFS.with(|cell| cell.replace((panel, accs_256)));
    WIDE_BUFS.with(|cell| cell.replace((accs, paired)));
}

/// `out[r] = dot(dequantized w row r, x)` for `r < nr`, one token: each row's weights go
/// straight into its accumulator, [`DECODE_ROWS`] rows interleaved, with no panel round trip.
#[inline(always)]
unsafe fn decode<D: ChunkDequant>(
    w: *const u8,
    ldw: usize,
    x: *const f32,
    n: usize,
    nr: usize,
    out: *mut f32,
) {
    let mut r0 = 0;
    while r0 < nr {
        let (wr, o) = (w.add(r0 * ldw), out.add(r0));
        if nr - r0 >= DECODE_ROWS {
            let accs = D::dot_rows::<DECODE_ROWS>(wr, ldw, x, n);
            for (r, acc) in accs.into_iter().enumerate() {
                *o.add(r) = hsum_ps(acc);
            }
            r0 += DECODE_ROWS;
        } else {
            *o = hsum_ps(D::dot_rows::<1>(wr, ldw, x, n)[0]);
            r0 += 1;
        }
    }
}

/// The tiled float-activation kernel of each weight type.
macro_rules! deq_gemms {
    ($($gemm:ident, $gemm_wide:ident, $d:ty;)*) => {$(
        gemm_entry!(
            /// Tiled dequantized-weight × f32-activation product over a rectangle (see
            /// [`GemmKernel`](super::GemmKernel)).
            #[target_feature(enable = "avx2,fma,f16c")]
            pub $gemm, gemm::<$d, false>
        );
        gemm_entry!(
            /// The same product, with whole token pairs in 512-bit registers (AVX512-F): the
            /// same bits.
            #[target_feature(enable = "avx2,fma,f16c,avx512f")]
            pub $gemm_wide, gemm::<$d, true>
        );
    )*};
}

deq_gemms! {
    gemm_f32act_q4_0, gemm_f32act_q4_0_wide, DeqQ4_0;
    gemm_f32act_q4_1, gemm_f32act_q4_1_wide, DeqQ4_1;
    gemm_f32act_q5_0, gemm_f32act_q5_0_wide, DeqQ5_0;
    gemm_f32act_q5_1, gemm_f32act_q5_1_wide, DeqQ5_1;
    gemm_f32act_q8_0, gemm_f32act_q8_0_wide, DeqQ8_0;
    gemm_f32act_q2_k, gemm_f32act_q2_k_wide, DeqQ2K;
    gemm_f32act_q3_k, gemm_f32act_q3_k_wide, DeqQ3K;
    gemm_f32act_q4_k, gemm_f32act_q4_k_wide, DeqQ4K;
    gemm_f32act_q5_k, gemm_f32act_q5_k_wide, DeqQ5K;
    gemm_f32act_q6_k, gemm_f32act_q6_k_wide, DeqQ6K;
    gemm_f32act_iq4_nl, gemm_f32act_iq4_nl_wide, DeqIq4Nl;
    gemm_f32act_iq4_xs, gemm_f32act_iq4_xs_wide, DeqIq4Xs;
    gemm_f32act_mxfp4, gemm_f32act_mxfp4_wide, DeqMxfp4;
    gemm_f32act_iq2_xxs, gemm_f32act_iq2_xxs_wide, DeqIq2Xxs;
    gemm_f32act_iq2_xs, gemm_f32act_iq2_xs_wide, DeqIq2Xs;
    gemm_f32act_iq2_s, gemm_f32act_iq2_s_wide, DeqIq2S;
    gemm_f32act_iq3_xxs, gemm_f32act_iq3_xxs_wide, DeqIq3Xxs;
    gemm_f32act_iq3_s, gemm_f32act_iq3_s_wide, DeqIq3S;
    gemm_f32act_iq1_s, gemm_f32act_iq1_s_wide, DeqIq1S;
    gemm_f32act_iq1_m, gemm_f32act_iq1_m_wide, DeqIq1M;
    gemm_f32act_tq1_0, gemm_f32act_tq1_0_wide, DeqTq1;
    gemm_f32act_tq2_0, gemm_f32act_tq2_0_wide, DeqTq2;
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
unsafe fn deq_row<D: ChunkDequant>(src: &[u8], dst: &mut [f32]) {
    let (bs, bb) = (D::TY.block_size(), D::TY.block_bytes());
    let mut k = 0;
    while k < dst.len() {
        let kl = CHUNK.min(dst.len() - k);
        let mut sink = Store(dst.as_mut_ptr().add(k));
        D::chunk(src.as_ptr().add(k / bs * bb), kl, &mut sink);
        k += kl;
    }
}
