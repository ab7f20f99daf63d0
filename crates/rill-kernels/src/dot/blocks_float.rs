//! AVX2 + FMA + F16C dot products (x86-64), modelled on llama.cpp's AVX2 kernels: the K-quant
//! and float kernels (the 32-element block types live in `blocks_q32/` and Q4_K/Q6_K in `blocks_k.rs`,
//! as 1 × 1 tiles).
//!
//! Per block the integer products are formed with `maddubs` (unsigned × signed bytes → i16 pairs)
//! and widened with `madd`, so they are exact; block results are scaled and accumulated in eight
//! f32 lanes with FMA and reduced at the end. The results therefore differ from the scalar twins
//! only by f32 rounding of the accumulation.
//!
//! # Safety
//! Every function requires a CPU with AVX2, FMA and F16C and slices at least as long as the
//! block count implied by `n` (validated by the public entry points).

use crate::dequant::scale_min_k4;
use crate::fp16::{bf16_to_f32, f16_to_f32};
use crate::quant_types::BlockQ8K;
use crate::QK_K;
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline(always)]
unsafe fn loadu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Reads the f16 at `p` with the F16C instruction (the `half` crate's portable conversion is a
/// function call per value). The value is inserted into an explicit zero vector: otherwise LLVM
/// emits `pinsrw` into whatever register is free, often an FMA accumulator, which chains every
/// block on the previous block's FMA latency.
#[inline(always)]
pub(super) unsafe fn f16v(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned() as i32;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_insert_epi16(_mm_setzero_si128(), bits, 0)))
}

#[inline(always)]
pub(super) unsafe fn f32v(p: *const u8) -> f32 {
    (p as *const f32).read_unaligned()
}

/// Σ_j mins[j] * (bsums[2j] + bsums[2j+1]) for the eight 32-element sub-blocks of a Q8_K block.
#[inline(always)]
unsafe fn k_mins_dot(mins: &[u8; 8], y: *const u8) -> i32 {
    let bs = std::slice::from_raw_parts(y.add(BlockQ8K::BSUMS), 32);
    let mut s = 0i32;
    for j in 0..8 {
        let b0 = i16::from_le_bytes([bs[4 * j], bs[4 * j + 1]]) as i32;
        let b1 = i16::from_le_bytes([bs[4 * j + 2], bs[4 * j + 3]]) as i32;
        s += mins[j] as i32 * (b0 + b1);
    }
    s
}

#[inline(always)]
unsafe fn k4_scales_mins(scales: *const u8) -> ([u8; 8], [u8; 8]) {
    let s = std::slice::from_raw_parts(scales, 12);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        let (a, b) = scale_min_k4(j, s);
        sc[j] = a;
        mn[j] = b;
    }
    (sc, mn)
}

/// Q5_K · Q8_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_k_q8_k(w: &[u8], a: &[u8], n: usize) -> f32 {
    let nb = n / QK_K;
    debug_assert!(w.len() >= nb * 176 && a.len() >= nb * BlockQ8K::BYTES);
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let b4 = _mm256_set1_epi8(0x10);
    let mut acc = _mm256_setzero_ps();
    let mut summ = 0.0f32;
    for i in 0..nb {
        let x = wp.add(i * 176);
        let y = ap.add(i * BlockQ8K::BYTES);
        let dy = f32v(y);
        let d = dy * f16v(x);
        let dmin = dy * f16v(x.add(2));
        let (sc, mn) = k4_scales_mins(x.add(4));
        summ += dmin * k_mins_dot(&mn, y) as f32;
        let hbits = loadu(x.add(16));
        let q5 = x.add(48);
        let q8 = y.add(BlockQ8K::QS);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let bits = loadu(q5.add(32 * j));
            let ml = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
            let mh = _mm256_set1_epi8((2u8 << (2 * j)) as i8);
            let hl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, ml), ml), b4);
            let hh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, mh), mh), b4);
            let ql = _mm256_or_si256(_mm256_and_si256(bits, m4), hl);
            let qh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), hh);
            let pl = _mm256_maddubs_epi16(ql, loadu(q8.add(64 * j)));
            let ph = _mm256_maddubs_epi16(qh, loadu(q8.add(64 * j + 32)));
            let pl = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j] as i16), pl);
            let ph = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j + 1] as i16), ph);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - summ
}

/// f32 · f32 over byte slices (unaligned loads).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    debug_assert!(w.len() >= 4 * n && a.len() >= 4 * n);
    dot_f32_ptr(w.as_ptr() as *const f32, a.as_ptr() as *const f32, n)
}

/// f32 dot over raw pointers, four 8-lane FMA accumulators.
#[inline(always)]
unsafe fn dot_f32_ptr(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, s) in acc.iter_mut().enumerate() {
            let va = _mm256_loadu_ps(a.add(i + 8 * k));
            let vb = _mm256_loadu_ps(b.add(i + 8 * k));
            *s = _mm256_fmadd_ps(va, vb, *s);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc[0]);
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum_ps(v);
    while i < n {
        s += (a.add(i).read_unaligned()) * (b.add(i).read_unaligned());
        i += 1;
    }
    s
}

/// f32 · f32 over slices.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    dot_f32_ptr(a.as_ptr(), b.as_ptr(), a.len().min(b.len()))
}

/// f16 · f32 (F16C widening).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    debug_assert!(w.len() >= 2 * n && a.len() >= 4 * n);
    let (wp, ap) = (w.as_ptr(), a.as_ptr() as *const f32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, s) in acc.iter_mut().enumerate() {
            let vw = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * (i + 8 * k)) as *const __m128i));
            *s = _mm256_fmadd_ps(vw, _mm256_loadu_ps(ap.add(i + 8 * k)), *s);
        }
        i += 32;
    }
    while i + 8 <= n {
        let vw = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * i) as *const __m128i));
        acc[0] = _mm256_fmadd_ps(vw, _mm256_loadu_ps(ap.add(i)), acc[0]);
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum_ps(v);
    while i < n {
        let wb = u16::from_le_bytes([*wp.add(2 * i), *wp.add(2 * i + 1)]);
        s += f16_to_f32(wb) * ap.add(i).read_unaligned();
        i += 1;
    }
    s
}

#[inline(always)]
unsafe fn bf16x8(p: *const u8) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

/// bf16 · f32 (bf16 widens by a 16-bit shift).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn bf16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    debug_assert!(w.len() >= 2 * n && a.len() >= 4 * n);
    let (wp, ap) = (w.as_ptr(), a.as_ptr() as *const f32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, s) in acc.iter_mut().enumerate() {
            let vw = bf16x8(wp.add(2 * (i + 8 * k)));
            *s = _mm256_fmadd_ps(vw, _mm256_loadu_ps(ap.add(i + 8 * k)), *s);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(bf16x8(wp.add(2 * i)), _mm256_loadu_ps(ap.add(i)), acc[0]);
        i += 8;
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum_ps(v);
    while i < n {
        let wb = u16::from_le_bytes([*wp.add(2 * i), *wp.add(2 * i + 1)]);
        s += bf16_to_f32(wb) * ap.add(i).read_unaligned();
        i += 1;
    }
    s
}
