//! Candidates and the selections the chain needs without sorting a whole vocabulary: the `k`
//! largest logits (a running threshold with periodic partial selection), and the smallest prefix
//! in some order that holds a given probability mass (a histogram of the mass by key, then a
//! sort of the buckets that hold the prefix only); and a vectorisable `exp` for softmax.

use std::cmp::Ordering;

/// A token still in the running, with its (processed) logit and, once a stage computed it, its
/// probability among the candidates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cand {
    pub id: u32,
    pub logit: f32,
    pub p: f32,
    /// A stage's sort key (typical: distance of the surprisal to the entropy).
    pub key: f32,
}

impl Cand {
    #[inline]
    pub fn new(id: u32, logit: f32) -> Cand {
        Cand {
            id,
            logit,
            p: 0.0,
            key: 0.0,
        }
    }
}

/// Most likely first; equal logits: lower id first (a total order, so results never depend on
/// the path taken to them).
pub(crate) fn by_logit_desc(a: &Cand, b: &Cand) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// `x` with NaN as `-inf` and `+inf` as `f32::MAX`: logits the chain can always order and
/// exponentiate.
#[inline]
pub(crate) fn tame(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x.min(f32::MAX)
    }
}

/// The `k` largest finite entries of `logits` (k >= 1) into `out`, sorted by [`by_logit_desc`].
/// Linear time: entries at or below the running k-th value are skipped, and the buffer is cut
/// back to `k` by a partial selection whenever it fills.
pub(crate) fn top_k_of(logits: &[f32], k: usize, out: &mut Vec<Cand>) {
    out.clear();
    if k == 0 {
        return;
    }
    let cap = (2 * k).max(k + 256);
    let mut threshold = f32::NEG_INFINITY;
    for (i, &logit) in logits.iter().enumerate() {
        // Scanning in id order, an entry equal to the k-th kept one comes after it in the order.
        if logit > threshold {
            out.push(Cand::new(i as u32, logit));
            if out.len() == cap {
                out.select_nth_unstable_by(k - 1, by_logit_desc);
                out.truncate(k);
                threshold = out[k - 1].logit;
            }
        }
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, by_logit_desc);
        out.truncate(k);
    }
    out.sort_unstable_by(by_logit_desc);
}

/// Cuts `cand` to its `k` first entries in [`by_logit_desc`] order (sorted).
pub(crate) fn keep_top_k(cand: &mut Vec<Cand>, k: usize) {
    if cand.len() > k {
        if k > 0 {
            cand.select_nth_unstable_by(k - 1, by_logit_desc);
        }
        cand.truncate(k);
    }
    cand.sort_unstable_by(by_logit_desc);
}

/// Buckets of the mass histogram of [`mass_prefix`].
const BUCKETS: usize = 512;
/// Below this many candidates [`mass_prefix`] simply sorts them all.
const SORT_ALL: usize = 1024;

/// Reorders `cand` so that it starts with the smallest prefix, in the order `cmp`, whose
/// probabilities (`p`) add up to at least `mass`, sorted; returns that prefix's length (at
/// least 1 when `cand` is not empty; all of it when the mass is never reached).
///
/// `key` must be non-decreasing along `cmp` and >= 0 (NaN or infinite keys go last). The mass
/// is histogrammed by key in one pass; only the candidates of the buckets up to the one where it
/// reaches `mass` are then sorted.
pub(crate) fn mass_prefix(
    cand: &mut [Cand],
    mass: f64,
    key: impl Fn(&Cand) -> f32,
    cmp: impl Fn(&Cand, &Cand) -> Ordering + Copy,
) -> usize {
    let n = cand.len();
    if n <= SORT_ALL {
        cand.sort_unstable_by(cmp);
        return prefix_reaching(cand, mass).unwrap_or(n);
    }
    let max_key = cand
        .iter()
        .map(&key)
        .filter(|k| k.is_finite())
        .fold(0.0f32, f32::max);
    let inv_width = if max_key > 0.0 {
        (BUCKETS - 1) as f32 / max_key
    } else {
        0.0
    };
    // Monotone in the key (and so along `cmp`); NaN and infinite keys land in the last bucket.
    let bucket = |c: &Cand| -> usize {
        let k = key(c);
        if k.is_finite() {
            ((k * inv_width) as usize).min(BUCKETS - 1)
        } else {
            BUCKETS - 1
        }
    };
    let mut hist = [0.0f64; BUCKETS];
    for c in cand.iter() {
        hist[bucket(c)] += f64::from(c.p);
    }
    let mut acc = 0.0;
    let mut last = BUCKETS - 1;
    for (b, &m) in hist.iter().enumerate() {
        acc += m;
        if acc >= mass {
            last = b;
            break;
        }
    }
    loop {
        // Move the candidates of buckets 0..=last to the front.
        let mut m = 0;
        for i in 0..n {
            if bucket(&cand[i]) <= last {
                cand.swap(i, m);
                m += 1;
            }
        }
        cand[..m].sort_unstable_by(cmp);
        if let Some(len) = prefix_reaching(&cand[..m], mass) {
            return len;
        }
        if m == n || last == BUCKETS - 1 {
            return n;
        }
        // The histogram's sum and the prefix's differ in rounding: take one more bucket.
        last += 1;
    }
}

/// Length of the shortest prefix whose probabilities add up to `mass`.
fn prefix_reaching(cand: &[Cand], mass: f64) -> Option<usize> {
    let mut acc = 0.0f64;
    for (i, c) in cand.iter().enumerate() {
        acc += f64::from(c.p);
        if acc >= mass {
            return Some(i + 1);
        }
    }
    None
}

/// `e^x` for `x <= 0` (a logit minus the maximum), within 2 ulp of `f32::exp`; 0 below -87
/// (and for -inf and NaN). Branch-free, so loops over it vectorise.
#[inline(always)]
pub(crate) fn exp_neg(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 0.0);
    // n + ROUND holds the integer n in its low mantissa bits: integer operations from there on
    // (a float-to-int conversion would not vectorise).
    let t = xc * std::f32::consts::LOG2_E + ROUND;
    let n_bits = t.to_bits().wrapping_sub(ROUND.to_bits());
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    // Cephes' expf polynomial on |r| <= ln 2 / 2.
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if x >= -87.0 {
        y * scale
    } else {
        0.0
    }
}

/// Lanes of the vectorisable reductions below.
const LANES: usize = 8;

/// The largest value (NaN ignored; `-inf` for none), in independent lanes so that it vectorises.
pub(crate) fn max_of(values: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.max(v);
        }
    }
    let mut max = acc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for &v in tail {
        max = max.max(v);
    }
    max
}

/// The smallest value (NaN ignored; `+inf` for none), vectorised like [`max_of`].
pub(crate) fn min_of(values: &[f32]) -> f32 {
    let mut acc = [f32::INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = a.min(v);
        }
    }
    let mut min = acc.iter().copied().fold(f32::INFINITY, f32::min);
    for &v in tail {
        min = min.min(v);
    }
    min
}

/// `Σ e_i (s * values_i - top)` over the `e_i > 0` (the others may have infinite values), in
/// f64 lanes.
pub(crate) fn weighted_shift_sum(values: &[f32], exps: &[f32], s: f32, top: f32) -> f64 {
    let term = |v: f32, e: f32| {
        if e > 0.0 {
            f64::from(e) * f64::from(v * s - top)
        } else {
            0.0
        }
    };
    let mut acc = [0.0f64; LANES];
    let vc = values.chunks_exact(LANES);
    let ec = exps.chunks_exact(LANES);
    let tail: f64 = vc
        .remainder()
        .iter()
        .zip(ec.remainder())
        .map(|(&v, &e)| term(v, e))
        .sum();
    for (v, e) in vc.zip(ec) {
        for ((a, &v), &e) in acc.iter_mut().zip(v).zip(e) {
            *a += term(v, e);
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// Index of the largest value, the first on ties; `None` when every value is `-inf` or NaN.
pub(crate) fn first_max(values: &[f32]) -> Option<usize> {
    let max = max_of(values);
    if max == f32::NEG_INFINITY {
        return None;
    }
    values.iter().position(|&v| v == max)
}

/// `out[i] = e^(s * values[i] - top)` (0 for NaN and `-inf`), vectorised; returns their sum
/// (in f64, in independent lanes).
pub(crate) fn exps_into(values: &[f32], s: f32, top: f32, out: &mut Vec<f32>) -> f64 {
    out.clear();
    out.extend(values.iter().map(|&v| exp_neg(v * s - top)));
    let mut acc = [0.0f64; LANES];
    let chunks = out.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &e) in acc.iter_mut().zip(c) {
            *a += f64::from(e);
        }
    }
    acc.iter().sum::<f64>() + tail.iter().map(|&e| f64::from(e)).sum::<f64>()
}

/// Probabilities of the candidates from their logits (shifted by the maximum, summed in f64).
/// Returns the maximum logit and the sum of the shifted exponentials.
pub(crate) fn softmax(cand: &mut [Cand]) -> (f32, f64) {
    let max = cand
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for c in cand.iter_mut() {
        let e = exp_neg(c.logit - max);
        c.p = e;
        sum += f64::from(e);
    }
    if sum > 0.0 && sum.is_finite() {
        let inv = 1.0 / sum;
        for c in cand.iter_mut() {
            c.p = (f64::from(c.p) * inv) as f32;
        }
    }
    (max, sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_top_k(logits: &[f32], k: usize) -> Vec<u32> {
        let mut all: Vec<Cand> = logits
            .iter()
            .enumerate()
            .filter(|(_, &l)| l > f32::NEG_INFINITY)
            .map(|(i, &l)| Cand::new(i as u32, l))
            .collect();
        all.sort_by(by_logit_desc);
        all.truncate(k);
        all.into_iter().map(|c| c.id).collect()
    }

    #[test]
    fn top_k_matches_a_full_sort_with_ties_and_masked_entries() {
        let mut rng = crate::Rng::new(3);
        let mut out = Vec::new();
        for n in [1usize, 5, 300, 5000] {
            // Few distinct values: many ties.
            let logits: Vec<f32> = (0..n)
                .map(|_| match rng.next_u64() % 9 {
                    0 => f32::NEG_INFINITY,
                    r => r as f32 * 0.5,
                })
                .collect();
            for k in [1usize, 2, 7, 40, 257, 10_000] {
                top_k_of(&logits, k, &mut out);
                let got: Vec<u32> = out.iter().map(|c| c.id).collect();
                assert_eq!(got, reference_top_k(&logits, k), "n={n} k={k}");
            }
        }
    }

    #[test]
    fn mass_prefix_is_the_smallest_sorted_prefix() {
        let mut rng = crate::Rng::new(9);
        for n in [1usize, 10, 100, 3000, 100_000] {
            let logits: Vec<f32> = (0..n).map(|_| (rng.next_f64() * 8.0) as f32).collect();
            let mut cand: Vec<Cand> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| Cand::new(i as u32, l))
                .collect();
            softmax(&mut cand);
            let max = cand
                .iter()
                .map(|c| c.logit)
                .fold(f32::NEG_INFINITY, f32::max);
            for mass in [0.01, 0.3, 0.9, 0.999, 1.5] {
                let mut c = cand.clone();
                let len = mass_prefix(&mut c, mass, |c| max - c.logit, by_logit_desc);
                let mut sorted = cand.clone();
                sorted.sort_by(by_logit_desc);
                let mut acc = 0.0;
                let want = sorted
                    .iter()
                    .position(|c| {
                        acc += f64::from(c.p);
                        acc >= mass
                    })
                    .map_or(n, |i| i + 1);
                assert_eq!(len, want, "n={n} mass={mass}");
                assert_eq!(&c[..len], &sorted[..len]);
            }
        }
    }

    #[test]
    fn exp_neg_is_within_two_ulp() {
        let mut x = 0.0f32;
        while x > -88.0 {
            let want = x.exp();
            let got = exp_neg(x);
            let ulp = (want.to_bits() as i64 - got.to_bits() as i64).abs();
            // Below -87 (e^-87 = 1.6e-38) the result is flushed to 0.
            assert!(
                ulp <= 2 || (x < -87.0 && got == 0.0 && want < 1.7e-38),
                "{x}: {got} vs {want}"
            );
            x -= 0.000_731;
        }
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg(-100.0), 0.0);
        assert_eq!(exp_neg(f32::NAN), 0.0);
    }
}
