//! Attention over a long f16 cache, timed kernel by kernel in one process: one decoding row
//! through the per-row kernels ([`attend_heads`]: a dot per key, a softmax over the row) and
//! through the tiled kernel ([`attend_tile`]: key blocks transposed, scores by broadcast FMAs,
//! an online softmax), and a prompt's 16-row tile through the tiled kernel and through the
//! tile as it was before (per-key dots, the baseline). Layers cycle over distinct caches laid
//! out as the engine's (a position's KV heads side by side), so the reads come from memory as
//! they do in a model.
//!
//! `cargo run -p rill-kernels --release --example attention_bench`. SmolLM2's shape by
//! default; `DEPTH` (4096), `DIM` (64), `KV_HEADS` (3), `GROUP` (query heads per KV head, 3),
//! `LAYERS` (30) and `REPS` (5) pick others, `ONLY` (0 to 3) times one kernel alone (for a
//! profiler), `COMPARE=1` also prints how far apart the two tiles' outputs are, and `WIDEN=1`
//! makes a lone row widen its values first instead of weighing the f16 cache's in place.
//! `NO_PREFETCH=1` leaves out the decoding row's prefetches.

use half::f16;
use rill_kernels::attention::{
    attend_tile, finish_state, merge_state, prefetch, tile_scratch_len, CachePart, KEY_BLOCK,
    KEY_CHUNK, TILE_ROWS,
};
use rill_kernels::ops::{self, attend_heads, F16Rows, KvView, ScoreShape};
use std::time::Instant;

/// One layer's cache: `len` positions of `kv_heads` heads of `dim`, position-major.
struct Layer {
    keys: Vec<f16>,
    values: Vec<f16>,
    kv_dim: usize,
}

/// One KV head of a [`Layer`].
struct Head<'a> {
    layer: &'a Layer,
    offset: usize,
    dim: usize,
    len: usize,
}

impl Head<'_> {
    fn rows<'a>(&self, data: &'a [f16], j0: usize, n: usize) -> F16Rows<'a> {
        let at = j0 * self.layer.kv_dim + self.offset;
        F16Rows {
            data: &data[at..at + (n - 1) * self.layer.kv_dim + self.dim],
            stride: self.layer.kv_dim,
            rows: n,
            dim: self.dim,
        }
    }
    fn row<'a>(&self, data: &'a [f16], j: usize) -> &'a [f16] {
        &data[j * self.layer.kv_dim + self.offset..][..self.dim]
    }
}

impl KvView for Head<'_> {
    fn len(&self) -> usize {
        self.len
    }
    fn key_dot(&self, j: usize, q: &[f32]) -> f32 {
        ops::dot_f16_f32(self.row(&self.layer.keys, j), q)
    }
    fn value_axpy(&self, j: usize, w: f32, out: &mut [f32]) {
        ops::axpy_f16(out, w, self.row(&self.layer.values, j))
    }
    fn key_dots_run(
        &self,
        j0: usize,
        n: usize,
        q: &[f32],
        heads: usize,
        out: &mut [f32],
        os: usize,
    ) {
        if n > 0 {
            ops::dot_heads_run(self.rows(&self.layer.keys, j0, n), q, heads, out, os)
        }
    }
    fn value_axpys_run(
        &self,
        j0: usize,
        n: usize,
        w: &[f32],
        ws: usize,
        heads: usize,
        out: &mut [f32],
    ) {
        if n > 0 {
            let values = self.rows(&self.layer.values, j0, n);
            ops::axpy_heads_run(&mut out[..heads * self.dim], w, ws, values)
        }
    }
    fn keys_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize) {
        for k in 0..n {
            let dst = &mut out[k * stride..k * stride + self.dim];
            rill_kernels::dequant_kv::widen_f16(self.row(&self.layer.keys, j0 + k), dst);
        }
    }
    fn values_as_f32(&self, j0: usize, n: usize, out: &mut [f32], stride: usize) {
        for k in 0..n {
            let dst = &mut out[k * stride..k * stride + self.dim];
            rill_kernels::dequant_kv::widen_f16(self.row(&self.layer.values, j0 + k), dst);
        }
    }
    fn key_rows_f16<'s>(&'s self, j0: usize, out: &mut [&'s [f16]]) -> bool {
        for (k, row) in out.iter_mut().enumerate() {
            *row = self.row(&self.layer.keys, j0 + k);
        }
        true
    }
    fn value_rows_f16<'s>(&'s self, j0: usize, out: &mut [&'s [f16]]) -> bool {
        if no_prefetch() {
            return false;
        }
        for (k, row) in out.iter_mut().enumerate() {
            *row = self.row(&self.layer.values, j0 + k);
        }
        true
    }
    fn values_are_f16(&self) -> bool {
        std::env::var_os("WIDEN").is_none()
    }
    fn prefetch(&self, j0: usize, n: usize, part: CachePart) {
        if no_prefetch() {
            return;
        }
        let data = match part {
            CachePart::Keys => &self.layer.keys,
            CachePart::Values => &self.layer.values,
        };
        for j in j0..j0 + n {
            prefetch(self.row(data, j));
        }
    }
}

/// `NO_PREFETCH` set: no hints (neither [`KvView::prefetch`] nor the value rows a lone row's
/// scores ask for).
fn no_prefetch() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("NO_PREFETCH").is_some())
}

/// The tile as it was before key blocks were transposed (the baseline): per row, each key's
/// dots with the row's query heads (a horizontal sum per dot), then the same online softmax
/// and weighted values. No sliding window, no soft cap, no sinks.
#[allow(clippy::too_many_arguments)]
fn per_key_tile(
    q: &[f32],
    q_stride: usize,
    ends: &[usize],
    heads: usize,
    dim: usize,
    kv: &Head<'_>,
    scale: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let rows = ends.len();
    let n = rows * heads;
    out[..n * dim].iter_mut().for_each(|o| *o = 0.0);
    let mut total = vec![(f32::NEG_INFINITY, 0f32); n];
    let mut state = vec![(f32::NEG_INFINITY, 0f32); n];
    let mut running = vec![0f32; n * dim];
    let hi = ends.iter().copied().max().unwrap_or(0);
    for chunk in 0..hi.div_ceil(KEY_CHUNK) {
        let (c0, c1) = (chunk * KEY_CHUNK, (chunk + 1) * KEY_CHUNK);
        running.iter_mut().for_each(|o| *o = 0.0);
        state.iter_mut().for_each(|s| *s = (f32::NEG_INFINITY, 0.0));
        for block in c0 / KEY_BLOCK..c1.min(hi).div_ceil(KEY_BLOCK) {
            let b0 = block * KEY_BLOCK;
            for (r, &end) in ends.iter().enumerate() {
                let (j0, j1) = (b0, end.min(b0 + KEY_BLOCK).min(c1));
                if j0 >= j1 {
                    continue;
                }
                let len = j1 - j0;
                let qr = &q[r * q_stride..r * q_stride + heads * dim];
                kv.key_dots_run(j0, len, qr, heads, scores, KEY_BLOCK);
                let acc = &mut running[r * heads * dim..(r + 1) * heads * dim];
                for g in 0..heads {
                    let s = &mut scores[g * KEY_BLOCK..g * KEY_BLOCK + len];
                    s.iter_mut().for_each(|x| *x *= scale);
                    let (max, sum) = &mut state[r * heads + g];
                    let m = s.iter().copied().fold(*max, f32::max);
                    if m > *max && *sum > 0.0 {
                        let c = (*max - m).exp();
                        *sum *= c;
                        acc[g * dim..(g + 1) * dim].iter_mut().for_each(|o| *o *= c);
                    }
                    *max = m;
                    *sum += ops::exp_shifted_sum(s, m);
                }
                kv.value_axpys_run(j0, len, scores, KEY_BLOCK, heads, acc);
            }
        }
        for at in 0..n {
            let (tm, ts) = &mut total[at];
            merge_state(
                (tm, ts),
                &mut out[at * dim..(at + 1) * dim],
                state[at],
                &running[at * dim..(at + 1) * dim],
            );
        }
    }
    for (at, o) in out[..n * dim].chunks_exact_mut(dim).enumerate() {
        finish_state(total[at].0, total[at].1, None, o);
    }
}

fn main() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (depth, dim, kv_heads) = (env("DEPTH", 4096), env("DIM", 64), env("KV_HEADS", 3));
    let (group, layers, reps) = (env("GROUP", 3), env("LAYERS", 30), env("REPS", 5));
    let group = group.min(ops::MAX_HEADS);
    // `ONLY=0..3` times one kernel alone (for a profiler).
    let only = std::env::var("ONLY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let kv_dim = kv_heads * dim;
    let len = depth + TILE_ROWS;
    let caches: Vec<Layer> = (0..layers)
        .map(|_| Layer {
            keys: (0..len * kv_dim).map(|_| f16::from_f32(next())).collect(),
            values: (0..len * kv_dim).map(|_| f16::from_f32(next())).collect(),
            kv_dim,
        })
        .collect();
    let q: Vec<f32> = (0..TILE_ROWS * group * dim).map(|_| next()).collect();
    let shape = ScoreShape {
        scale: 1.0 / (dim as f32).sqrt(),
        softcap: None,
        sinks: None,
    };
    let mut scores = vec![0f32; group * len];
    let mut scratch = vec![0f32; tile_scratch_len(TILE_ROWS, group, dim)];
    let mut out = vec![0f32; TILE_ROWS * group * dim];
    fn heads_of(layer: &Layer, kv_heads: usize, dim: usize, len: usize) -> Vec<Head<'_>> {
        (0..kv_heads)
            .map(|h| Head {
                layer,
                offset: h * dim,
                dim,
                len,
            })
            .collect()
    }
    let flops_row = (4 * group * dim * (depth + 1)) as f64;
    println!(
        "depth {depth}, head dim {dim}, {kv_heads} KV heads x {group} query heads, {layers} layers, one thread"
    );
    let mut best = [f64::MAX; 4];
    for _ in 0..reps {
        for (kernel, best) in best.iter_mut().enumerate() {
            if only.is_some_and(|k| k != kernel) {
                continue;
            }
            let t = Instant::now();
            for layer in &caches {
                for head in heads_of(layer, kv_heads, dim, len) {
                    match kernel {
                        0 => attend_heads(
                            &q[..group * dim],
                            group,
                            &head,
                            (0, depth + 1),
                            shape,
                            ops::softmax_inplace_fast,
                            &mut scores,
                            &mut out,
                        ),
                        1 => attend_tile(
                            &q,
                            group * dim,
                            &[(0, depth + 1)],
                            group,
                            dim,
                            &head,
                            shape,
                            &mut scratch,
                            &mut out,
                        ),
                        3 => {
                            let ends: Vec<usize> = (0..TILE_ROWS).map(|r| depth + 1 + r).collect();
                            per_key_tile(
                                &q,
                                group * dim,
                                &ends,
                                group,
                                dim,
                                &head,
                                shape.scale,
                                &mut scores,
                                &mut out,
                            )
                        }
                        _ => {
                            let spans: Vec<(usize, usize)> =
                                (0..TILE_ROWS).map(|r| (0, depth + 1 + r)).collect();
                            attend_tile(
                                &q,
                                group * dim,
                                &spans,
                                group,
                                dim,
                                &head,
                                shape,
                                &mut scratch,
                                &mut out,
                            )
                        }
                    }
                }
            }
            *best = best.min(t.elapsed().as_secs_f64());
        }
    }
    if std::env::var_os("COMPARE").is_some() {
        let head = &heads_of(&caches[0], kv_heads, dim, len)[0];
        for extra in [0usize, 5, 13] {
            let ends: Vec<usize> = (0..TILE_ROWS).map(|r| depth - 40 + extra + r).collect();
            let spans: Vec<(usize, usize)> = ends.iter().map(|&e| (0, e)).collect();
            let mut a = vec![0f32; TILE_ROWS * group * dim];
            let mut b = a.clone();
            per_key_tile(
                &q,
                group * dim,
                &ends,
                group,
                dim,
                head,
                shape.scale,
                &mut scores,
                &mut a,
            );
            attend_tile(
                &q,
                group * dim,
                &spans,
                group,
                dim,
                head,
                shape,
                &mut scratch,
                &mut b,
            );
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| ((x - y) / (x.abs() + 1e-3)).abs())
                .fold(0f32, f32::max);
            println!(
                "compare ends from {}: worst relative difference {worst:e}",
                ends[0]
            );
        }
    }
    let units = (layers * kv_heads) as f64;
    for (name, secs, rows) in [
        ("one row, per-row kernels", best[0], 1.0),
        ("one row, tiled", best[1], 1.0),
        ("16-row tile, tiled", best[2], TILE_ROWS as f64),
        ("16-row tile, per-key dots", best[3], TILE_ROWS as f64),
    ] {
        println!(
            "{name:28} {:8.3} ms per pass of {layers} layers  {:6.1} GFLOP/s",
            secs * 1e3,
            flops_row * rows * units / secs / 1e9
        );
    }
}
