//! The tile kernel's key scores over one key block: the block's keys, widened to f32 once per
//! tile, are transposed (`kt[d][k]`, [`KEY_BLOCK`] columns per row), so that every query head
//! of every row meets sixteen (or eight) keys per FMA, a broadcast query element times a row of
//! `kt`: no horizontal sum, several heads and rows per key load, and the work of widening and
//! transposing shared by the tile's rows.
//!
//! Each score is one chain of FMAs over the head's elements in order, `s = fma(q[d], k[d], s)`
//! from `s = 0`, in every lane of every width: the 512-bit, the 256-bit and the scalar kernels
//! give the same bits, and a score does not depend on which other heads, rows or keys share its
//! call (batch invariance).

use super::KEY_BLOCK;
use crate::ops::RowElem;

/// Elements of the heads taken per pass over a block's pairs: a strip of the transposed keys
/// (`D_STRIP x KEY_BLOCK` f32, 16 KiB) stays in the first-level cache while every pair meets
/// it, for heads of 128 or 256 elements too.
const D_STRIP: usize = 64;

/// Keys per vector of the widest kernel: a block's transposed keys are padded to a multiple
/// of this (the padding columns are zero and their scores unused).
pub const KEY_LANES: usize = 16;

/// `kt[d * KEY_BLOCK + k] = rows[k][d]` (widened to f32) for the `rows.len()` (a multiple of
/// [`KEY_LANES`], ≤ [`KEY_BLOCK`]) cached key rows, each at least `dim` long: an f16 cache's
/// rows as stored, widened on the way, or a block of f32 rows.
pub fn transpose_keys<T: RowElem>(rows: &[&[T]], dim: usize, kt: &mut [f32]) {
    let n = rows.len();
    assert!(
        n <= KEY_BLOCK
            && n.is_multiple_of(KEY_LANES)
            && rows.iter().all(|r| r.len() >= dim)
            && kt.len() >= dim * KEY_BLOCK,
        "bad key block shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::wide_tiles() {
        // SAFETY: `wide_tiles` implies AVX2, F16C and AVX512-F; shapes checked above.
        return unsafe { simd::transpose_keys_wide(rows, dim, kt) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2 and F16C; shapes checked above.
        return unsafe { simd::transpose_keys(rows, dim, kt) };
    }
    transpose_keys_scalar(rows, dim, kt)
}

/// Scalar twin of [`transpose_keys`] (a data move: the same values).
pub fn transpose_keys_scalar<T: RowElem>(rows: &[&[T]], dim: usize, kt: &mut [f32]) {
    for (k, row) in rows.iter().enumerate() {
        for (d, x) in row[..dim].iter().enumerate() {
            kt[d * KEY_BLOCK + k] = x.to_f32();
        }
    }
}

/// One query head's scores over a block: its query at `q[at..at + dim]`, its scores to
/// `scores[slot * KEY_BLOCK..]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScorePair {
    pub at: usize,
    pub slot: usize,
}

/// `scores[p.slot * KEY_BLOCK + k] = Σ_d q[p.at + d] · kt[d * KEY_BLOCK + k]` for every pair
/// `p` and key `k < n` of a transposed block ([`transpose_keys`]; columns up to `n` rounded up
/// to [`KEY_LANES`] are read, and may be written). Each score is the chain of FMAs over `d` in
/// order described in the module's documentation.
pub fn block_scores(
    q: &[f32],
    pairs: &[ScorePair],
    kt: &[f32],
    n: usize,
    dim: usize,
    scores: &mut [f32],
) {
    assert!(
        n <= KEY_BLOCK
            && kt.len() >= dim * KEY_BLOCK
            && pairs
                .iter()
                .all(|p| p.at + dim <= q.len() && (p.slot + 1) * KEY_BLOCK <= scores.len()),
        "bad block score shapes"
    );
    if n == 0 || dim == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::wide_tiles() {
        // SAFETY: `wide_tiles` implies AVX2, FMA and AVX512-F; shapes checked above.
        return unsafe { simd::block_scores_wide(q, pairs, kt, n, dim, scores) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2 and FMA; shapes checked above.
        return unsafe { simd::block_scores(q, pairs, kt, n, dim, scores) };
    }
    block_scores_scalar(q, pairs, kt, n, dim, scores)
}

/// Scalar twin of [`block_scores`]: the same FMAs in the same order, so the same bits (for
/// keys `k < n`).
pub fn block_scores_scalar(
    q: &[f32],
    pairs: &[ScorePair],
    kt: &[f32],
    n: usize,
    dim: usize,
    scores: &mut [f32],
) {
    for p in pairs {
        let qp = &q[p.at..p.at + dim];
        for k in 0..n {
            let mut s = 0f32;
            for (d, &x) in qp.iter().enumerate() {
                s = x.mul_add(kt[d * KEY_BLOCK + k], s);
            }
            scores[p.slot * KEY_BLOCK + k] = s;
        }
    }
}

/// Pairs [`lone_row_scores`] takes at once (its accumulators per sixteen keys).
pub const LONE_ROW_PAIRS: usize = 4;

/// Whether [`lone_row_scores`] runs for `n_pairs` pairs of heads `dim` long on this CPU (so a
/// caller can tell before gathering the rows).
pub fn lone_row_scores_run(n_pairs: usize, dim: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && crate::wide_tiles()
        && (1..=LONE_ROW_PAIRS).contains(&n_pairs)
        && dim > 0
        && dim.is_multiple_of(16)
}

/// How a cache stores the key rows [`lone_row_scores`] reads: f16 elements ([`F16Keys`]) or
/// Q8_0 blocks ([`Q8_0Keys`]); either is widened to the f32 values the tile's transposed block
/// holds ([`transpose_keys`] of f16 rows, or of [`crate::dequant_kv`]'s rows).
pub trait KeyRowFormat: Copy {
    /// What a row is a slice of.
    type Elem: Copy;
    /// Whether `row` holds a key of `dim` elements (`dim` a multiple of 16).
    fn holds(row: &[Self::Elem], dim: usize) -> bool;
    /// Elements `d0..d0 + 16` of the row at `row` as f32, `d0` a multiple of 16.
    ///
    /// # Safety
    /// AVX512-F; the row holds those elements ([`KeyRowFormat::holds`]).
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(row: *const Self::Elem, d0: usize) -> std::arch::x86_64::__m512;
}

/// Keys stored as f16 elements.
#[derive(Debug, Clone, Copy)]
pub struct F16Keys;

/// Keys stored as Q8_0 blocks (an f16 scale, 32 signed bytes), each element `q · d` as the
/// dequantizer computes it.
#[derive(Debug, Clone, Copy)]
pub struct Q8_0Keys;

impl KeyRowFormat for F16Keys {
    type Elem = half::f16;
    fn holds(row: &[half::f16], dim: usize) -> bool {
        row.len() >= dim
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(row: *const half::f16, d0: usize) -> std::arch::x86_64::__m512 {
        use crate::ops::Lane;
        half::f16::load16(row.add(d0))
    }
}

impl KeyRowFormat for Q8_0Keys {
    type Elem = u8;
    fn holds(row: &[u8], dim: usize) -> bool {
        dim.is_multiple_of(32) && row.len() >= dim / 32 * 34
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(row: *const u8, d0: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let block = row.add(d0 / 32 * 34);
        // The scale widened in every lane at once (a broadcast and one conversion, exact).
        let bits = i16::from_le_bytes([*block, *block.add(1)]);
        let d = _mm512_cvtph_ps(_mm256_set1_epi16(bits));
        let q = _mm_loadu_si128(block.add(2 + d0 % 32) as *const __m128i);
        // The dequantizer's product, `f32(q) * d`: one rounding, so the same bits.
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d)
    }
}

/// [`transpose_keys`] then [`block_scores`] for the pairs of one query row, straight from a
/// block's cached key rows (`rows.len()` a multiple of [`KEY_LANES`], the padding rows zero):
/// each sixteen keys by sixteen elements are widened and transposed in registers and meet
/// every pair there, so the transposed block never goes through memory (a decoding row reads
/// it once; the tile's rows share it). The same chains of FMAs, so the same bits. Returns
/// false, doing nothing, where it does not run: without the 512-bit kernels, with more than
/// [`LONE_ROW_PAIRS`] pairs, heads not a multiple of 16 long, or rows that do not hold them.
///
/// `ahead`: rows of the cache (of any element type) to ask the memory system for while it
/// computes, a few lines at each step (see [`super::prefetch`]): a hint, no bit depends on it.
pub fn lone_row_scores<F: KeyRowFormat, A>(
    rows: &[&[F::Elem]],
    dim: usize,
    q: &[f32],
    pairs: &[ScorePair],
    scores: &mut [f32],
    ahead: &[&[A]],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if lone_row_scores_run(pairs.len(), dim) && rows.iter().all(|r| F::holds(r, dim)) {
        let n = rows.len();
        assert!(
            n <= KEY_BLOCK
                && n.is_multiple_of(KEY_LANES)
                && pairs
                    .iter()
                    .all(|p| p.at + dim <= q.len() && (p.slot + 1) * KEY_BLOCK <= scores.len()),
            "bad lone-row score shapes"
        );
        // SAFETY: `wide_tiles` implies AVX2, FMA, F16C and AVX512-F; shapes checked above.
        unsafe {
            match pairs.len() {
                1 => simd::lone_row_scores_wide::<1, F, A>(rows, dim, q, pairs, scores, ahead),
                2 => simd::lone_row_scores_wide::<2, F, A>(rows, dim, q, pairs, scores, ahead),
                3 => simd::lone_row_scores_wide::<3, F, A>(rows, dim, q, pairs, scores, ahead),
                _ => simd::lone_row_scores_wide::<4, F, A>(rows, dim, q, pairs, scores, ahead),
            }
        }
        return true;
    }
    let _ = (rows, dim, q, pairs, scores, ahead);
    false
}

/// `s *= scale` for every score, returning the largest result (NaNs ignored, -inf when
/// there is none): the same products as the scalar loop and the same maximum (equal as a
/// number; a zero's sign may differ, which no later step can tell apart).
pub fn scale_and_max(s: &mut [f32], scale: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::wide_tiles() {
        // SAFETY: `wide_tiles` implies AVX2 and AVX512-F.
        return unsafe { simd::scale_and_max_wide(s, scale) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2.
        return unsafe { simd::scale_and_max(s, scale) };
    }
    scale_and_max_scalar(s, scale)
}

/// Scalar twin of [`scale_and_max`].
pub fn scale_and_max_scalar(s: &mut [f32], scale: f32) -> f32 {
    s.iter_mut().fold(f32::NEG_INFINITY, |m, x| {
        *x *= scale;
        m.max(*x)
    })
}

/// [`scale_and_max`] of up to [`MAX_HEADS`](crate::ops::MAX_HEADS) runs at once (a row's query
/// heads over one key block): run `g` is `s[g * stride..g * stride + n]`, its maximum to
/// `maxes[g]`; the same values as one call a run, the runs' steps interleaved in one call.
pub fn scale_and_max_runs(s: &mut [f32], stride: usize, n: usize, scale: f32, maxes: &mut [f32]) {
    let runs = maxes.len();
    assert!(
        runs <= crate::ops::MAX_HEADS
            && (runs == 0 || (stride >= n && s.len() >= (runs - 1) * stride + n)),
        "bad score run shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::wide_tiles() {
        // SAFETY: `wide_tiles` implies AVX2 and AVX512-F; shapes checked above.
        return unsafe { simd::scale_and_max_runs_wide(s, stride, n, scale, maxes) };
    }
    for (g, m) in maxes.iter_mut().enumerate() {
        *m = scale_and_max(&mut s[g * stride..g * stride + n], scale);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod simd;

#[cfg(test)]
mod tests {
    use half::f16;

    use super::super::tests::lcg;
    use super::*;

    #[test]
    fn scaling_and_max_match_the_scalar_twin() {
        let mut seed = 9;
        for n in 0..70 {
            for special in [None, Some(f32::NAN), Some(f32::INFINITY), Some(-0.0)] {
                let mut a: Vec<f32> = (0..n).map(|_| lcg(&mut seed) * 40.0).collect();
                if let (Some(x), true) = (special, n > 0) {
                    a[n / 2] = x;
                }
                let mut b = a.clone();
                let mb = scale_and_max_scalar(&mut b, 0.125);
                // The dispatch's choice, and each SIMD path this CPU has, whatever the
                // switches say.
                let mut paths: Vec<fn(&mut [f32], f32) -> f32> = vec![scale_and_max];
                #[cfg(target_arch = "x86_64")]
                {
                    if crate::cpu::avx2_in_hardware() {
                        // SAFETY: the CPU has AVX2.
                        paths.push(|s, k| unsafe { simd::scale_and_max(s, k) });
                    }
                    if crate::cpu::vnni_in_hardware() {
                        // SAFETY: the CPU has AVX2 and AVX512-F.
                        paths.push(|s, k| unsafe { simd::scale_and_max_wide(s, k) });
                    }
                }
                for path in paths {
                    let mut a = a.clone();
                    let ma = path(&mut a, 0.125);
                    assert!(
                        ma == mb || (ma.is_nan() && mb.is_nan()),
                        "{n} {special:?}: {ma} {mb}"
                    );
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b));
                }
            }
        }
    }

    /// Several runs at once give each run what one call gives it, for every run count and
    /// length, a NaN or an infinity included.
    #[test]
    fn scale_and_max_runs_match_the_scalar_twin() {
        let mut seed = 31;
        let stride = KEY_BLOCK;
        for runs in 0..=crate::ops::MAX_HEADS {
            for n in [0usize, 1, 7, 15, 16, 17, 31, 33, 48, 63, 64] {
                for special in [None, Some(f32::NAN), Some(f32::NEG_INFINITY)] {
                    let mut a: Vec<f32> = (0..crate::ops::MAX_HEADS * stride)
                        .map(|_| lcg(&mut seed) * 40.0)
                        .collect();
                    if let (Some(x), true) = (special, n > 0) {
                        a[n / 2] = x;
                    }
                    let mut b = a.clone();
                    let mut slow = vec![0f32; runs];
                    for (g, m) in slow.iter_mut().enumerate() {
                        *m = scale_and_max_scalar(&mut b[g * stride..g * stride + n], 0.125);
                    }
                    let mut fast = vec![0f32; runs];
                    scale_and_max_runs(&mut a, stride, n, 0.125, &mut fast);
                    for (f, s) in fast.iter().zip(&slow) {
                        assert!(f == s || (f.is_nan() && s.is_nan()), "{runs} {n}: {f} {s}");
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "{runs} {n} {special:?}");
                }
            }
        }
    }

    /// Every path transposes f16 rows (widened) and f32 rows to the same values, at heads
    /// of any length (16- and 8-element steps, element tails) and every block size.
    #[test]
    fn transposed_keys_are_the_rows_read_across() {
        let mut seed = 5;
        for dim in [1usize, 8, 12, 64, 96, 256] {
            for n in [16usize, 32, 48, 64] {
                let data: Vec<Vec<f16>> = (0..n)
                    .map(|_| {
                        (0..dim + 3)
                            .map(|_| f16::from_f32(lcg(&mut seed) * 9.0))
                            .collect()
                    })
                    .collect();
                let rows: Vec<&[f16]> = data.iter().map(|r| &r[1..]).collect();
                let widened: Vec<Vec<f32>> = rows
                    .iter()
                    .map(|r| r[..dim].iter().map(|x| x.to_f32()).collect())
                    .collect();
                let wide_rows: Vec<&[f32]> = widened.iter().map(|r| &r[..]).collect();
                let run = |f: &dyn Fn(&mut [f32])| {
                    let mut kt = vec![f32::NAN; dim * KEY_BLOCK];
                    f(&mut kt);
                    kt
                };
                let mut paths = vec![
                    run(&|kt| transpose_keys(&rows, dim, kt)),
                    run(&|kt| transpose_keys(&wide_rows, dim, kt)),
                    run(&|kt| transpose_keys_scalar(&rows, dim, kt)),
                ];
                #[cfg(target_arch = "x86_64")]
                if crate::has_avx2_fma_f16c() {
                    // SAFETY (both): the CPU has AVX2 and F16C.
                    paths.push(run(&|kt| unsafe { simd::transpose_keys(&rows, dim, kt) }));
                    paths.push(run(&|kt| unsafe {
                        simd::transpose_keys(&wide_rows, dim, kt)
                    }));
                }
                for path in &paths {
                    for (k, row) in widened.iter().enumerate() {
                        for (d, x) in row.iter().enumerate() {
                            let got = path[d * KEY_BLOCK + k];
                            assert_eq!(got.to_bits(), x.to_bits(), "{dim} {n}");
                        }
                    }
                }
            }
        }
    }

    /// Asserts [`lone_row_scores`] over `rows` (the first `n` keys, the rest padding) gives
    /// the scalar tile's bits over the same keys widened (`wide`), for one to four pairs;
    /// false where that kernel does not run on this CPU.
    fn lone_row_matches_tile<F: KeyRowFormat>(
        rows: &[&[F::Elem]],
        wide: &[&[f32]],
        n: usize,
        dim: usize,
        seed: &mut u64,
    ) -> bool {
        for n_pairs in 1..=LONE_ROW_PAIRS {
            let q: Vec<f32> = (0..n_pairs * dim + 1).map(|_| lcg(seed)).collect();
            let pairs: Vec<ScorePair> = (0..n_pairs)
                .map(|p| ScorePair {
                    at: p * dim + (p % 2),
                    slot: (p * 3) % n_pairs,
                })
                .collect();
            let mut kt = vec![0f32; dim * KEY_BLOCK];
            transpose_keys_scalar(wide, dim, &mut kt);
            let mut want = vec![0f32; n_pairs * KEY_BLOCK];
            block_scores_scalar(&q, &pairs, &kt, n, dim, &mut want);
            let mut got = vec![0f32; n_pairs * KEY_BLOCK];
            // The rows themselves as the rows to ask for ahead: a hint, no bit depends on it.
            if !lone_row_scores::<F, _>(rows, dim, &q, &pairs, &mut got, rows) {
                return false;
            }
            for p in &pairs {
                for k in 0..n {
                    let at = p.slot * KEY_BLOCK + k;
                    assert_eq!(got[at].to_bits(), want[at].to_bits(), "{dim} {n} {p:?}");
                }
            }
        }
        true
    }

    /// A lone row's fused scores are the transposed block's, bit for bit, for f16 keys of
    /// heads 16-256 long, one to four pairs, blocks partly padded.
    #[test]
    fn lone_row_scores_equal_the_transposed_blocks() {
        let mut seed = 5;
        for dim in [16usize, 64, 256] {
            for n in [1usize, 16, 33, 64] {
                let padded = n.next_multiple_of(KEY_LANES);
                let mut keys: Vec<f16> = (0..padded * dim)
                    .map(|_| f16::from_f32(lcg(&mut seed)))
                    .collect();
                keys[n * dim..].iter_mut().for_each(|x| *x = f16::ZERO);
                let widened: Vec<f32> = keys.iter().map(|x| x.to_f32()).collect();
                let rows: Vec<&[f16]> = keys.chunks_exact(dim).collect();
                let wide: Vec<&[f32]> = widened.chunks_exact(dim).collect();
                if !lone_row_matches_tile::<F16Keys>(&rows, &wide, n, dim, &mut seed) {
                    return;
                }
            }
        }
    }

    /// The same for Q8_0 key rows: the scores of the dequantizer's rows, transposed, bit for
    /// bit (scales from tiny to large, every byte value).
    #[test]
    fn lone_row_scores_of_q8_0_rows_equal_the_dequantized_blocks() {
        let mut seed = 7;
        for dim in [32usize, 64, 256] {
            for n in [1usize, 16, 33, 64] {
                let padded = n.next_multiple_of(KEY_LANES);
                let row_bytes = dim / 32 * 34;
                let mut keys = vec![0u8; padded * row_bytes];
                for (b, block) in keys[..n * row_bytes].chunks_exact_mut(34).enumerate() {
                    let d = [1e-6f32, 0.01, 3.0][b % 3] * lcg(&mut seed);
                    block[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                    for x in &mut block[2..] {
                        *x = (lcg(&mut seed) * 256.0) as i32 as u8;
                    }
                }
                let mut widened = vec![0f32; padded * dim];
                crate::dequant_kv::dequantize_q8_0_rows_scalar(&keys, &mut widened);
                let rows: Vec<&[u8]> = keys.chunks_exact(row_bytes).collect();
                let wide: Vec<&[f32]> = widened.chunks_exact(dim).collect();
                if !lone_row_matches_tile::<Q8_0Keys>(&rows, &wide, n, dim, &mut seed) {
                    return;
                }
            }
        }
    }

    /// Every width gives the scalar twin's bits, for any number of keys and pairs, heads of
    /// any length, and values from tiny to large; and a pair's scores do not depend on the
    /// pairs beside it.
    #[test]
    fn block_scores_match_the_scalar_twin_bit_for_bit() {
        let mut seed = 11;
        for dim in [1usize, 3, 16, 64, 80, 128, 256] {
            for n in [1usize, 7, 16, 17, 33, 63, 64] {
                for n_pairs in [1usize, 2, 3, 4, 5, 9] {
                    let scale = [1e-20f32, 1.0, 1e15][(n + dim) % 3];
                    let q: Vec<f32> = (0..n_pairs * dim + 5)
                        .map(|_| lcg(&mut seed) * scale)
                        .collect();
                    let padded = n.next_multiple_of(KEY_LANES);
                    let mut rows: Vec<f32> = (0..padded * dim).map(|_| lcg(&mut seed)).collect();
                    rows[n * dim..].iter_mut().for_each(|x| *x = 0.0);
                    let mut kt = vec![0f32; dim * KEY_BLOCK];
                    let row_refs: Vec<&[f32]> = rows.chunks_exact(dim).collect();
                    transpose_keys(&row_refs, dim, &mut kt);
                    // Pairs in a shuffled order of slots, queries at odd offsets.
                    let pairs: Vec<ScorePair> = (0..n_pairs)
                        .map(|p| ScorePair {
                            at: p * dim + (p % 2),
                            slot: (p * 7) % n_pairs,
                        })
                        .collect();
                    let mut got = vec![0f32; n_pairs * KEY_BLOCK];
                    let mut want = got.clone();
                    block_scores(&q, &pairs, &kt, n, dim, &mut got);
                    block_scores_scalar(&q, &pairs, &kt, n, dim, &mut want);
                    #[cfg(target_arch = "x86_64")]
                    let narrow = crate::has_avx2_fma_f16c().then(|| {
                        let mut out = vec![0f32; n_pairs * KEY_BLOCK];
                        // SAFETY: the CPU has AVX2 and FMA.
                        unsafe { simd::block_scores(&q, &pairs, &kt, n, dim, &mut out) };
                        out
                    });
                    #[cfg(not(target_arch = "x86_64"))]
                    let narrow: Option<Vec<f32>> = None;
                    for p in &pairs {
                        let mut alone = vec![0f32; n_pairs * KEY_BLOCK];
                        block_scores(&q, std::slice::from_ref(p), &kt, n, dim, &mut alone);
                        for k in 0..n {
                            let at = p.slot * KEY_BLOCK + k;
                            assert_eq!(got[at].to_bits(), want[at].to_bits(), "{dim} {n} {p:?}");
                            assert_eq!(alone[at].to_bits(), want[at].to_bits());
                            if let Some(narrow) = &narrow {
                                assert_eq!(narrow[at].to_bits(), want[at].to_bits());
                            }
                        }
                    }
                }
            }
        }
    }
}
