//! The AVX2 and AVX-512 forms of `block.rs`'s score kernels, each with its scalar twin there.

use std::arch::x86_64::*;

use super::{ScorePair, D_STRIP, KEY_BLOCK};
use crate::ops::Lane;

/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn scale_and_max(s: &mut [f32], scale: f32) -> f32 {
    let (p, n) = (s.as_mut_ptr(), s.len());
    let sv = _mm256_set1_ps(scale);
    // `max(x, m)` returns `m` when `x` is NaN, as `f32::max` ignores it.
    let mut mv = _mm256_set1_ps(f32::NEG_INFINITY);
    let body = n / 8 * 8;
    for i in (0..body).step_by(8) {
        let x = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), sv);
        _mm256_storeu_ps(p.add(i), x);
        mv = _mm256_max_ps(x, mv);
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), mv);
    let m = lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    super::scale_and_max_scalar(&mut s[body..], scale).max(m)
}

/// [`super::scale_and_max`] sixteen lanes at a time: the same products, and the maximum is
/// exact in any order (a NaN score is skipped, as `f32::max` skips it: `max(x, m)` returns `m`).
/// The one-run case of [`scale_and_max_runs_wide`].
///
/// # Safety
/// The CPU must support AVX2 and AVX512-F.
#[target_feature(enable = "avx2,avx512f")]
pub unsafe fn scale_and_max_wide(s: &mut [f32], scale: f32) -> f32 {
    let mut max = [0f32];
    scale_and_max_runs::<1>(s, s.len(), s.len(), scale, &mut max);
    max[0]
}

/// [`super::scale_and_max_runs`]: each run sixteen lanes at a time (its tail by the scalar
/// twin), the runs' sixteen-lane steps interleaved.
///
/// # Safety
/// The CPU must support AVX2 and AVX512-F; shapes as checked by the caller.
#[target_feature(enable = "avx2,avx512f")]
pub unsafe fn scale_and_max_runs_wide(
    s: &mut [f32],
    stride: usize,
    n: usize,
    scale: f32,
    maxes: &mut [f32],
) {
    match maxes.len() {
        0 => {}
        1 => scale_and_max_runs::<1>(s, stride, n, scale, maxes),
        2 => scale_and_max_runs::<2>(s, stride, n, scale, maxes),
        3 => scale_and_max_runs::<3>(s, stride, n, scale, maxes),
        _ => scale_and_max_runs::<4>(s, stride, n, scale, maxes),
    }
}

/// [`scale_and_max_runs_wide`] for `R` runs.
#[inline(always)]
unsafe fn scale_and_max_runs<const R: usize>(
    s: &mut [f32],
    stride: usize,
    n: usize,
    scale: f32,
    maxes: &mut [f32],
) {
    let p = s.as_mut_ptr();
    let sv = _mm512_set1_ps(scale);
    let mut mv = [_mm512_set1_ps(f32::NEG_INFINITY); R];
    let body = n / 16 * 16;
    for i in (0..body).step_by(16) {
        for (g, m) in mv.iter_mut().enumerate() {
            let q = p.add(g * stride + i);
            let x = _mm512_mul_ps(_mm512_loadu_ps(q), sv);
            _mm512_storeu_ps(q, x);
            *m = _mm512_max_ps(x, *m);
        }
    }
    for (g, m) in mv.into_iter().enumerate() {
        // SAFETY: run `g` lies within `s` (checked by the caller).
        let tail = std::slice::from_raw_parts_mut(p.add(g * stride + body), n - body);
        maxes[g] = super::scale_and_max_scalar(tail, scale).max(_mm512_reduce_max_ps(m));
    }
}

/// [`super::transpose_keys`] sixteen keys by sixteen elements at a time.
///
/// # Safety
/// The CPU must support AVX2, F16C and AVX512-F; shapes as checked by the caller.
#[target_feature(enable = "avx2,f16c,avx512f")]
pub unsafe fn transpose_keys_wide<E: Lane>(rows: &[&[E]], dim: usize, kt: &mut [f32]) {
    let dst = kt.as_mut_ptr();
    let body = dim / 16 * 16;
    for (k0, group) in rows.chunks_exact(16).enumerate().map(|(g, r)| (16 * g, r)) {
        let ptrs: [*const E; 16] = std::array::from_fn(|i| group[i].as_ptr());
        for d0 in (0..body).step_by(16) {
            let r: [__m512; 16] = std::array::from_fn(|i| E::load16(ptrs[i].add(d0)));
            for (i, t) in transpose16(r).into_iter().enumerate() {
                _mm512_storeu_ps(dst.add((d0 + i) * KEY_BLOCK + k0), t);
            }
        }
        transpose_tail(&ptrs, body..dim, dst.add(k0));
    }
}

/// [`super::lone_row_scores`] for `MR` pairs.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX512-F; shapes as checked by the caller.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub unsafe fn lone_row_scores_wide<const MR: usize, F: super::KeyRowFormat, A>(
    rows: &[&[F::Elem]],
    dim: usize,
    q: &[f32],
    pairs: &[ScorePair],
    scores: &mut [f32],
    ahead: &[&[A]],
) {
    let (pq, ps) = (q.as_ptr(), scores.as_mut_ptr());
    let qs: [*const f32; MR] = std::array::from_fn(|p| pq.add(pairs[p].at));
    // The `ahead` rows, spread evenly over the steps (a step: sixteen keys by sixteen
    // elements), so that the memory system always has some lines to fetch while the
    // arithmetic runs, and no step waits on a long queue of them.
    let steps = rows.len() / 16 * dim.div_ceil(16);
    let per_step = ahead.len().div_ceil(steps.max(1));
    let mut pending = ahead.iter();
    for (k0, group) in rows.chunks_exact(16).enumerate().map(|(g, r)| (16 * g, r)) {
        let ptrs: [*const F::Elem; 16] = std::array::from_fn(|i| group[i].as_ptr());
        let mut acc = [_mm512_setzero_ps(); MR];
        for d0 in (0..dim).step_by(16) {
            for row in pending.by_ref().take(per_step) {
                super::super::prefetch(row);
            }
            let mut r = [_mm512_setzero_ps(); 16];
            for (x, p) in r.iter_mut().zip(&ptrs) {
                *x = F::load16(*p, d0);
            }
            // Column `i`: element `d0 + i` of the sixteen keys, as the tile's `kt` row.
            for (i, column) in transpose16(r).iter().enumerate() {
                for (a, qp) in acc.iter_mut().zip(&qs) {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*qp.add(d0 + i)), *column, *a);
                }
            }
        }
        for (a, p) in acc.iter().zip(pairs) {
            _mm512_storeu_ps(ps.add(p.slot * KEY_BLOCK + k0), *a);
        }
    }
}

/// [`super::transpose_keys`] eight keys by eight elements at a time.
///
/// # Safety
/// The CPU must support AVX2 and F16C; shapes as checked by the caller.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn transpose_keys<E: Lane>(rows: &[&[E]], dim: usize, kt: &mut [f32]) {
    let dst = kt.as_mut_ptr();
    let body = dim / 8 * 8;
    for (k0, group) in rows.chunks_exact(8).enumerate().map(|(g, r)| (8 * g, r)) {
        let ptrs: [*const E; 8] = std::array::from_fn(|i| group[i].as_ptr());
        for d0 in (0..body).step_by(8) {
            let r: [__m256; 8] = std::array::from_fn(|i| E::load8(ptrs[i].add(d0)));
            for (i, t) in transpose8(r).into_iter().enumerate() {
                _mm256_storeu_ps(dst.add((d0 + i) * KEY_BLOCK + k0), t);
            }
        }
        transpose_tail(&ptrs, body..dim, dst.add(k0));
    }
}

/// The elements `tail` of each row of a group, one at a time, into the group's columns
/// from `dst`.
#[inline(always)]
unsafe fn transpose_tail<E: Lane>(ptrs: &[*const E], tail: std::ops::Range<usize>, dst: *mut f32) {
    for d in tail {
        for (i, p) in ptrs.iter().enumerate() {
            *dst.add(d * KEY_BLOCK + i) = E::scalar(p.add(d));
        }
    }
}

/// A 16x16 transpose: row `c` of the result is lane `c` of every input, in order
/// (pairs interleaved, then quads, then 128-bit lanes gathered across four registers).
#[inline(always)]
pub(crate) unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let a: [__m512; 16] = std::array::from_fn(|i| {
        let (x, y) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(x, y)
        } else {
            _mm512_unpackhi_ps(x, y)
        }
    });
    // b[4j + e]: in 128-bit lane L, column 4L + e of rows 4j..4j + 4.
    let b: [__m512; 16] = std::array::from_fn(|i| {
        let (j, e) = (i / 4, i % 4);
        let (x, y) = (a[4 * j + e / 2], a[4 * j + 2 + e / 2]);
        if e % 2 == 0 {
            _mm512_shuffle_ps::<0x44>(x, y)
        } else {
            _mm512_shuffle_ps::<0xEE>(x, y)
        }
    });
    let mut out = [_mm512_setzero_ps(); 16];
    for e in 0..4 {
        let (b0, b1, b2, b3) = (b[e], b[4 + e], b[8 + e], b[12 + e]);
        let c0 = _mm512_shuffle_f32x4::<0x44>(b0, b1);
        let c1 = _mm512_shuffle_f32x4::<0xEE>(b0, b1);
        let c2 = _mm512_shuffle_f32x4::<0x44>(b2, b3);
        let c3 = _mm512_shuffle_f32x4::<0xEE>(b2, b3);
        out[e] = _mm512_shuffle_f32x4::<0x88>(c0, c2);
        out[4 + e] = _mm512_shuffle_f32x4::<0xDD>(c0, c2);
        out[8 + e] = _mm512_shuffle_f32x4::<0x88>(c1, c3);
        out[12 + e] = _mm512_shuffle_f32x4::<0xDD>(c1, c3);
    }
    out
}

/// [`transpose16`] of 32-bit integers.
#[inline(always)]
pub(crate) unsafe fn transpose16_epi32(r: [__m512i; 16]) -> [__m512i; 16] {
    // SAFETY: the same 64 bytes each, read as floats and back (a `map` closure would not
    // inherit the caller's target features, and its casts would be calls).
    std::mem::transmute::<[__m512; 16], [__m512i; 16]>(transpose16(std::mem::transmute::<
        [__m512i; 16],
        [__m512; 16],
    >(r)))
}

/// An 8x8 transpose: row `i` of the result is lane `i` of every input, in order.
#[inline(always)]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// [`super::block_scores`] in 512-bit registers: four pairs at a time against up to four
/// vectors of sixteen keys (sixteen accumulators, each key vector loaded once per element
/// for all four pairs).
///
/// # Safety
/// The CPU must support AVX2, FMA and AVX512-F; shapes as checked by the caller.
#[target_feature(enable = "avx2,fma,avx512f")]
pub unsafe fn block_scores_wide(
    q: &[f32],
    pairs: &[ScorePair],
    kt: &[f32],
    n: usize,
    dim: usize,
    scores: &mut [f32],
) {
    let (pq, pk, ps) = (q.as_ptr(), kt.as_ptr(), scores.as_mut_ptr());
    let vectors = n.div_ceil(16);
    for d0 in (0..dim).step_by(D_STRIP) {
        let ds = (d0, (d0 + D_STRIP).min(dim));
        for group in pairs.chunks(4) {
            macro_rules! run {
                ($mr:literal) => {
                    match vectors {
                        1 => scores_wide::<$mr, 1>(pq, group, pk, ds, ps),
                        2 => scores_wide::<$mr, 2>(pq, group, pk, ds, ps),
                        3 => scores_wide::<$mr, 3>(pq, group, pk, ds, ps),
                        _ => scores_wide::<$mr, 4>(pq, group, pk, ds, ps),
                    }
                };
            }
            match group.len() {
                1 => run!(1),
                2 => run!(2),
                3 => run!(3),
                _ => run!(4),
            }
        }
    }
}

/// The elements `d0..d1` of a group's scores: from zero for the first strip, else on from
/// the partial sums the strip before left in `scores` (an f32 stored and loaded unchanged,
/// so the chain of FMAs is the same as in one pass).
#[inline(always)]
unsafe fn scores_wide<const MR: usize, const NV: usize>(
    pq: *const f32,
    group: &[ScorePair],
    pk: *const f32,
    (d0, d1): (usize, usize),
    ps: *mut f32,
) {
    let qs: [*const f32; MR] = std::array::from_fn(|p| pq.add(group[p].at));
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    if d0 > 0 {
        for (acc, p) in acc.iter_mut().zip(group) {
            let out = ps.add(p.slot * KEY_BLOCK);
            for (v, a) in acc.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(out.add(16 * v));
            }
        }
    }
    for d in d0..d1 {
        let row = pk.add(d * KEY_BLOCK);
        let k: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(row.add(16 * v)));
        for (acc, qp) in acc.iter_mut().zip(&qs) {
            let b = _mm512_set1_ps(*qp.add(d));
            for (a, k) in acc.iter_mut().zip(&k) {
                *a = _mm512_fmadd_ps(b, *k, *a);
            }
        }
    }
    for (acc, p) in acc.iter().zip(group) {
        let out = ps.add(p.slot * KEY_BLOCK);
        for (v, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(16 * v), *a);
        }
    }
}

/// [`super::block_scores`] in 256-bit registers: two pairs at a time against up to four
/// vectors of eight keys, the block's columns in halves of 32.
///
/// # Safety
/// The CPU must support AVX2 and FMA; shapes as checked by the caller.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn block_scores(
    q: &[f32],
    pairs: &[ScorePair],
    kt: &[f32],
    n: usize,
    dim: usize,
    scores: &mut [f32],
) {
    let (pq, pk, ps) = (q.as_ptr(), kt.as_ptr(), scores.as_mut_ptr());
    for d0 in (0..dim).step_by(D_STRIP) {
        let ds = (d0, (d0 + D_STRIP).min(dim));
        for half in 0..n.div_ceil(32) {
            let vectors = (n - 32 * half).div_ceil(8).min(4);
            let col = 32 * half;
            for group in pairs.chunks(2) {
                macro_rules! run {
                    ($mr:literal) => {
                        match vectors {
                            1 => scores_narrow::<$mr, 1>(pq, group, pk, col, ds, ps),
                            2 => scores_narrow::<$mr, 2>(pq, group, pk, col, ds, ps),
                            3 => scores_narrow::<$mr, 3>(pq, group, pk, col, ds, ps),
                            _ => scores_narrow::<$mr, 4>(pq, group, pk, col, ds, ps),
                        }
                    };
                }
                match group.len() {
                    1 => run!(1),
                    _ => run!(2),
                }
            }
        }
    }
}

/// [`scores_wide`] in 256-bit registers, for the columns from `col`.
#[inline(always)]
unsafe fn scores_narrow<const MR: usize, const NV: usize>(
    pq: *const f32,
    group: &[ScorePair],
    pk: *const f32,
    col: usize,
    (d0, d1): (usize, usize),
    ps: *mut f32,
) {
    let qs: [*const f32; MR] = std::array::from_fn(|p| pq.add(group[p].at));
    let mut acc = [[_mm256_setzero_ps(); NV]; MR];
    if d0 > 0 {
        for (acc, p) in acc.iter_mut().zip(group) {
            let out = ps.add(p.slot * KEY_BLOCK + col);
            for (v, a) in acc.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(out.add(8 * v));
            }
        }
    }
    for d in d0..d1 {
        let row = pk.add(d * KEY_BLOCK + col);
        let k: [__m256; NV] = std::array::from_fn(|v| _mm256_loadu_ps(row.add(8 * v)));
        for (acc, qp) in acc.iter_mut().zip(&qs) {
            let b = _mm256_set1_ps(*qp.add(d));
            for (a, k) in acc.iter_mut().zip(&k) {
                *a = _mm256_fmadd_ps(b, *k, *a);
            }
        }
    }
    for (acc, p) in acc.iter().zip(group) {
        let out = ps.add(p.slot * KEY_BLOCK + col);
        for (v, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(8 * v), *a);
        }
    }
}
