//! The AVX2 and AVX-512 kernels of `heads.rs`, each with its scalar twin there.

use std::arch::x86_64::*;

use half::f16;

/// Loading cached elements as f32 lanes (inlined into the AVX2 / AVX-512 functions).
pub trait Lane: Copy {
    /// Eight elements from `p`.
    unsafe fn load8(p: *const Self) -> __m256;
    /// Sixteen elements from `p` (AVX512-F callers only).
    unsafe fn load16(p: *const Self) -> __m512;
    /// One element.
    unsafe fn scalar(p: *const Self) -> f32;
}

impl Lane for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    #[inline(always)]
    unsafe fn scalar(p: *const f16) -> f32 {
        (*p).to_f32()
    }
}

impl Lane for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn scalar(p: *const f32) -> f32 {
        *p
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16_f32(a: &[f16], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr() as *const u16, b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        let a0 = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
        let a1 = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i + 8) as *const __m128i));
        acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(pb.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(pb.add(i + 8)), acc1);
        i += 16;
    }
    if i + 8 <= n {
        let a0 = _mm256_cvtph_ps(_mm_loadu_si128(pa.add(i) as *const __m128i));
        acc0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(pb.add(i)), acc0);
        i += 8;
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    while i < n {
        sum += a[i].to_f32() * b[i];
        i += 1;
    }
    sum
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_f16(out: &mut [f32], w: f32, v: &[f16]) {
    let n = out.len().min(v.len());
    let (po, pv) = (out.as_mut_ptr(), v.as_ptr() as *const u16);
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(pv.add(i) as *const __m128i));
        _mm256_storeu_ps(
            po.add(i),
            _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(po.add(i))),
        );
        i += 8;
    }
    while i < n {
        out[i] += w * v[i].to_f32();
        i += 1;
    }
}

/// [`dot_f16_f32`] for up to `MAX_HEADS` heads at once, per head the same operations in
/// the same order.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `b` holds `out.len()` heads of `a.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16_f32_heads(a: &[f16], b: &[f32], out: &mut [f32]) {
    match out.len() {
        1 => heads::<1>(a, b, out),
        2 => heads::<2>(a, b, out),
        3 => heads::<3>(a, b, out),
        _ => heads::<4>(a, b, out),
    }
}

#[inline(always)]
unsafe fn heads<const G: usize>(a: &[f16], b: &[f32], out: &mut [f32]) {
    heads_ptr::<G, f16>(a.as_ptr(), a.len(), b.as_ptr(), out.as_mut_ptr(), 1)
}

/// `out[g * os] = dot(a, b_g)` over `n` elements, `b` holding `G` heads of `n`.
#[inline(always)]
unsafe fn heads_ptr<const G: usize, E: Lane>(
    pa: *const E,
    n: usize,
    pb: *const f32,
    out: *mut f32,
    os: usize,
) {
    let mut acc0 = [_mm256_setzero_ps(); G];
    let mut acc1 = [_mm256_setzero_ps(); G];
    let mut i = 0;
    while i + 16 <= n {
        let a0 = E::load8(pa.add(i));
        let a1 = E::load8(pa.add(i + 8));
        for (g, (c0, c1)) in acc0.iter_mut().zip(acc1.iter_mut()).enumerate() {
            let q = pb.add(g * n + i);
            *c0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(q), *c0);
            *c1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(q.add(8)), *c1);
        }
        i += 16;
    }
    dot_tail::<G, E>(pa, n, pb, out, os, acc0, acc1, i);
}

/// The end of [`heads_ptr`] from element `i` on (fewer than 16 left): eight more into
/// `acc0` if there are, the horizontal sums, the scalar tail.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dot_tail<const G: usize, E: Lane>(
    pa: *const E,
    n: usize,
    pb: *const f32,
    out: *mut f32,
    os: usize,
    mut acc0: [__m256; G],
    acc1: [__m256; G],
    mut i: usize,
) {
    if i + 8 <= n {
        let a0 = E::load8(pa.add(i));
        for (g, c0) in acc0.iter_mut().enumerate() {
            *c0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(pb.add(g * n + i)), *c0);
        }
        i += 8;
    }
    let mut sums = [0f32; 4];
    if G == 1 {
        sums[0] = hsum(_mm256_add_ps(acc0[0], acc1[0]));
    } else {
        let mut v = [_mm256_setzero_ps(); 4];
        for g in 0..G {
            v[g] = _mm256_add_ps(acc0[g], acc1[g]);
        }
        sums = hsum4(v);
    }
    for (g, &total) in sums.iter().enumerate().take(G) {
        let mut sum = total;
        for k in i..n {
            sum += E::scalar(pa.add(k)) * *pb.add(g * n + k);
        }
        *out.add(g * os) = sum;
    }
}

/// [`hsum`] of four registers at once, each sum bit-identical to `hsum` of that register
/// (the same additions: lane `l` with `l + 4`, then those with their neighbour two away,
/// then the last two), in about half the instructions of four calls.
#[inline(always)]
unsafe fn hsum4(v: [__m256; 4]) -> [f32; 4] {
    // (a0+a4 .. a3+a7 | b0+b4 .. b3+b7), and the same for c, d.
    let p = _mm256_add_ps(
        _mm256_permute2f128_ps(v[0], v[1], 0x20),
        _mm256_permute2f128_ps(v[0], v[1], 0x31),
    );
    let q = _mm256_add_ps(
        _mm256_permute2f128_ps(v[2], v[3], 0x20),
        _mm256_permute2f128_ps(v[2], v[3], 0x31),
    );
    // (s0+s2, s1+s3) of a and c | of b and d.
    let w = _mm256_add_ps(
        _mm256_shuffle_ps(p, q, 0b01_00_01_00),
        _mm256_shuffle_ps(p, q, 0b11_10_11_10),
    );
    // (a, c, a, c | b, d, b, d).
    let z = _mm256_add_ps(
        _mm256_shuffle_ps(w, w, 0b10_00_10_00),
        _mm256_shuffle_ps(w, w, 0b11_01_11_01),
    );
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), z);
    [lanes[0], lanes[4], lanes[1], lanes[5]]
}

/// [`heads_ptr`] with each head's two accumulators as the halves of one 512-bit register
/// (AVX512-F): the same lanes, the same FMAs, half the instructions.
#[inline(always)]
unsafe fn heads_ptr_wide<const G: usize, E: Lane>(
    pa: *const E,
    n: usize,
    pb: *const f32,
    out: *mut f32,
    os: usize,
) {
    let mut acc = [_mm512_setzero_ps(); G];
    let mut i = 0;
    while i + 16 <= n {
        let a = E::load16(pa.add(i));
        for (g, c) in acc.iter_mut().enumerate() {
            *c = _mm512_fmadd_ps(a, _mm512_loadu_ps(pb.add(g * n + i)), *c);
        }
        i += 16;
    }
    let (acc0, acc1) = split_halves(acc);
    dot_tail::<G, E>(pa, n, pb, out, os, acc0, acc1, i);
}

/// [`heads_ptr_wide`] for `K` keys `ks` elements apart at once: each (key, head) register
/// takes the same FMAs in the same order, so every dot keeps its bits, while a query
/// head's 16 elements, loaded once, meet all `K` keys (one key at a time, the loads
/// outnumber the FMAs).
#[inline(always)]
unsafe fn keys_ptr_wide<const K: usize, const G: usize, E: Lane>(
    pa: *const E,
    ks: usize,
    n: usize,
    pb: *const f32,
    out: *mut f32,
    os: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); G]; K];
    let mut i = 0;
    while i + 16 <= n {
        let mut a = [_mm512_setzero_ps(); K];
        for (k, a) in a.iter_mut().enumerate() {
            *a = E::load16(pa.add(k * ks + i));
        }
        for g in 0..G {
            let q = _mm512_loadu_ps(pb.add(g * n + i));
            for (acc, a) in acc.iter_mut().zip(&a) {
                acc[g] = _mm512_fmadd_ps(*a, q, acc[g]);
            }
        }
        i += 16;
    }
    for (k, acc) in acc.iter().enumerate() {
        let (acc0, acc1) = split_halves(*acc);
        dot_tail::<G, E>(pa.add(k * ks), n, pb, out.add(k), os, acc0, acc1, i);
    }
}

/// The low and high 8 lanes of each register.
#[inline(always)]
unsafe fn split_halves<const G: usize>(v: [__m512; G]) -> ([__m256; G], [__m256; G]) {
    let mut lo = [_mm256_setzero_ps(); G];
    let mut hi = [_mm256_setzero_ps(); G];
    for g in 0..G {
        lo[g] = _mm512_castps512_ps256(v[g]);
        hi[g] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[g]), 1));
    }
    (lo, hi)
}

/// [`super::dot_heads_run`] in 512-bit registers ([`heads_ptr_wide`]): the same
/// bits.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX512-F; shapes as checked by the caller.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub unsafe fn dot_heads_run_wide<E: Lane>(
    keys: super::Rows<'_, E>,
    q: &[f32],
    heads: usize,
    out: &mut [f32],
    os: usize,
) {
    key_run::<true, E>(keys, q, heads, out, os)
}

/// [`super::axpy_heads_run`] in 512-bit registers ([`value_run_wide`]): the same bits.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX512-F; shapes as checked by the caller.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub unsafe fn axpy_heads_run_wide<E: Lane>(
    out: &mut [f32],
    heads: (usize, usize),
    w: &[f32],
    ws: usize,
    values: super::Rows<'_, E>,
) {
    value_runs::<true, E>(out, heads, w, ws, values)
}

/// [`value_run`] with each block of 16 outputs in one 512-bit register per head, four
/// blocks at a time while there are (each position's weights, broadcast once, then meet
/// four blocks of its values; every output register takes the same FMAs in the same
/// order either way).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn value_run_wide<const G: usize, E: Lane>(
    po: *mut f32,
    os: usize,
    pw: *const f32,
    ws: usize,
    pv: *const E,
    vs: usize,
    rows: usize,
    n: usize,
) {
    let mut i = 0;
    while i + 64 <= n {
        value_blocks_wide::<4, G, E>(po.add(i), os, pw, ws, pv.add(i), vs, rows);
        i += 64;
    }
    while i + 16 <= n {
        value_blocks_wide::<1, G, E>(po.add(i), os, pw, ws, pv.add(i), vs, rows);
        i += 16;
    }
    value_tail::<G, E>(po, os, pw, ws, pv, vs, rows, n, i);
}

/// `S` blocks of 16 outputs (from `po`, heads `os` apart) with every position of the run
/// added: `out += w · value`, one FMA per position in position order.
#[inline(always)]
unsafe fn value_blocks_wide<const S: usize, const G: usize, E: Lane>(
    po: *mut f32,
    os: usize,
    pw: *const f32,
    ws: usize,
    pv: *const E,
    vs: usize,
    rows: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); G]; S];
    for (s, acc) in acc.iter_mut().enumerate() {
        for (g, a) in acc.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(po.add(g * os + 16 * s));
        }
    }
    for k in 0..rows {
        let mut x = [_mm512_setzero_ps(); S];
        for (s, x) in x.iter_mut().enumerate() {
            *x = E::load16(pv.add(k * vs + 16 * s));
        }
        for g in 0..G {
            let w = _mm512_set1_ps(*pw.add(g * ws + k));
            for (acc, x) in acc.iter_mut().zip(&x) {
                acc[g] = _mm512_fmadd_ps(w, *x, acc[g]);
            }
        }
    }
    for (s, acc) in acc.iter().enumerate() {
        for (g, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(po.add(g * os + 16 * s), *a);
        }
    }
}

/// [`super::dot_heads_run`]: [`heads_ptr`] per key of the run.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; shapes as checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_heads_run<E: Lane>(
    keys: super::Rows<'_, E>,
    q: &[f32],
    heads: usize,
    out: &mut [f32],
    os: usize,
) {
    key_run::<false, E>(keys, q, heads, out, os)
}

/// Every key of the run against the `heads` query heads: [`heads_ptr`], or
/// [`heads_ptr_wide`] when `WIDE` (only inlined into functions compiled with AVX512-F).
#[inline(always)]
unsafe fn key_run<const WIDE: bool, E: Lane>(
    keys: super::Rows<'_, E>,
    q: &[f32],
    heads: usize,
    out: &mut [f32],
    os: usize,
) {
    #[inline(always)]
    unsafe fn one<const G: usize, const WIDE: bool, E: Lane>(
        a: *const E,
        n: usize,
        pq: *const f32,
        o: *mut f32,
        os: usize,
    ) {
        if WIDE {
            heads_ptr_wide::<G, E>(a, n, pq, o, os)
        } else {
            heads_ptr::<G, E>(a, n, pq, o, os)
        }
    }
    #[inline(always)]
    unsafe fn four<const G: usize, E: Lane>(
        a: *const E,
        ks: usize,
        n: usize,
        pq: *const f32,
        o: *mut f32,
        os: usize,
    ) {
        keys_ptr_wide::<4, G, E>(a, ks, n, pq, o, os)
    }
    let (pk, pq, po) = (keys.data.as_ptr(), q.as_ptr(), out.as_mut_ptr());
    let (n, ks) = (keys.dim, keys.stride);
    let mut first = 0;
    if WIDE {
        while first + 4 <= keys.rows {
            let (a, o) = (pk.add(first * ks), po.add(first));
            match heads {
                1 => four::<1, E>(a, ks, n, pq, o, os),
                2 => four::<2, E>(a, ks, n, pq, o, os),
                3 => four::<3, E>(a, ks, n, pq, o, os),
                _ => four::<4, E>(a, ks, n, pq, o, os),
            }
            first += 4;
        }
    }
    for k in first..keys.rows {
        let (a, o) = (pk.add(k * ks), po.add(k));
        match heads {
            1 => one::<1, WIDE, E>(a, n, pq, o, os),
            2 => one::<2, WIDE, E>(a, n, pq, o, os),
            3 => one::<3, WIDE, E>(a, n, pq, o, os),
            _ => one::<4, WIDE, E>(a, n, pq, o, os),
        }
    }
}

/// [`super::axpy_heads_run`].
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; shapes as checked by the caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_heads_run<E: Lane>(
    out: &mut [f32],
    heads: (usize, usize),
    w: &[f32],
    ws: usize,
    values: super::Rows<'_, E>,
) {
    value_runs::<false, E>(out, heads, w, ws, values)
}

/// The weighted values of the run added into the heads' outputs: [`value_run`], or
/// [`value_run_wide`] when `WIDE` (only inlined into functions compiled with AVX512-F).
#[inline(always)]
unsafe fn value_runs<const WIDE: bool, E: Lane>(
    out: &mut [f32],
    (os, heads): (usize, usize),
    w: &[f32],
    ws: usize,
    values: super::Rows<'_, E>,
) {
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn one<const G: usize, const WIDE: bool, E: Lane>(
        po: *mut f32,
        os: usize,
        pw: *const f32,
        ws: usize,
        pv: *const E,
        vs: usize,
        rows: usize,
        n: usize,
    ) {
        if WIDE {
            value_run_wide::<G, E>(po, os, pw, ws, pv, vs, rows, n)
        } else {
            value_run::<G, E>(po, os, pw, ws, pv, vs, rows, n)
        }
    }
    let (po, pw) = (out.as_mut_ptr(), w.as_ptr());
    let pv = values.data.as_ptr();
    let (n, vs, rows) = (values.dim, values.stride, values.rows);
    match heads {
        1 => one::<1, WIDE, E>(po, os, pw, ws, pv, vs, rows, n),
        2 => one::<2, WIDE, E>(po, os, pw, ws, pv, vs, rows, n),
        3 => one::<3, WIDE, E>(po, os, pw, ws, pv, vs, rows, n),
        _ => one::<4, WIDE, E>(po, os, pw, ws, pv, vs, rows, n),
    }
}

/// Outputs in blocks of 16 (then 8) elements held in registers while every position of
/// the run is added, each with the same `fma` as [`axpy_f16_heads`]; the last `n % 8`
/// elements as its scalar tail (multiply, then add).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `g` indexes the accumulators and the head offsets
#[allow(clippy::too_many_arguments)]
unsafe fn value_run<const G: usize, E: Lane>(
    po: *mut f32,
    os: usize,
    pw: *const f32,
    ws: usize,
    pv: *const E,
    vs: usize,
    rows: usize,
    n: usize,
) {
    let mut i = 0;
    while i + 16 <= n {
        let mut acc0 = [_mm256_setzero_ps(); G];
        let mut acc1 = [_mm256_setzero_ps(); G];
        for g in 0..G {
            acc0[g] = _mm256_loadu_ps(po.add(g * os + i));
            acc1[g] = _mm256_loadu_ps(po.add(g * os + i + 8));
        }
        for k in 0..rows {
            let p = pv.add(k * vs + i);
            let x0 = E::load8(p);
            let x1 = E::load8(p.add(8));
            for g in 0..G {
                let wg = _mm256_broadcast_ss(&*pw.add(g * ws + k));
                acc0[g] = _mm256_fmadd_ps(wg, x0, acc0[g]);
                acc1[g] = _mm256_fmadd_ps(wg, x1, acc1[g]);
            }
        }
        for g in 0..G {
            _mm256_storeu_ps(po.add(g * os + i), acc0[g]);
            _mm256_storeu_ps(po.add(g * os + i + 8), acc1[g]);
        }
        i += 16;
    }
    value_tail::<G, E>(po, os, pw, ws, pv, vs, rows, n, i);
}

/// The end of [`value_run`] from element `i` on (fewer than 16 left).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
#[allow(clippy::needless_range_loop)] // `g` indexes the accumulators and the head offsets
unsafe fn value_tail<const G: usize, E: Lane>(
    po: *mut f32,
    os: usize,
    pw: *const f32,
    ws: usize,
    pv: *const E,
    vs: usize,
    rows: usize,
    n: usize,
    mut i: usize,
) {
    if i + 8 <= n {
        let mut acc = [_mm256_setzero_ps(); G];
        for g in 0..G {
            acc[g] = _mm256_loadu_ps(po.add(g * os + i));
        }
        for k in 0..rows {
            let x = E::load8(pv.add(k * vs + i));
            for g in 0..G {
                let wg = _mm256_broadcast_ss(&*pw.add(g * ws + k));
                acc[g] = _mm256_fmadd_ps(wg, x, acc[g]);
            }
        }
        for g in 0..G {
            _mm256_storeu_ps(po.add(g * os + i), acc[g]);
        }
        i += 8;
    }
    for k in 0..rows {
        for d in i..n {
            let x = E::scalar(pv.add(k * vs + d));
            for g in 0..G {
                *po.add(g * os + d) += *pw.add(g * ws + k) * x;
            }
        }
    }
}

/// [`axpy_f16`] for up to `MAX_HEADS` heads at once, per head the same operations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `out` holds `w.len()` heads of `v.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy_f16_heads(out: &mut [f32], w: &[f32], v: &[f16]) {
    let n = v.len();
    let (po, pv) = (out.as_mut_ptr(), v.as_ptr() as *const u16);
    let g_count = w.len();
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_cvtph_ps(_mm_loadu_si128(pv.add(i) as *const __m128i));
        for (g, &wg) in w.iter().enumerate() {
            let o = po.add(g * n + i);
            _mm256_storeu_ps(
                o,
                _mm256_fmadd_ps(_mm256_set1_ps(wg), x, _mm256_loadu_ps(o)),
            );
        }
        i += 8;
    }
    for k in i..n {
        let x = v[k].to_f32();
        for g in 0..g_count {
            out[g * n + k] += w[g] * x;
        }
    }
}

/// Inlined into its AVX2 callers: as a call of its own it took a fifth of a long prompt's
/// time (one call per cached key and head).
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}
