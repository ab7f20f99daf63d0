//! Attention over a KV cache: the per-row kernels ([`attend`], [`attend_heads`]: scores, a
//! softmax over the whole row, the weighted values) that the exact path runs, and the tiled
//! kernel of the fast path ([`attend_tile`]): FlashAttention's schedule on the CPU, a tile of
//! query rows against one block of keys at a time with an online softmax, so each key block is
//! read once per tile while it is in cache and no score row longer than a block exists. A key
//! block is widened and transposed once per tile, so its scores are broadcast FMAs with no
//! horizontal sums (`block`), and its values widened once and weighed strip by strip.

mod block;
mod tiled;
#[cfg(target_arch = "x86_64")]
pub(crate) use block::simd::transpose16_epi32;
pub use tiled::{
    attend_chunk, attend_tile, chunk_scratch_len, finish_state, merge_state, tile_scratch_len,
    KEY_BLOCK, KEY_CHUNK, TILE_ROWS,
};

pub use block::{
    block_scores, block_scores_scalar, lone_row_scores, lone_row_scores_run, scale_and_max,
    scale_and_max_runs, scale_and_max_scalar, transpose_keys, transpose_keys_scalar, F16Keys,
    KeyRowFormat, Q8_0Keys, ScorePair, KEY_LANES, LONE_ROW_PAIRS,
};

use crate::ops::{exp_shifted_sums, MAX_HEADS};

/// Read access to one layer's cached keys and values of one sequence, for one KV head.
pub trait KvView {
    /// Number of cached positions visible (keys `0..len`).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `dot(key_j, q)`.
    fn key_dot(&self, j: usize, q: &[f32]) -> f32;
    /// `out += w * value_j`.
    fn value_axpy(&self, j: usize, w: f32, out: &mut [f32]);
    /// `out[g] = dot(key_j, q_g)` for the query heads `q` (`out.len()` ≤ [`MAX_HEADS`] heads
    /// of equal length, back to back) sharing this KV head; each as [`KvView::key_dot`].
    fn key_dots(&self, j: usize, q: &[f32], out: &mut [f32]) {
        let n = q.len() / out.len().max(1);
        for (g, o) in out.iter_mut().enumerate() {
            *o = self.key_dot(j, &q[g * n..(g + 1) * n]);
        }
    }
    /// `out_g += w[g] * value_j` for the heads' outputs `out` (back to back); each as
    /// [`KvView::value_axpy`].
    fn value_axpys(&self, j: usize, w: &[f32], out: &mut [f32]) {
        let n = out.len() / w.len().max(1);
        for (g, &wg) in w.iter().enumerate() {
            self.value_axpy(j, wg, &mut out[g * n..(g + 1) * n]);
        }
    }
    /// Writes the keys of positions `j0..j0 + n` as f32 rows (`dim` each, row `k` at
    /// `out[k * stride..]`): [`attend_tile`] widens (or dequantizes) a key block once for all
    /// its rows, then transposes it for its score kernel.
    fn keys_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize);
    /// [`KvView::keys_as_f32`] for values: [`attend_tile`] widens a value block once for all
    /// its rows.
    fn values_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize);
    /// For caches storing keys as f16: the keys of positions `j0..j0 + out.len()` as stored
    /// (`dim` elements each) into `out`, and true, so [`attend_tile`] transposes a key block
    /// straight from the cache, widening on the way; others return false and are read through
    /// [`KvView::keys_as_f32`].
    fn key_rows_f16<'s>(&'s self, _j0: usize, _out: &mut [&'s [half::f16]]) -> bool {
        false
    }
    /// [`KvView::key_rows_f16`] for values.
    fn value_rows_f16<'s>(&'s self, _j0: usize, _out: &mut [&'s [half::f16]]) -> bool {
        false
    }
    /// For caches storing keys as Q8_0 blocks: each key of positions `j0..j0 + out.len()` as
    /// its stored blocks into `out`, and true, so a decoding row widens them in registers;
    /// others return false.
    fn key_rows_q8_0<'s>(&'s self, _j0: usize, _out: &mut [&'s [u8]]) -> bool {
        false
    }
    /// True for caches storing values as f16, whose [`KvView::value_axpys_run`] reads them in
    /// place with the bits of the widened rows: [`attend_tile`] then weighs a lone row's
    /// values there instead of widening the block first.
    fn values_are_f16(&self) -> bool {
        false
    }
    /// True where [`KvView::value_axpys_run`] weighs a block's values no slower than widening
    /// them once first (f16 values read in place; quantized ones dequantized a few rows at a
    /// time on the stack), with the bits of the widened rows: a lone row then uses it.
    fn values_weighed_in_place(&self) -> bool {
        self.values_are_f16()
    }
    /// Asks the memory system for the keys or values of positions `j0..j0 + n` ahead of their
    /// use ([`prefetch`]), so that a decoding row's reads of a long cache overlap its
    /// arithmetic instead of waiting on each block in turn. A hint: no result depends on it,
    /// and by default it does nothing.
    fn prefetch(&self, _j0: usize, _n: usize, _part: CachePart) {}
    /// `out[g * out_stride + k] = dot(key_{j0 + k}, q_g)` for `k < n` and the `heads`
    /// (≤ [`MAX_HEADS`]) query heads back to back in `q`; each as [`KvView::key_dots`].
    fn key_dots_run(
        &self,
        j0: usize,
        n: usize,
        q: &[f32],
        heads: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        key_dots_run_by_position(self, j0, n, q, heads, out, out_stride)
    }
    /// `out_g += w[g * w_stride + k] · value_{j0 + k}` for `k = 0..n` in turn, for the `heads`
    /// (≤ [`MAX_HEADS`]) outputs back to back in `out`; each step as [`KvView::value_axpys`].
    fn value_axpys_run(
        &self,
        j0: usize,
        n: usize,
        w: &[f32],
        w_stride: usize,
        heads: usize,
        out: &mut [f32],
    ) {
        value_axpys_run_by_position(self, j0, n, w, w_stride, heads, out)
    }
}

/// Which half of a cached position [`KvView::prefetch`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachePart {
    Keys,
    Values,
}

/// Asks for the cache lines of `data` to be brought into the first-level cache (a hint that
/// changes no value; nothing on other architectures).
#[inline]
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (start, bytes) = (data.as_ptr() as usize, std::mem::size_of_val(data));
        // Every line the bytes touch, from the one holding the first (none for no bytes).
        let first_line = if bytes == 0 { start } else { start & !63 };
        for line in (first_line..start + bytes).step_by(64) {
            // SAFETY: a prefetch never faults, and these lines hold `data`'s bytes.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// [`KvView::key_dots_run`] one position at a time, through [`KvView::key_dots`].
pub fn key_dots_run_by_position<V: KvView + ?Sized>(
    kv: &V,
    j0: usize,
    n: usize,
    q: &[f32],
    heads: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let heads = heads.clamp(1, MAX_HEADS);
    let mut dots = [0f32; MAX_HEADS];
    for k in 0..n {
        kv.key_dots(j0 + k, q, &mut dots[..heads]);
        scatter_heads(&dots[..heads], out, out_stride, k);
    }
}

/// Position `k`'s per-head values into a heads-major buffer: `out[g * stride + k] = v[g]`.
pub(crate) fn scatter_heads(v: &[f32], out: &mut [f32], stride: usize, k: usize) {
    for (g, &x) in v.iter().enumerate() {
        out[g * stride + k] = x;
    }
}

/// [`KvView::value_axpys_run`] one position at a time, through [`KvView::value_axpys`].
pub fn value_axpys_run_by_position<V: KvView + ?Sized>(
    kv: &V,
    j0: usize,
    n: usize,
    w: &[f32],
    w_stride: usize,
    heads: usize,
    out: &mut [f32],
) {
    let heads = heads.clamp(1, MAX_HEADS);
    let mut wk = [0f32; MAX_HEADS];
    for k in 0..n {
        for (g, x) in wk[..heads].iter_mut().enumerate() {
            *x = w[g * w_stride + k];
        }
        kv.value_axpys(j0 + k, &wk[..heads], out);
    }
}

/// How raw query-key dot products become attention weights: multiplied by `scale`; with a soft
/// cap `c` (Gemma 2), mapped to `c * tanh(score / c)`; with a sink logit per head (gpt-oss), the
/// softmax's denominator gets `exp(sink)` as if from one more key whose value is zero.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreShape<'a> {
    pub scale: f32,
    pub softcap: Option<f32>,
    /// One per head of the call.
    pub sinks: Option<&'a [f32]>,
}

impl ScoreShape<'_> {
    pub(crate) fn apply(self, scores: &mut [f32]) {
        match self.softcap {
            None => scores.iter_mut().for_each(|s| *s *= self.scale),
            Some(cap) => scores
                .iter_mut()
                .for_each(|s| *s = cap * (*s * self.scale / cap).tanh()),
        }
    }

    /// Softmax of head `head`'s scores, with its sink where there is one. The sink scales the
    /// plain softmax by `Z / (Z + exp(sink - max))` (`Z` the plain sum of exponentials), so the
    /// plain softmax runs unchanged.
    fn softmax(self, head: usize, scores: &mut [f32], softmax: fn(&mut [f32])) {
        let Some(&sink) = self.sinks.and_then(|s| s.get(head)) else {
            return softmax(scores);
        };
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f64 = scores.iter().map(|&s| f64::from(s - max).exp()).sum();
        let keep = (z / (z + f64::from(sink - max).exp())) as f32;
        softmax(scores);
        scores.iter_mut().for_each(|p| *p *= keep);
    }
}

/// [`attend`] for `heads` (≤ [`MAX_HEADS`]) query heads sharing one KV head: `q` and `out`
/// hold the heads back to back, `scores` is scratch of at least `heads * (last - first)`.
/// Every head's output is bit-identical to [`attend`] on that head alone; each cached key and
/// value is read (and converted) once for all of them.
#[allow(clippy::too_many_arguments)]
pub fn attend_heads(
    q: &[f32],
    heads: usize,
    kv: &impl KvView,
    (first, last): (usize, usize),
    shape: ScoreShape,
    softmax: fn(&mut [f32]),
    scores: &mut [f32],
    out: &mut [f32],
) {
    out.iter_mut().for_each(|o| *o = 0.0);
    if last <= first || heads == 0 {
        return;
    }
    let heads = heads.min(MAX_HEADS);
    let len = last - first;
    let scores = &mut scores[..heads * len];
    kv.key_dots_run(first, len, q, heads, scores, len);
    shape.apply(scores);
    for (head, head_scores) in scores.chunks_exact_mut(len).enumerate() {
        shape.softmax(head, head_scores, softmax);
    }
    kv.value_axpys_run(first, len, scores, len, heads, out);
}

/// Attention of one query head over keys `first..last` of `kv`: softmax(shape(q·k)) · v into
/// `out`. `scores` is scratch of at least `last - first` elements.
pub fn attend(
    q: &[f32],
    kv: &impl KvView,
    (first, last): (usize, usize),
    shape: ScoreShape,
    softmax: fn(&mut [f32]),
    scores: &mut [f32],
    out: &mut [f32],
) {
    out.iter_mut().for_each(|o| *o = 0.0);
    if last <= first {
        return;
    }
    let len = last - first;
    let scores = &mut scores[..len];
    kv.key_dots_run(first, len, q, 1, scores, len);
    shape.apply(scores);
    shape.softmax(0, scores, softmax);
    kv.value_axpys_run(first, len, scores, len, 1, out);
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::ops::{dot_heads_run, F16Rows};

    /// An f16 cache of one KV head, positions back to back (one run).
    struct Cache {
        keys: Vec<f16>,
        values: Vec<f16>,
        dim: usize,
        len: usize,
    }

    impl Cache {
        fn rows<'a>(&self, data: &'a [f16], j0: usize, n: usize) -> F16Rows<'a> {
            F16Rows {
                data: &data[j0 * self.dim..(j0 + n) * self.dim],
                stride: self.dim,
                rows: n,
                dim: self.dim,
            }
        }
    }

    impl KvView for Cache {
        fn len(&self) -> usize {
            self.len
        }
        fn key_dot(&self, j: usize, q: &[f32]) -> f32 {
            crate::ops::dot_f16_f32(&self.keys[j * self.dim..(j + 1) * self.dim], q)
        }
        fn keys_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize) {
            let widen = crate::dequant_kv::widen_f16;
            widen_rows(&self.keys, self.dim, (j0, n), (out, stride), widen)
        }
        fn values_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize) {
            let widen = crate::dequant_kv::widen_f16;
            widen_rows(&self.values, self.dim, (j0, n), (out, stride), widen)
        }
        fn key_rows_f16<'s>(&'s self, j0: usize, out: &mut [&'s [f16]]) -> bool {
            for (k, row) in out.iter_mut().enumerate() {
                *row = &self.keys[(j0 + k) * self.dim..(j0 + k + 1) * self.dim];
            }
            true
        }
        fn values_are_f16(&self) -> bool {
            true
        }
        fn value_axpy(&self, j: usize, w: f32, out: &mut [f32]) {
            crate::ops::axpy_f16(out, w, &self.values[j * self.dim..(j + 1) * self.dim])
        }
        fn key_dots_run(
            &self,
            j0: usize,
            n: usize,
            q: &[f32],
            heads: usize,
            out: &mut [f32],
            out_stride: usize,
        ) {
            dot_heads_run(self.rows(&self.keys, j0, n), q, heads, out, out_stride)
        }
        fn value_axpys_run(
            &self,
            j0: usize,
            n: usize,
            w: &[f32],
            w_stride: usize,
            heads: usize,
            out: &mut [f32],
        ) {
            let values = self.rows(&self.values, j0, n);
            crate::ops::axpy_heads_run(&mut out[..heads * self.dim], w, w_stride, values)
        }
    }

    /// Rows `j0..j0 + n` of `dim` elements of `data` into `out`, `stride` apart, by `widen`.
    fn widen_rows(
        data: &[f16],
        dim: usize,
        (j0, n): (usize, usize),
        (out, stride): (&mut [f32], usize),
        widen: fn(&[f16], &mut [f32]),
    ) {
        for k in 0..n {
            let src = &data[(j0 + k) * dim..(j0 + k + 1) * dim];
            widen(src, &mut out[k * stride..k * stride + dim]);
        }
    }

    pub(super) fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn cache(len: usize, dim: usize, seed: &mut u64) -> Cache {
        let mut gen = |n| -> Vec<f16> { (0..n).map(|_| f16::from_f32(lcg(seed) * 2.0)).collect() };
        Cache {
            keys: gen(len * dim),
            values: gen(len * dim),
            dim,
            len,
        }
    }

    /// Softmax attention of one head in f64, shaped as `shape` says.
    fn reference(
        q: &[f32],
        kv: &Cache,
        (first, last): (usize, usize),
        shape: &ScoreShape,
        head: usize,
    ) -> Vec<f64> {
        let dim = kv.dim;
        let scores: Vec<f64> = (first..last)
            .map(|j| {
                let dot: f64 = (0..dim)
                    .map(|d| f64::from(q[d]) * f64::from(kv.keys[j * dim + d].to_f32()))
                    .sum();
                let s = dot * f64::from(shape.scale);
                match shape.softcap {
                    Some(c) => f64::from(c) * (s / f64::from(c)).tanh(),
                    None => s,
                }
            })
            .collect();
        let mut out = vec![0f64; dim];
        if scores.is_empty() {
            return out;
        }
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
        if let Some(sinks) = shape.sinks {
            z += (f64::from(sinks[head]) - max).exp();
        }
        for (j, s) in (first..last).zip(&scores) {
            let w = (s - max).exp() / z;
            for (d, o) in out.iter_mut().enumerate() {
                *o += w * f64::from(kv.values[j * dim + d].to_f32());
            }
        }
        out
    }

    /// Causal spans ending at `ends`, with a window when given; some rows empty.
    fn spans(ends: &[usize], window: Option<usize>) -> Vec<(usize, usize)> {
        ends.iter()
            .map(|&last| (window.map_or(0, |w| last.saturating_sub(w)), last))
            .collect()
    }

    fn run_tile(
        q: &[f32],
        q_stride: usize,
        spans: &[(usize, usize)],
        heads: usize,
        kv: &Cache,
        shape: ScoreShape,
    ) -> Vec<f32> {
        let mut scratch = vec![f32::NAN; tile_scratch_len(spans.len(), heads, kv.dim)];
        let mut out = vec![f32::NAN; spans.len() * heads * kv.dim];
        attend_tile(
            q,
            q_stride,
            spans,
            heads,
            kv.dim,
            kv,
            shape,
            &mut scratch,
            &mut out,
        );
        out
    }

    /// The tiled kernel computes softmax attention: against f64 on random data, across key
    /// blocks, windows that skip blocks, soft caps, sinks and rows with nothing to attend to.
    #[test]
    fn tiled_attention_is_softmax_attention() {
        let mut seed = 3;
        for dim in [8usize, 64, 72] {
            let kv = cache(300, dim, &mut seed);
            for heads in 1..=MAX_HEADS {
                let sinks: Vec<f32> = (0..heads).map(|_| lcg(&mut seed) * 3.0).collect();
                for (window, softcap, with_sinks) in [
                    (None, None, false),
                    (Some(70), None, false),
                    (None, Some(5.0), true),
                    (Some(5), Some(2.0), true),
                ] {
                    let ends = [0usize, 1, 63, 64, 65, 130, 200, 299, 300];
                    let spans = spans(&ends, window);
                    let q: Vec<f32> = (0..ends.len() * heads * dim)
                        .map(|_| lcg(&mut seed))
                        .collect();
                    let shape = ScoreShape {
                        scale: 1.0 / (dim as f32).sqrt(),
                        softcap,
                        sinks: with_sinks.then_some(&sinks[..]),
                    };
                    let out = run_tile(&q, heads * dim, &spans, heads, &kv, shape);
                    for (r, &span) in spans.iter().enumerate() {
                        for g in 0..heads {
                            let at = (r * heads + g) * dim;
                            let want = reference(&q[at..at + dim], &kv, span, &shape, g);
                            for (d, w) in want.iter().enumerate() {
                                let got = f64::from(out[at + d]);
                                assert!(
                                    (got - w).abs() <= 2e-5 * (1.0 + w.abs()),
                                    "dim {dim} heads {heads} span {span:?} head {g}: {got} vs {w}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// A row's result is the same bits whatever rows share its tile, and a head's whatever
    /// heads share the call (batch invariance of the fast path): a lone row weighs the f16
    /// values in place, a tile widens them and weighs them in strips, heads of any length
    /// (several strips, 16- and 8-element ends, a scalar tail).
    #[test]
    fn tiled_rows_and_heads_are_independent() {
        let mut seed = 9;
        for (dim, window) in [
            (64, None),
            (64, Some(100)),
            (24, None),
            (84, Some(70)),
            (256, None),
        ] {
            rows_and_heads_alone_and_together(dim, window, &mut seed);
        }
    }

    fn rows_and_heads_alone_and_together(dim: usize, window: Option<usize>, seed: &mut u64) {
        let kv = cache(260, dim, seed);
        let heads = 3;
        let ends: Vec<usize> = (245..=260).collect();
        let spans = spans(&ends, window);
        let q: Vec<f32> = (0..ends.len() * heads * dim).map(|_| lcg(seed)).collect();
        let shape = ScoreShape {
            scale: 0.125,
            softcap: None,
            sinks: None,
        };
        let together = run_tile(&q, heads * dim, &spans, heads, &kv, shape);
        for (r, span) in spans.iter().enumerate() {
            let row = &q[r * heads * dim..(r + 1) * heads * dim];
            let alone = run_tile(row, heads * dim, &[*span], heads, &kv, shape);
            assert_eq!(alone[..], together[r * heads * dim..(r + 1) * heads * dim]);
            for g in 0..heads {
                let one = run_tile(&row[g * dim..], heads * dim, &[*span], 1, &kv, shape);
                let at = (r * heads + g) * dim;
                assert_eq!(
                    one[..],
                    together[at..at + dim],
                    "dim {dim} row {r} head {g}"
                );
            }
        }
    }

    /// Rows longer than a chunk: still softmax attention, and the chunks reduced one by one
    /// ([`attend_chunk`], as a decoding row's chunks are on different threads) and merged in
    /// order give the bits [`attend_tile`] gives.
    #[test]
    fn chunks_reduced_apart_and_merged_in_order_give_the_tiles_bits() {
        let mut seed = 23;
        let dim = 64;
        let kv = cache(2600, dim, &mut seed);
        for heads in [1usize, 3] {
            let sinks: Vec<f32> = (0..heads).map(|_| lcg(&mut seed)).collect();
            for (window, with_sinks) in [(None, false), (Some(1500), true), (Some(300), false)] {
                let ends = [1023usize, 1024, 1025, 2048, 2600];
                let spans = spans(&ends, window);
                let q: Vec<f32> = (0..ends.len() * heads * dim)
                    .map(|_| lcg(&mut seed))
                    .collect();
                let shape = ScoreShape {
                    scale: 0.125,
                    softcap: None,
                    sinks: with_sinks.then_some(&sinks[..]),
                };
                let tiled = run_tile(&q, heads * dim, &spans, heads, &kv, shape);
                for (r, &(first, last)) in spans.iter().enumerate() {
                    let qr = &q[r * heads * dim..(r + 1) * heads * dim];
                    for g in 0..heads {
                        let at = (r * heads + g) * dim;
                        let want = reference(&qr[g * dim..], &kv, (first, last), &shape, g);
                        for (d, w) in want.iter().enumerate() {
                            let got = f64::from(tiled[at + d]);
                            assert!((got - w).abs() <= 2e-5 * (1.0 + w.abs()), "{got} vs {w}");
                        }
                    }
                    // Chunk by chunk, then merged in order.
                    let mut total = vec![0f32; heads * dim];
                    let (mut tmax, mut tsum) = (vec![f32::NEG_INFINITY; heads], vec![0f32; heads]);
                    let mut scratch = vec![f32::NAN; chunk_scratch_len(heads, dim)];
                    for chunk in first / KEY_CHUNK..last.div_ceil(KEY_CHUNK) {
                        let span = (
                            first.max(chunk * KEY_CHUNK),
                            last.min((chunk + 1) * KEY_CHUNK),
                        );
                        let mut part = vec![f32::NAN; heads * dim];
                        let (mut m, mut s) = (vec![f32::NAN; heads], vec![f32::NAN; heads]);
                        attend_chunk(
                            qr,
                            heads * dim,
                            &[span],
                            heads,
                            dim,
                            &kv,
                            shape,
                            &mut scratch,
                            &mut part,
                            &mut m,
                            &mut s,
                        );
                        for g in 0..heads {
                            merge_state(
                                (&mut tmax[g], &mut tsum[g]),
                                &mut total[g * dim..(g + 1) * dim],
                                (m[g], s[g]),
                                &part[g * dim..(g + 1) * dim],
                            );
                        }
                    }
                    for g in 0..heads {
                        let sink = shape.sinks.map(|s| s[g]);
                        finish_state(tmax[g], tsum[g], sink, &mut total[g * dim..(g + 1) * dim]);
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let row = &tiled[r * heads * dim..(r + 1) * heads * dim];
                    assert_eq!(bits(&total), bits(row), "row {r} window {window:?}");
                }
            }
        }
    }

    /// The same cache, offering its rows as f32 blocks (as a block-typed cache does).
    struct Dequantized<'a>(&'a Cache);

    impl KvView for Dequantized<'_> {
        fn len(&self) -> usize {
            self.0.len
        }
        fn key_dot(&self, j: usize, q: &[f32]) -> f32 {
            self.0.key_dot(j, q)
        }
        fn value_axpy(&self, j: usize, w: f32, out: &mut [f32]) {
            self.0.value_axpy(j, w, out)
        }
        fn keys_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize) {
            let widen = crate::dequant_kv::widen_f16_scalar;
            widen_rows(&self.0.keys, self.0.dim, (j0, n), (out, stride), widen)
        }
        fn values_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize) {
            let widen = crate::dequant_kv::widen_f16_scalar;
            widen_rows(&self.0.values, self.0.dim, (j0, n), (out, stride), widen)
        }
    }

    /// A cache offering its blocks only as f32 rows (as a block-typed cache does), converted
    /// one element at a time, gives every row the bits of the f16 cache's keys transposed
    /// straight from their rows and values widened by the SIMD converter, alone or together,
    /// windowed or not.
    #[test]
    fn tiles_over_dequantized_blocks_match_in_place_reads() {
        let mut seed = 17;
        for dim in [32usize, 64] {
            let kv = cache(200, dim, &mut seed);
            let heads = 2;
            let ends: Vec<usize> = (185..=200).collect();
            for window in [None, Some(70)] {
                let spans = spans(&ends, window);
                let q: Vec<f32> = (0..ends.len() * heads * dim)
                    .map(|_| lcg(&mut seed))
                    .collect();
                let shape = ScoreShape {
                    scale: 0.125,
                    softcap: None,
                    sinks: None,
                };
                let in_place = run_tile(&q, heads * dim, &spans, heads, &kv, shape);
                let mut scratch = vec![f32::NAN; tile_scratch_len(spans.len(), heads, dim)];
                let mut blocks = vec![f32::NAN; spans.len() * heads * dim];
                let view = Dequantized(&kv);
                attend_tile(
                    &q,
                    heads * dim,
                    &spans,
                    heads,
                    dim,
                    &view,
                    shape,
                    &mut scratch,
                    &mut blocks,
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&blocks),
                    bits(&in_place),
                    "dim {dim} window {window:?}"
                );
            }
        }
    }
}
