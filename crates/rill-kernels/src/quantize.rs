//! Activation quantization into Q8_0, Q8_1 and Q8_K, matching ggml's reference rounding.
//!
//! * Q8_0 / Q8_1 (`quantize_row_q8_0_ref`): `d = amax / 127`, `q = roundf(x / d)` computed as
//!   `x * (1/d)`, i.e. round half away from zero. Q8_1 also stores `s = d * sum(q)` as f16.
//! * Q8_K (`quantize_row_q8_K_ref`): the scale is taken from the *signed* element of largest
//!   magnitude (the first one on ties), `iscale = -127 / max`, `q = min(127, nearest_int(iscale *
//!   x))` with round-half-to-even, `d = 1 / iscale` kept as f32, plus the sums of each group of 16.
//!
//! The AVX2 versions are bit-identical to the scalar ones (they emulate `roundf` exactly), so the
//! choice of path never changes results.

use crate::error::check_len;
use crate::fp16::f32_to_f16;
use crate::quant_types::BlockQ8K;
use crate::{cpu, KernelError, QuantType, QK8_0, QK_K};

/// Quantizes `x` into `out` in activation format `ty` (Q8_0, Q8_1 or Q8_K).
pub fn quantize_row(ty: QuantType, x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    match ty {
        QuantType::Q8_0 => quantize_row_q8_0(x, out),
        QuantType::Q8_1 => quantize_row_q8_1(x, out),
        QuantType::Q8_K => quantize_row_q8_k(x, out),
        _ => Err(KernelError::Unsupported {
            ty,
            op: "activation quantization",
        }),
    }
}

fn check(ty: QuantType, x: &[f32], out: &[u8]) -> Result<(), KernelError> {
    let need = ty.row_bytes_checked(x.len())?;
    check_len("quantized activation bytes", need, out.len())
}

/// Quantizes `x` to Q8_0 (scalar reference or AVX2, bit-identical).
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check(QuantType::Q8_0, x, out)?;
    quantize_q8_0_unchecked(x, out);
    Ok(())
}

/// Scalar twin of [`quantize_row_q8_0`].
pub fn quantize_row_q8_0_scalar(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check(QuantType::Q8_0, x, out)?;
    q8_0_scalar::<false>(x, out);
    Ok(())
}

/// Quantizes `x` to Q8_1 (scalar reference or AVX2, bit-identical).
pub fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check(QuantType::Q8_1, x, out)?;
    quantize_q8_1_unchecked(x, out);
    Ok(())
}

/// Scalar twin of [`quantize_row_q8_1`].
pub fn quantize_row_q8_1_scalar(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check(QuantType::Q8_1, x, out)?;
    q8_0_scalar::<true>(x, out);
    Ok(())
}

/// Quantizes `x` to Q8_K (scalar reference or AVX2, bit-identical).
pub fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check(QuantType::Q8_K, x, out)?;
    quantize_q8_k_unchecked(x, out);
    Ok(())
}

/// Scalar twin of [`quantize_row_q8_k`].
pub fn quantize_row_q8_k_scalar(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check(QuantType::Q8_K, x, out)?;
    q8_k_scalar(x, out);
    Ok(())
}

/// The element of largest magnitude, with its sign (the first on ties; 0 for none): the scale
/// source of Q4_0 and Q8_K.
fn signed_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Quantizes `x` to Q4_0 as ggml's `quantize_row_q4_0_ref` does: per 32 elements, `d = max / -8`
/// (`max` the element of largest magnitude, signed, the first on ties) and
/// `q = min(15, trunc(x / d + 8.5))`; element `j` in the low nibble of byte `j`, element `j + 16`
/// in its high nibble. For weights and for keys and values stored in a Q4_0 KV cache.
pub fn quantize_row_q4_0(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check_len(
        "Q4_0 bytes",
        QuantType::Q4_0.row_bytes_checked(x.len())?,
        out.len(),
    )?;
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(18)) {
        let max = signed_max(xb);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        for j in 0..16 {
            ob[2 + j] = q(xb[j]) | (q(xb[j + 16]) << 4);
        }
    }
    Ok(())
}

/// Quantizes `x` to Q5_0 as ggml's `quantize_row_q5_0_ref` does: per 32 elements,
/// `d = max / -16` (`max` the element of largest magnitude, signed, the first on ties) and
/// `q = min(31, trunc(x / d + 16.5))`; element `j`'s low four bits in the low nibble of byte `j`
/// and its fifth bit in bit `j` of `qh`, element `j + 16`'s in the high nibble and bit `j + 16`.
/// For the two-pass output head's copy (and any Q5_0 weights written).
pub fn quantize_row_q5_0(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check_len(
        "Q5_0 bytes",
        QuantType::Q5_0.row_bytes_checked(x.len())?,
        out.len(),
    )?;
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(22)) {
        let max = signed_max(xb);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        let q = |v: f32| ((v * id + 16.5) as i8).min(31) as u8;
        let mut qh = 0u32;
        for j in 0..16 {
            let (lo, hi) = (q(xb[j]), q(xb[j + 16]));
            ob[6 + j] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            qh |= (((lo & 0x10) >> 4) as u32) << j;
            qh |= (((hi & 0x10) >> 4) as u32) << (j + 16);
        }
        ob[2..6].copy_from_slice(&qh.to_le_bytes());
    }
    Ok(())
}

/// Bytes of one 256-element block of 16-bit activations ([`quantize_row_i16`]): the f32 scale,
/// the eight 32-element sums (i32), then the 256 quants (i16).
pub const I16_BLOCK_BYTES: usize = 548;

/// Offset of the quants in a 16-bit activation block.
pub const I16_QUANTS: usize = 36;

/// Largest magnitude of a 16-bit activation quant: 11 bits and a sign (12-bit quants), so that every integer
/// sum of the kernels that take them (K-quant weights up to 4096 in magnitude, times 256
/// elements: at most 2 146 435 072) stays inside i32.
pub const I16_LEVELS: i32 = 2047;

/// Bytes of `n` activations quantized by [`quantize_row_i16`] (`n` a multiple of 256).
pub fn i16_row_bytes(n: usize) -> Result<usize, KernelError> {
    if !n.is_multiple_of(QK_K) {
        return Err(KernelError::LengthMismatch {
            what: "16-bit activation elements (whole blocks of 256)",
            expected: n.next_multiple_of(QK_K),
            actual: n,
        });
    }
    (n / QK_K)
        .checked_mul(I16_BLOCK_BYTES)
        .ok_or(KernelError::Overflow)
}

/// Quantizes `x` (a multiple of 256 elements) into 16-bit activation blocks: per block,
/// `d = max |x| / 2047`, the quants `round(x / d)` as i16, and the exact sums of each 32 of
/// them (the row-interleaved K-quant kernels' activations, for products whose inputs have
/// outliers that 8 bits would blur).
pub fn quantize_row_i16(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check_len(
        "16-bit activation bytes",
        i16_row_bytes(x.len())?,
        out.len(),
    )?;
    quantize_i16_unchecked(x, out);
    Ok(())
}

/// The scalar reference of [`quantize_row_i16`] (the AVX2 path is bit-identical).
pub fn quantize_row_i16_scalar(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    check_len(
        "16-bit activation bytes",
        i16_row_bytes(x.len())?,
        out.len(),
    )?;
    i16_scalar(x, out);
    Ok(())
}

/// [`quantize_row_i16`] without the size checks.
pub(crate) fn quantize_i16_unchecked(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() {
        // SAFETY: features checked; sizes validated by the caller.
        unsafe { avx2::i16_blocks(x, out) };
        return;
    }
    i16_scalar(x, out);
}

fn i16_scalar(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(I16_BLOCK_BYTES))
    {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / I16_LEVELS as f32;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..4].copy_from_slice(&d.to_le_bytes());
        for (j, chunk) in xb.chunks_exact(32).enumerate() {
            let mut sum = 0i32;
            for (i, &v) in chunk.iter().enumerate() {
                let q = ((v * id).round() as i32).clamp(-I16_LEVELS, I16_LEVELS);
                sum += q;
                let at = I16_QUANTS + 2 * (32 * j + i);
                ob[at..at + 2].copy_from_slice(&(q as i16).to_le_bytes());
            }
            ob[4 + 4 * j..8 + 4 * j].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

/// Dispatching Q8_0 quantizer; sizes already validated by the caller.
pub(crate) fn quantize_q8_0_unchecked(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::wide_tiles() {
        // SAFETY: `wide_tiles` implies AVX2, FMA, F16C and AVX512-F; sizes validated by the
        // caller.
        unsafe { avx2::q8_0_wide::<false>(x, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() {
        // SAFETY: features checked; sizes validated by the caller.
        unsafe { avx2::q8_0::<false>(x, out) };
        return;
    }
    q8_0_scalar::<false>(x, out);
}

/// Dispatching Q8_1 quantizer; sizes already validated by the caller.
pub(crate) fn quantize_q8_1_unchecked(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if crate::wide_tiles() {
        // SAFETY: `wide_tiles` implies AVX2, FMA, F16C and AVX512-F; sizes validated by the
        // caller.
        unsafe { avx2::q8_0_wide::<true>(x, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() {
        // SAFETY: features checked; sizes validated by the caller.
        unsafe { avx2::q8_0::<true>(x, out) };
        return;
    }
    q8_0_scalar::<true>(x, out);
}

/// Dispatching Q8_K quantizer; sizes already validated by the caller.
pub(crate) fn quantize_q8_k_unchecked(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if cpu::has_avx2_fma_f16c() {
        // SAFETY: features checked; sizes validated by the caller.
        unsafe { avx2::q8_k(x, out) };
        return;
    }
    q8_k_scalar(x, out);
}

/// Q8_0 (`WITH_SUM = false`) or Q8_1 (`WITH_SUM = true`) reference quantization.
fn q8_0_scalar<const WITH_SUM: bool>(x: &[f32], out: &mut [u8]) {
    let hdr = if WITH_SUM { 4 } else { 2 };
    let bb = hdr + QK8_0;
    for (xb, ob) in x.chunks_exact(QK8_0).zip(out.chunks_exact_mut(bb)) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (o, &v) in ob[hdr..].iter_mut().zip(xb) {
            let q = (v * id).round() as i32;
            sum += q;
            *o = q as i8 as u8;
        }
        ob[0..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        if WITH_SUM {
            ob[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
        }
    }
}

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick (valid for |v| < 2^22).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let t = v + 12582912.0;
    (t.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fn q8_k_scalar(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x
        .chunks_exact(QK_K)
        .zip(out.chunks_exact_mut(BlockQ8K::BYTES))
    {
        let max = signed_max(xb);
        if max == 0.0 {
            ob.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        for (o, &v) in ob[BlockQ8K::QS..BlockQ8K::QS + QK_K].iter_mut().zip(xb) {
            *o = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        finish_q8_k(ob, 1.0 / iscale);
    }
}

/// Writes `d` and the 16 group sums of a Q8_K block whose quants are already stored.
#[inline]
fn finish_q8_k(ob: &mut [u8], d: f32) {
    ob[0..4].copy_from_slice(&d.to_le_bytes());
    for g in 0..QK_K / 16 {
        let s: i32 = ob[BlockQ8K::QS + 16 * g..BlockQ8K::QS + 16 * g + 16]
            .iter()
            .map(|&b| b as i8 as i32)
            .sum();
        let off = BlockQ8K::BSUMS + 2 * g;
        ob[off..off + 2].copy_from_slice(&(s as i16).to_le_bytes());
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// f32 -> f16 bits with F16C, round to nearest even (same as the scalar conversion).
    #[inline(always)]
    unsafe fn f16_bits(v: f32) -> u16 {
        _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(v), _MM_FROUND_TO_NEAREST_INT), 0) as u16
    }

    /// Horizontal max of 8 lanes.
    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        _mm_cvtss_f32(m)
    }

    /// `roundf` (half away from zero), exactly: truncate `v + copysign(0.5 - 2^-25, v)`.
    /// Adding the largest float below 0.5 makes exact halves round up (the sum rounds to the
    /// next integer) while everything below a half stays below it.
    #[inline(always)]
    unsafe fn roundf_epi32(v: __m256) -> __m256i {
        let sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0));
        let half = _mm256_or_ps(sign, _mm256_set1_ps(0.49999997));
        _mm256_cvttps_epi32(_mm256_add_ps(v, half))
    }

    /// [`roundf_epi32`] on sixteen lanes (a function, not a closure: a closure would not
    /// inherit the caller's target features).
    #[inline(always)]
    unsafe fn roundf_epi32_wide(v: __m512) -> __m512i {
        let sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(i32::MIN));
        let half = _mm512_or_si512(sign, _mm512_set1_epi32(0.49999997f32.to_bits() as i32));
        _mm512_cvttps_epi32(_mm512_add_ps(v, _mm512_castsi512_ps(half)))
    }

    /// Packs 4×8 i32 (each in -127..=127) into 32 i8 in order.
    #[inline(always)]
    unsafe fn pack32(i0: __m256i, i1: __m256i, i2: __m256i, i3: __m256i) -> __m256i {
        let a = _mm256_packs_epi32(i0, i1);
        let b = _mm256_packs_epi32(i2, i3);
        let c = _mm256_packs_epi16(a, b);
        _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0<const WITH_SUM: bool>(x: &[f32], out: &mut [u8]) {
        let hdr = if WITH_SUM { 4 } else { 2 };
        let bb = hdr + QK8_0;
        let nb = x.len() / QK8_0;
        debug_assert!(out.len() >= nb * bb);
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        for i in 0..nb {
            let xp = x.as_ptr().add(i * QK8_0);
            let v0 = _mm256_loadu_ps(xp);
            let v1 = _mm256_loadu_ps(xp.add(8));
            let v2 = _mm256_loadu_ps(xp.add(16));
            let v3 = _mm256_loadu_ps(xp.add(24));
            let m = _mm256_max_ps(
                _mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)),
                _mm256_max_ps(_mm256_and_ps(v2, abs_mask), _mm256_and_ps(v3, abs_mask)),
            );
            let amax = hmax(m);
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            if !id.is_finite() {
                // A subnormal scale (|x| < 127 · 2^-128): the scalar path's saturation.
                let xb = &x[i * QK8_0..(i + 1) * QK8_0];
                super::q8_0_scalar::<WITH_SUM>(xb, &mut out[i * bb..(i + 1) * bb]);
                continue;
            }
            let idv = _mm256_set1_ps(id);
            let i0 = roundf_epi32(_mm256_mul_ps(v0, idv));
            let i1 = roundf_epi32(_mm256_mul_ps(v1, idv));
            let i2 = roundf_epi32(_mm256_mul_ps(v2, idv));
            let i3 = roundf_epi32(_mm256_mul_ps(v3, idv));
            let op = out.as_mut_ptr().add(i * bb);
            let dh = f16_bits(d).to_le_bytes();
            *op = dh[0];
            *op.add(1) = dh[1];
            if WITH_SUM {
                let s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
                let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
                let sum = _mm_cvtsi128_si32(s);
                let sh = f16_bits(sum as f32 * d).to_le_bytes();
                *op.add(2) = sh[0];
                *op.add(3) = sh[1];
            }
            _mm256_storeu_si256(op.add(hdr) as *mut __m256i, pack32(i0, i1, i2, i3));
        }
    }

    /// [`q8_0`] sixteen blocks at a time in 512-bit registers, with the same bits: each
    /// block's largest magnitude (exact in any order), then the sixteen scales `amax / 127` and
    /// their reciprocals in one IEEE division each (the scalar's per block), the quants rounded
    /// half away from zero as [`roundf_epi32`] rounds, and the f16 headers converted together.
    /// A block whose reciprocal is not finite takes the scalar path, as in [`q8_0`]. Fewer
    /// instructions per element than [`q8_0`], though on SmolLM2's prompt its share stayed at
    /// ~3.5%: the time goes to loading its input, which the previous step wrote.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn q8_0_wide<const WITH_SUM: bool>(x: &[f32], out: &mut [u8]) {
        let hdr = if WITH_SUM { 4 } else { 2 };
        let bb = hdr + QK8_0;
        let nb = x.len() / QK8_0;
        debug_assert!(out.len() >= nb * bb);
        let (px, po) = (x.as_ptr(), out.as_mut_ptr());
        let mut b0 = 0;
        while b0 < nb {
            let g = 16.min(nb - b0);
            let mut amax = [0f32; 16];
            for (j, a) in amax.iter_mut().enumerate().take(g) {
                let xp = px.add((b0 + j) * QK8_0);
                let (v0, v1) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
                *a = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            }
            let d = _mm512_div_ps(_mm512_loadu_ps(amax.as_ptr()), _mm512_set1_ps(127.0));
            // `d != 0.0` as the scalar path asks it (true for a NaN).
            let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(d, _mm512_setzero_ps());
            let id = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0), d);
            let mut ids = [0f32; 16];
            _mm512_storeu_ps(ids.as_mut_ptr(), id);
            let mut d_bits = [0u16; 16];
            let dh = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(d);
            _mm256_storeu_si256(d_bits.as_mut_ptr() as *mut __m256i, dh);
            let mut sums = [0i32; 16];
            let mut scalar = 0u16;
            for j in 0..g {
                let (xp, op) = (px.add((b0 + j) * QK8_0), po.add((b0 + j) * bb));
                if !ids[j].is_finite() {
                    let xb = &x[(b0 + j) * QK8_0..(b0 + j + 1) * QK8_0];
                    let ob = &mut out[(b0 + j) * bb..(b0 + j + 1) * bb];
                    super::q8_0_scalar::<WITH_SUM>(xb, ob);
                    scalar |= 1 << j;
                    continue;
                }
                let idv = _mm512_set1_ps(ids[j]);
                let i0 = roundf_epi32_wide(_mm512_mul_ps(_mm512_loadu_ps(xp), idv));
                let i1 = roundf_epi32_wide(_mm512_mul_ps(_mm512_loadu_ps(xp.add(16)), idv));
                std::ptr::copy_nonoverlapping(d_bits[j].to_le_bytes().as_ptr(), op, 2);
                _mm_storeu_si128(op.add(hdr) as *mut __m128i, _mm512_cvtsepi32_epi8(i0));
                _mm_storeu_si128(op.add(hdr + 16) as *mut __m128i, _mm512_cvtsepi32_epi8(i1));
                if WITH_SUM {
                    sums[j] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
                }
            }
            if WITH_SUM {
                // `f16(sum as f32 · d)`: the sums are exact in f32 (|sum| ≤ 32 · 127).
                let s = _mm512_cvtepi32_ps(_mm512_loadu_si512(sums.as_ptr() as *const _));
                let sh = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_mul_ps(s, d),
                );
                let mut s_bits = [0u16; 16];
                _mm256_storeu_si256(s_bits.as_mut_ptr() as *mut __m256i, sh);
                for (j, bits) in s_bits.iter().enumerate().take(g) {
                    if scalar & (1 << j) == 0 {
                        let op = po.add((b0 + j) * bb + 2);
                        std::ptr::copy_nonoverlapping(bits.to_le_bytes().as_ptr(), op, 2);
                    }
                }
            }
            b0 += g;
        }
    }

    /// 16-bit activation blocks ([`super::quantize_row_i16`]); a block holding an infinity or
    /// a NaN, or so small that its scale's reciprocal overflows, takes the scalar path, whose
    /// float-to-int conversion saturates them differently.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn i16_blocks(x: &[f32], out: &mut [u8]) {
        let nb = x.len() / QK_K;
        debug_assert!(out.len() >= nb * I16_BLOCK_BYTES);
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let inf = _mm256_set1_ps(f32::INFINITY);
        let (lo, hi) = (
            _mm256_set1_epi32(-I16_LEVELS),
            _mm256_set1_epi32(I16_LEVELS),
        );
        for i in 0..nb {
            let xb = &x[i * QK_K..(i + 1) * QK_K];
            let ob = &mut out[i * I16_BLOCK_BYTES..(i + 1) * I16_BLOCK_BYTES];
            let (mut m, mut bad) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for j in 0..QK_K / 8 {
                let a = _mm256_and_ps(_mm256_loadu_ps(xb.as_ptr().add(8 * j)), abs_mask);
                m = _mm256_max_ps(m, a);
                bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf));
            }
            if _mm256_movemask_ps(bad) != 0 {
                super::i16_scalar(xb, ob);
                continue;
            }
            let d = hmax(m) / I16_LEVELS as f32;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            if !id.is_finite() {
                // A subnormal scale: its reciprocal overflows, and infinite products convert
                // differently here.
                super::i16_scalar(xb, ob);
                continue;
            }
            let idv = _mm256_set1_ps(id);
            ob[..4].copy_from_slice(&d.to_le_bytes());
            for j in 0..QK_K / 32 {
                let xp = xb.as_ptr().add(32 * j);
                let q = |k: usize| {
                    let v = roundf_epi32(_mm256_mul_ps(_mm256_loadu_ps(xp.add(8 * k)), idv));
                    _mm256_max_epi32(_mm256_min_epi32(v, hi), lo)
                };
                let (q0, q1, q2, q3) = (q(0), q(1), q(2), q(3));
                let s = _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
                let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
                let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
                ob[4 + 4 * j..8 + 4 * j].copy_from_slice(&_mm_cvtsi128_si32(s).to_le_bytes());
                // packs interleaves the 128-bit lanes; the permute puts the 16 values in order.
                let a = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0b11_01_10_00);
                let b = _mm256_permute4x64_epi64(_mm256_packs_epi32(q2, q3), 0b11_01_10_00);
                let op = ob.as_mut_ptr().add(I16_QUANTS + 64 * j);
                _mm256_storeu_si256(op as *mut __m256i, a);
                _mm256_storeu_si256(op.add(32) as *mut __m256i, b);
            }
        }
    }

    #[inline(always)]
    unsafe fn q8k_lane(isv: __m256, p: *const f32, lim: __m256i) -> __m256i {
        _mm256_min_epi32(
            _mm256_cvtps_epi32(_mm256_mul_ps(isv, _mm256_loadu_ps(p))),
            lim,
        )
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_k(x: &[f32], out: &mut [u8]) {
        let nb = x.len() / QK_K;
        debug_assert!(out.len() >= nb * BlockQ8K::BYTES);
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        for i in 0..nb {
            let xb = &x[i * QK_K..(i + 1) * QK_K];
            let ob = &mut out[i * BlockQ8K::BYTES..(i + 1) * BlockQ8K::BYTES];
            let mut m = _mm256_setzero_ps();
            for j in 0..QK_K / 8 {
                m = _mm256_max_ps(
                    m,
                    _mm256_and_ps(_mm256_loadu_ps(xb.as_ptr().add(8 * j)), abs_mask),
                );
            }
            let amax = hmax(m);
            if amax == 0.0 || amax.is_nan() {
                // NaN inputs take the scalar path so the result is defined identically.
                super::q8_k_scalar(xb, ob);
                continue;
            }
            // The scalar reference keeps the first element attaining the maximum magnitude.
            let max = *xb.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
            let iscale = -127.0 / max;
            if !iscale.is_finite() {
                // A subnormal maximum: the scale overflows, and the conversions differ.
                super::q8_k_scalar(xb, ob);
                continue;
            }
            let isv = _mm256_set1_ps(iscale);
            let lim = _mm256_set1_epi32(127);
            for j in 0..QK_K / 32 {
                let xp = xb.as_ptr().add(32 * j);
                // cvtps rounds half to even under the default MXCSR mode, like `nearest_int`.
                let packed = pack32(
                    q8k_lane(isv, xp, lim),
                    q8k_lane(isv, xp.add(8), lim),
                    q8k_lane(isv, xp.add(16), lim),
                    q8k_lane(isv, xp.add(24), lim),
                );
                _mm256_storeu_si256(
                    ob.as_mut_ptr().add(BlockQ8K::QS + 32 * j) as *mut __m256i,
                    packed,
                );
            }
            super::finish_q8_k(ob, 1.0 / iscale);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of every length in blocks around the 16-block groups, with zero blocks, exact
    /// halves of a step, single spikes and scales down to subnormal: the dispatching
    /// quantizers (the 512-bit ones on a CPU with them) give the scalar twins' bytes.
    #[test]
    fn q8_quantizers_match_scalar_twins_on_awkward_blocks() {
        let mut seed = 1u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for blocks in [1usize, 2, 15, 16, 17, 18, 31, 32, 33, 48] {
            let n = blocks * QK8_0;
            for scale in [1.0f32, 1e-3, 3e3, 1e-38, 1e-43] {
                let mut x: Vec<f32> = (0..n).map(|_| next() * scale).collect();
                for b in 0..blocks {
                    let block = &mut x[b * QK8_0..(b + 1) * QK8_0];
                    match b % 5 {
                        0 => block.fill(0.0),
                        // Largest magnitude 127 · scale, so the step is `scale` and the others
                        // fall on halves of it (exact ties at scale 1: away from zero).
                        1 => {
                            for (i, v) in block.iter_mut().enumerate() {
                                *v = (i as f32 - 15.5) * scale;
                            }
                            block[QK8_0 - 1] = 127.0 * scale;
                        }
                        2 => block[b % QK8_0] = -127.0 * scale,
                        _ => {}
                    }
                }
                for with_sum in [false, true] {
                    let len = if with_sum { 36 } else { 34 } * blocks;
                    let (mut fast, mut slow) = (vec![0u8; len], vec![0u8; len]);
                    if with_sum {
                        quantize_row_q8_1(&x, &mut fast).unwrap();
                        quantize_row_q8_1_scalar(&x, &mut slow).unwrap();
                    } else {
                        quantize_row_q8_0(&x, &mut fast).unwrap();
                        quantize_row_q8_0_scalar(&x, &mut slow).unwrap();
                    }
                    assert_eq!(fast, slow, "{blocks} blocks, scale {scale}, sum {with_sum}");
                }
            }
        }
    }
}
