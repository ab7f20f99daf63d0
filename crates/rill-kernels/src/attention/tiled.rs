//! The tiled kernel of the fast path ([`attend_tile`], [`attend_chunk`]): a tile of query rows
//! against one block of keys at a time with an online softmax, chunk states merged in position
//! order ([`merge_state`]).

use super::*;

/// Keys per block of [`attend_tile`]. Blocks start at multiples of this absolute position, so
/// a row reads the same blocks in the same order whatever rows share its tile and however its
/// prompt was split into passes: its result depends on the row alone (batch invariance).
pub const KEY_BLOCK: usize = 64;

/// Most query rows one [`attend_tile`] call takes.
pub const TILE_ROWS: usize = 16;

/// Keys of a row reduced from a fresh softmax state before that state is merged into the row's
/// total ([`merge_state`]), chunk after chunk in position order. Chunks start at multiples of
/// this absolute position, like key blocks, so the bits still depend on the row alone; and a
/// long decoding row's chunks can be reduced on different threads ([`attend_chunk`]) and
/// merged in order after, with the same bits as [`attend_tile`] reducing them in turn.
pub const KEY_CHUNK: usize = 256;

/// Scratch floats [`attend_tile`] needs for `rows` rows of `heads` heads of `dim` elements
/// (a key block's scores, each row's running maximum and sum, room for a key block's keys
/// and values as f32 when the cache stores a block type, and a chunk's running outputs).
pub fn tile_scratch_len(rows: usize, heads: usize, dim: usize) -> usize {
    chunk_scratch_len(heads, dim) + rows * heads * (dim + 2)
}

/// Scratch floats [`attend_chunk`] needs for up to [`TILE_ROWS`] rows of `heads` heads of `dim`
/// elements (a key block's scores for every row and head, its keys as f32 rows and
/// transposed, room for its values as f32).
pub fn chunk_scratch_len(heads: usize, dim: usize) -> usize {
    TILE_ROWS * heads * KEY_BLOCK + 2 * KEY_BLOCK * dim + KEY_BLOCK * value_stride(dim)
}

/// Attention of a tile of query rows of one sequence, for `heads` (≤ [`MAX_HEADS`]) query heads
/// sharing one KV head: row `r` has its heads back to back at `q[r * q_stride..]`, attends to
/// keys `spans[r].0..spans[r].1` of `kv`, and gets its output (heads back to back) at
/// `out[r * heads * dim..]`. `scratch` holds at least [`tile_scratch_len`] floats.
///
/// Per row and head the keys are taken [`KEY_CHUNK`] at a time, each chunk [`KEY_BLOCK`] at a
/// time in position order (blocks a row does not reach, under its causal end or sliding
/// window, are skipped whole): the block's scores (`q · k` as one chain of FMAs over the head's
/// elements in order, [`block_scores`]; then shaped), a running maximum `m`, the
/// previous sum and output rescaled by `exp(m_old - m)` when the maximum grows, `exp(score - m)`
/// added to the sum and, as weights of the block's values, to the output. Each chunk starts
/// from nothing and is merged into the row's total ([`merge_state`]); at the end the output is
/// divided by the sum (plus the sink's `exp(sink - m)`, gpt-oss: [`finish_state`]). Each of
/// these steps depends on the row alone.
#[allow(clippy::too_many_arguments)]
pub fn attend_tile(
    q: &[f32],
    q_stride: usize,
    spans: &[(usize, usize)],
    heads: usize,
    dim: usize,
    kv: &impl KvView,
    shape: ScoreShape,
    scratch: &mut [f32],
    out: &mut [f32],
) {
    let rows = spans.len();
    assert!(
        rows <= TILE_ROWS,
        "attend_tile takes at most {TILE_ROWS} rows, got {rows}"
    );
    let heads = heads.clamp(1, MAX_HEADS);
    let n = rows * heads;
    let out = &mut out[..n * dim];
    out.iter_mut().for_each(|o| *o = 0.0);
    // A chunk's running outputs, maxima and sums in `scratch`; the totals' outputs in `out`.
    let (chunk_scratch, rest) = scratch.split_at_mut(chunk_scratch_len(heads, dim));
    let (running, rest) = rest.split_at_mut(n * dim);
    let (run_max, rest) = rest.split_at_mut(n);
    let run_sum = &mut rest[..n];
    let mut total_max = [f32::NEG_INFINITY; TILE_ROWS * MAX_HEADS];
    let mut total_sum = [0f32; TILE_ROWS * MAX_HEADS];
    let (total_max, total_sum) = (&mut total_max[..n], &mut total_sum[..n]);
    let Some((lo, hi)) = live_range(spans) else {
        return;
    };
    let mut clipped = [(0usize, 0usize); TILE_ROWS];
    for chunk in lo / KEY_CHUNK..hi.div_ceil(KEY_CHUNK) {
        let (c0, c1) = (chunk * KEY_CHUNK, (chunk + 1) * KEY_CHUNK);
        for (c, &(first, last)) in clipped.iter_mut().zip(spans) {
            *c = (first.max(c0), last.min(c1));
        }
        let clipped = &clipped[..rows];
        attend_chunk(
            q,
            q_stride,
            clipped,
            heads,
            dim,
            kv,
            shape,
            chunk_scratch,
            running,
            run_max,
            run_sum,
        );
        for at in 0..n {
            merge_state(
                (&mut total_max[at], &mut total_sum[at]),
                &mut out[at * dim..(at + 1) * dim],
                (run_max[at], run_sum[at]),
                &running[at * dim..(at + 1) * dim],
            );
        }
    }
    for (at, o) in out.chunks_exact_mut(dim).enumerate() {
        let sink = shape.sinks.and_then(|s| s.get(at % heads)).copied();
        finish_state(total_max[at], total_sum[at], sink, o);
    }
}

/// The first and last (exclusive) key any row of `spans` reads; `None` when none reads any.
fn live_range(spans: &[(usize, usize)]) -> Option<(usize, usize)> {
    let live = spans.iter().filter(|(first, last)| first < last);
    Some((live.clone().map(|s| s.0).min()?, live.map(|s| s.1).max()?))
}

/// Merges a chunk's state (its maximum, sum and unnormalised outputs) into a row's total, in
/// place: into an empty total (sum 0) it is copied as it is; an empty chunk changes nothing;
/// else both sides are rescaled to the larger maximum (`exp(m_side - m)`, 1 for the side that
/// has it) and added.
pub fn merge_state(
    (total_max, total_sum): (&mut f32, &mut f32),
    total: &mut [f32],
    (max, sum): (f32, f32),
    chunk: &[f32],
) {
    if sum == 0.0 {
        return;
    }
    if *total_sum == 0.0 {
        *total_max = max;
        *total_sum = sum;
        total.copy_from_slice(chunk);
        return;
    }
    let m = total_max.max(max);
    let keep = if *total_max < m {
        (*total_max - m).exp()
    } else {
        1.0
    };
    let add = if max < m { (max - m).exp() } else { 1.0 };
    *total_sum = *total_sum * keep + sum * add;
    for (t, &c) in total.iter_mut().zip(chunk) {
        *t = *t * keep + c * add;
    }
    *total_max = m;
}

/// Divides a row's outputs by its softmax sum (plus the sink's `exp(sink - max)`); an empty
/// row (sum 0) stays zero.
pub fn finish_state(max: f32, sum: f32, sink: Option<f32>, out: &mut [f32]) {
    let mut total = sum;
    if total == 0.0 {
        return;
    }
    if let Some(sink) = sink {
        total += (sink - max).exp();
    }
    let inv = 1.0 / total;
    out.iter_mut().for_each(|x| *x *= inv);
}

/// One chunk of [`attend_tile`] for every row of a tile: the keys `spans[r]` (all within one
/// [`KEY_CHUNK`]) reduced from a fresh state into unnormalised outputs `out` (heads back to back
/// per row), and each row and head's running maximum and sum. `scratch` holds at least
/// [`chunk_scratch_len`] floats.
#[allow(clippy::too_many_arguments)]
pub fn attend_chunk(
    q: &[f32],
    q_stride: usize,
    spans: &[(usize, usize)],
    heads: usize,
    dim: usize,
    kv: &impl KvView,
    shape: ScoreShape,
    scratch: &mut [f32],
    out: &mut [f32],
    max: &mut [f32],
    sum: &mut [f32],
) {
    let rows = spans.len();
    let heads = heads.clamp(1, MAX_HEADS);
    let out = &mut out[..rows * heads * dim];
    out.iter_mut().for_each(|o| *o = 0.0);
    let (scores, rest) = scratch.split_at_mut(TILE_ROWS * heads * KEY_BLOCK);
    let (key_rows, rest) = rest.split_at_mut(KEY_BLOCK * dim);
    let (keys_t, rest) = rest.split_at_mut(KEY_BLOCK * dim);
    let value_rows = &mut rest[..KEY_BLOCK * value_stride(dim)];
    let (max, sum) = (&mut max[..rows * heads], &mut sum[..rows * heads]);
    max.iter_mut().for_each(|m| *m = f32::NEG_INFINITY);
    sum.iter_mut().for_each(|s| *s = 0.0);
    let Some((lo, hi)) = live_range(spans) else {
        return;
    };
    let mut pairs = [ScorePair::default(); TILE_ROWS * MAX_HEADS];
    for block in lo / KEY_BLOCK..hi.div_ceil(KEY_BLOCK) {
        let (b0, b1) = (block * KEY_BLOCK, (block + 1) * KEY_BLOCK);
        let reach = |&(first, last): &(usize, usize)| (first.max(b0), last.min(b1));
        // The block's positions any row reads, widened and transposed once for every row
        // (each row then reads its own part: the same rows, the same bits, whatever rows
        // share the tile).
        let (u0, u1) = spans
            .iter()
            .map(reach)
            .filter(|(j0, j1)| j0 < j1)
            .fold((b1, b0), |(a, b), (j0, j1)| (a.min(j0), b.max(j1)));
        if u0 >= u1 {
            continue;
        }
        let n = u1 - u0;
        let decoding = spans.len() == 1;
        if decoding {
            // A decoding row's block is little arithmetic per byte: its values are asked for
            // while its scores are computed, and the next block's keys in its chunk while its
            // values are weighed, so that memory works while it computes. Alternating in the
            // engine (`rill bench -p 0 -n 64 --profile`), attention against another stage:
            // asked for all at once, before the scores and after them, Gemma 3 at depth 16384
            // 0.69 -> 0.61 of the head, SmolLM2 at 4096 5.35 -> 4.80 times its gate and up
            // products; spread over the score steps and the value runs (an f16 cache), Gemma 3
            // 0.675 -> 0.614 more (SmolLM2 unchanged). Both asked for at the block's start gave
            // 0.60 and 5.01; whole positions (every KV head), either into the second-level
            // cache, or dealing each thread a run of chunks and asking past a chunk's end
            // measured slower.
            if !kv.values_are_f16() {
                kv.prefetch(u0, n, CachePart::Values);
            }
        }
        let mut n_pairs = 0;
        for (r, span) in spans.iter().enumerate() {
            let (j0, j1) = reach(span);
            if j0 >= j1 {
                continue;
            }
            for g in 0..heads {
                pairs[n_pairs] = ScorePair {
                    at: r * q_stride + g * dim,
                    slot: r * heads + g,
                };
                n_pairs += 1;
            }
        }
        // A lone row (decoding) widens and transposes an f16 or Q8_0 cache's keys in
        // registers on the way to its scores; a tile transposes a block once for all its rows.
        if !(n_pairs <= heads
            && lone_row_block_scores(kv, u0, n, dim, q, &pairs[..n_pairs], scores, decoding))
        {
            if decoding && kv.values_are_f16() {
                kv.prefetch(u0, n, CachePart::Values);
            }
            transpose_block_keys(kv, u0, n, dim, key_rows, keys_t);
            block_scores(q, &pairs[..n_pairs], keys_t, n, dim, scores);
        }
        // A lone row (decoding) weighs an f16 cache's values where they are (1.47x faster than
        // widening them first from cache, `attention_bench` with `WIDEN=1`), a quantized
        // cache's a few rows at a time; a tile widens them once for all its rows. The same
        // FMAs on the same values either way.
        let in_place = n_pairs <= heads && kv.values_weighed_in_place();
        // The next block's keys in this chunk: asked for piece by piece between the value
        // runs of a decoding row that weighs its values in place, else all at once.
        let next_keys = if decoding && b1 < hi {
            KEY_BLOCK.min(hi - b1)
        } else {
            0
        };
        if next_keys > 0 && !in_place {
            kv.prefetch(b1, next_keys, CachePart::Keys);
        }
        if !in_place {
            kv.values_as_f32(u0, n, value_rows, value_stride(dim));
        }
        for (r, span) in spans.iter().enumerate() {
            let (j0, j1) = reach(span);
            if j0 >= j1 {
                continue;
            }
            let (a, n) = (j0 - u0, j1 - j0);
            let row_scores = &mut scores[r * heads * KEY_BLOCK..(r + 1) * heads * KEY_BLOCK];
            let acc = &mut out[r * heads * dim..(r + 1) * heads * dim];
            // The row's heads together (one call each step for all of them, their chains
            // interleaved): each head's steps as it would take them alone.
            let runs = &mut row_scores[a..];
            let mut block_max = [f32::NEG_INFINITY; MAX_HEADS];
            match shape.softcap {
                None => {
                    scale_and_max_runs(runs, KEY_BLOCK, n, shape.scale, &mut block_max[..heads])
                }
                Some(_) => {
                    for (g, block_max) in block_max.iter_mut().take(heads).enumerate() {
                        let s = &mut runs[g * KEY_BLOCK..g * KEY_BLOCK + n];
                        shape.apply(s);
                        *block_max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    }
                }
            }
            let mut shifts = [0f32; MAX_HEADS];
            for (g, shift) in shifts.iter_mut().take(heads).enumerate() {
                let at = r * heads + g;
                let m = max[at].max(block_max[g]);
                if m > max[at] && sum[at] > 0.0 {
                    let c = (max[at] - m).exp();
                    sum[at] *= c;
                    acc[g * dim..(g + 1) * dim].iter_mut().for_each(|o| *o *= c);
                }
                max[at] = m;
                *shift = m;
            }
            let mut block_sums = [0f32; MAX_HEADS];
            exp_shifted_sums(runs, KEY_BLOCK, n, &shifts[..heads], &mut block_sums);
            for (g, block_sum) in block_sums.iter().take(heads).enumerate() {
                sum[r * heads + g] += block_sum;
            }
            if in_place {
                // Pieces of the run, each its positions in order: the same sums as one run.
                let piece = if next_keys > 0 { VALUE_PIECE } else { n };
                let pieces = n.div_ceil(piece);
                for p in 0..pieces {
                    let (k0, k1) = (p * piece, ((p + 1) * piece).min(n));
                    let (f0, f1) = (next_keys * p / pieces, next_keys * (p + 1) / pieces);
                    if f1 > f0 {
                        kv.prefetch(b1 + f0, f1 - f0, CachePart::Keys);
                    }
                    let w = &row_scores[a + k0..];
                    kv.value_axpys_run(j0 + k0, k1 - k0, w, KEY_BLOCK, heads, acc);
                }
            }
        }
        if in_place {
            continue;
        }
        // The weighted values strip by strip of the heads' elements, every row meeting a
        // strip while it is in the first-level cache (a 256-element head's block of values is
        // 64 KiB); each strip starts at a multiple of 16 elements, so the bits of whole rows.
        for d0 in (0..dim).step_by(VALUE_STRIP) {
            let width = VALUE_STRIP.min(dim - d0);
            for (r, span) in spans.iter().enumerate() {
                let (j0, j1) = reach(span);
                if j0 >= j1 {
                    continue;
                }
                let (a, n) = (j0 - u0, j1 - j0);
                let vs = value_stride(dim);
                let values = crate::ops::Rows {
                    data: &value_rows[a * vs + d0..(a + n - 1) * vs + d0 + width],
                    stride: vs,
                    rows: n,
                    dim: width,
                };
                let weights = &scores[r * heads * KEY_BLOCK + a..];
                let acc = &mut out[r * heads * dim + d0..(r + 1) * heads * dim];
                crate::ops::axpy_heads_run_strip(acc, dim, heads, weights, KEY_BLOCK, values);
            }
        }
    }
}

/// Elements of the heads per pass of the weighted values over a tile's rows (a multiple of
/// 16).
const VALUE_STRIP: usize = 64;

/// Positions a decoding row weighs between two requests for its next block's keys.
const VALUE_PIECE: usize = 16;

/// Floats from one widened value row to the next: a head's length and one vector more, so a
/// strip's rows do not all fall in the same few sets of the first-level cache (rows of 256
/// floats, 1 KiB apart, would put a 64-key strip's 256 lines in 16 of its 64 sets).
fn value_stride(dim: usize) -> usize {
    dim + KEY_LANES
}

/// Zeros standing in for an f16 cache's keys past a block's end, up to a whole vector of keys.
static ZERO_KEY: [half::f16; 1024] = [half::f16::ZERO; 1024];

/// [`ZERO_KEY`] as Q8_0 blocks (scale zero).
static ZERO_Q8_0_KEY: [u8; 1024 / 32 * 34] = [0; 1024 / 32 * 34];

/// [`lone_row_scores`] over keys `u0..u0 + n` of `kv`, where the cache holds f16 or Q8_0 rows
/// (false, doing nothing, otherwise or where that kernel does not run); with `values_ahead`,
/// asking for those positions' values on the way where they are f16.
#[allow(clippy::too_many_arguments)]
fn lone_row_block_scores(
    kv: &impl KvView,
    u0: usize,
    n: usize,
    dim: usize,
    q: &[f32],
    pairs: &[ScorePair],
    scores: &mut [f32],
    values_ahead: bool,
) -> bool {
    if dim > ZERO_KEY.len() || !lone_row_scores_run(pairs.len(), dim) {
        return false;
    }
    let mut values = [&ZERO_KEY[..0]; KEY_BLOCK];
    let ahead = match values_ahead && kv.value_rows_f16(u0, &mut values[..n]) {
        true => &values[..n],
        false => &values[..0],
    };
    let padded = n.next_multiple_of(KEY_LANES);
    let mut rows = [&ZERO_KEY[..dim]; KEY_BLOCK];
    if kv.key_rows_f16(u0, &mut rows[..n]) {
        return lone_row_scores::<F16Keys, _>(&rows[..padded], dim, q, pairs, scores, ahead);
    }
    let row_bytes = dim / 32 * 34;
    let mut blocks = [&ZERO_Q8_0_KEY[..row_bytes.min(ZERO_Q8_0_KEY.len())]; KEY_BLOCK];
    row_bytes <= ZERO_Q8_0_KEY.len()
        && kv.key_rows_q8_0(u0, &mut blocks[..n])
        && lone_row_scores::<Q8_0Keys, _>(&blocks[..padded], dim, q, pairs, scores, ahead)
}

/// Keys `u0..u0 + n` of `kv` into `keys_t` ([`transpose_keys`]'s layout), columns `n` up to a
/// multiple of [`KEY_LANES`] zero: straight from an f16 cache's rows, else through f32 rows
/// in `key_rows`.
fn transpose_block_keys(
    kv: &impl KvView,
    u0: usize,
    n: usize,
    dim: usize,
    key_rows: &mut [f32],
    keys_t: &mut [f32],
) {
    let padded = n.next_multiple_of(KEY_LANES);
    if dim <= ZERO_KEY.len() {
        let mut rows = [&ZERO_KEY[..dim]; KEY_BLOCK];
        if kv.key_rows_f16(u0, &mut rows[..n]) {
            return transpose_keys(&rows[..padded], dim, keys_t);
        }
    }
    kv.keys_as_f32(u0, n, key_rows, dim);
    key_rows[n * dim..padded * dim].fill(0.0);
    let mut rows: [&[f32]; KEY_BLOCK] = [&[]; KEY_BLOCK];
    for (row, key) in rows.iter_mut().zip(key_rows.chunks_exact(dim)) {
        *row = key;
    }
    transpose_keys(&rows[..padded], dim, keys_t);
}
