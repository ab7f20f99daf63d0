//! Attention of a batch over the KV cache, spread over the pool: row by row with a whole-row
//! softmax on the exact path, in tiles with an online softmax on the fast one.

use std::sync::atomic::{AtomicUsize, Ordering};

use rill_kernels::attention::CachePart;
use rill_kernels::ops::KvView;
use rill_kernels::{attention, ops};

use crate::forward::{fit, Batch, BatchRow};
use crate::kv_cache::KvCache;
use crate::{ModelConfig, ModelError};

/// What one layer's attention reads besides the queries.
#[derive(Clone, Copy)]
pub(crate) struct LayerAttention<'a> {
    pub kv: &'a KvCache,
    pub layer: usize,
    /// This layer's heads.
    pub shape: crate::AttentionShape,
    /// Sliding window of this layer, if it has one.
    pub window: Option<usize>,
    pub cfg: &'a ModelConfig,
    /// gpt-oss's per-head sink logits.
    pub sinks: Option<&'a [f32]>,
    /// A bidirectional model's sequences and their lengths after the pass: a row sees all of
    /// its sequence's keys. `None`: causal, a row sees keys up to its own position.
    pub seq_ends: Option<&'a [(crate::SeqId, usize)]>,
}

impl LayerAttention<'_> {
    /// The end (exclusive) of the keys `row` attends to.
    pub(crate) fn keys_end(&self, row: &BatchRow) -> usize {
        let whole = self
            .seq_ends
            .and_then(|ends| ends.iter().find(|(s, _)| *s == row.seq));
        whole.map_or(row.pos + 1, |&(_, len)| len)
    }
}

/// The exact path's attention of every (row, head) of the batch ([`ops::attend`]: a softmax
/// over the whole row, summed in f64), spread over the pool. Units are dealt round-robin
/// to `n_chunks` tasks so causal rows of different lengths balance out; each unit is computed
/// whole by one task, so the result does not depend on the split (batch invariance).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_by_row(
    pool: &rill_kernels::ThreadPool,
    batch: &Batch,
    la: &LayerAttention,
    q: &[f32],
    attn: &mut [f32],
    scores: &mut Vec<f32>,
    max_len: usize,
    softmax: fn(&mut [f32]),
) -> Result<(), ModelError> {
    let LayerAttention {
        kv,
        layer,
        shape,
        window,
        cfg,
        sinks,
        ..
    } = *la;
    let (hd, n_heads, n_kv_heads) = (shape.head_dim, cfg.n_heads, shape.n_kv_heads);
    let q_dim = n_heads * hd;
    let group = n_heads / n_kv_heads;
    // Query heads that share a KV head are computed together (each key and value read once for
    // all of them) when that still leaves enough units for every thread; alone otherwise (one
    // decoding row of a model with a single KV head would otherwise keep one thread busy).
    // Both give the same bits.
    let together = group.min(ops::MAX_HEADS);
    let units_together = batch.len() * n_heads.div_ceil(together);
    let heads_per_unit = if units_together >= 2 * pool.n_threads() {
        together
    } else {
        1
    };
    let units_per_row = n_kv_heads * group.div_ceil(heads_per_unit);
    let units = batch.len() * units_per_row;
    let n_chunks = pool.n_threads().min(units);
    let per_chunk = heads_per_unit * max_len;
    let scores = fit(scores, n_chunks * per_chunk);
    let attn_ptr = UnitOutputs(attn.as_mut_ptr());
    // Views are checked up front so the parallel part cannot fail.
    for row in &batch.rows {
        kv.view(layer, row.seq, 0, la.keys_end(row))?;
    }
    pool.run_chunks_mut(scores, per_chunk, |chunk, scores| {
        for unit in (chunk..units).step_by(n_chunks) {
            let (t, in_row) = (unit / units_per_row, unit % units_per_row);
            let chunks_per_kv = group.div_ceil(heads_per_unit);
            let (kv_head, part) = (in_row / chunks_per_kv, in_row % chunks_per_kv);
            let head = kv_head * group + part * heads_per_unit;
            let heads = heads_per_unit.min(kv_head * group + group - head);
            let row = &batch.rows[t];
            let last = la.keys_end(row);
            let first = window.map_or(0, |w| last.saturating_sub(w));
            // Checked above for every row; a failure here cannot happen.
            let Ok(view) = kv.view(layer, row.seq, kv_head, last) else {
                continue;
            };
            let at = t * q_dim + head * hd;
            // SAFETY: unit (t, heads) is the only writer of attn[at..at + heads * hd].
            let out = unsafe { std::slice::from_raw_parts_mut(attn_ptr.get().add(at), heads * hd) };
            let q = &q[at..at + heads * hd];
            let span = (first, last);
            let shape = ops::ScoreShape {
                scale: cfg.attention_scale,
                softcap: cfg.attn_logit_softcap,
                sinks: sinks.map(|s| &s[head..head + heads]),
            };
            if heads == 1 {
                ops::attend(q, &view, span, shape, softmax, scores, out);
            } else {
                ops::attend_heads(q, heads, &view, span, shape, softmax, scores, out);
            }
        }
    });
    Ok(())
}

/// How the fast path's attention of a batch is cut into work: its tiles (first row, rows),
/// its units, and the chunk states of split rows. Kept between passes so that decoding
/// allocates nothing once they have grown.
#[derive(Default)]
pub(crate) struct TilePlan {
    tiles: Vec<(usize, usize)>,
    units: Vec<Unit>,
    /// Per split unit: its heads' unnormalised outputs, maxima and sums.
    states: Vec<f32>,
}

/// One unit of attention work: a tile's query heads `head..head + heads` (sharing KV head
/// `kv_head`), or one [`attention::KEY_CHUNK`] of a single-row tile's keys for every head (the
/// whole rows of the cache there read by one thread, one KV head after the other).
#[derive(Clone, Copy)]
struct Unit {
    tile: usize,
    kv_head: usize,
    head: usize,
    heads: usize,
    /// The chunk, and the first slot of `states` its heads' states go to (one per KV head
    /// and part of its query heads, in that order).
    chunk: Option<(usize, usize)>,
}

/// The fast path's attention ([`attention::attend_tile`]): the batch's rows in tiles of up to
/// [`attention::TILE_ROWS`] consecutive positions of one sequence, each tile and KV head (or
/// part of its query heads, when there are too few tiles to keep every thread busy) a unit of
/// work, dealt round-robin to the pool's tasks. A tile of one row (a decoding row) whose keys
/// span several [`attention::KEY_CHUNK`]s is cut into a unit per chunk instead, each reading
/// its part of the cache once for all the query heads, and the chunks' states are merged in
/// order after ([`attention::merge_state`]): the bits `attend_tile` gives. Each row's result
/// depends on that row alone (the key blocks and chunks are fixed by position), so neither the
/// tiling nor the split changes a bit.
pub(crate) fn attention_tiled(
    pool: &rill_kernels::ThreadPool,
    batch: &Batch,
    la: &LayerAttention,
    q: &[f32],
    attn: &mut [f32],
    scratch: &mut Vec<f32>,
    plan: &mut TilePlan,
) -> Result<(), ModelError> {
    let LayerAttention {
        kv,
        layer,
        shape,
        window,
        cfg,
        sinks,
        ..
    } = *la;
    let (hd, n_heads, n_kv_heads) = (shape.head_dim, cfg.n_heads, shape.n_kv_heads);
    let q_dim = n_heads * hd;
    let group = n_heads / n_kv_heads;
    let TilePlan {
        tiles,
        units,
        states,
    } = plan;
    tiles.clear();
    let rows = &batch.rows;
    let mut t = 0;
    while t < rows.len() {
        let start = t;
        t += 1;
        while t < rows.len()
            && t - start < attention::TILE_ROWS
            && rows[t].seq == rows[start].seq
            && rows[t].pos == rows[t - 1].pos + 1
        {
            t += 1;
        }
        tiles.push((start, t - start));
    }
    let span_of = |row: &BatchRow| {
        let last = la.keys_end(row);
        (window.map_or(0, |w| last.saturating_sub(w)), last)
    };
    let chunks_of = |(first, last): (usize, usize)| {
        first / attention::KEY_CHUNK..last.div_ceil(attention::KEY_CHUNK)
    };
    // Query heads sharing a KV head go together (each key and value read once for all of
    // them) unless that leaves a thread idle: then each group is cut into as few parts as give
    // every thread a unit (Gemma 3 decoding a short context: one KV head, four query heads, two
    // threads: two units of two heads, each reading the cache once, rather than four units of
    // one). Split rows bring units of their own and keep their heads together.
    let together = group.min(ops::MAX_HEADS);
    let split =
        |&(start, len): &(usize, usize)| len == 1 && chunks_of(span_of(&rows[start])).len() > 1;
    let chunk_units: usize = tiles
        .iter()
        .filter(|t| split(t))
        .map(|&(start, _)| chunks_of(span_of(&rows[start])).len())
        .sum::<usize>()
        * n_kv_heads
        * group.div_ceil(together);
    let grouped_units = tiles.len() * n_kv_heads * group.div_ceil(together) + chunk_units;
    let parts = pool.n_threads().div_ceil(grouped_units.max(1));
    let whole_heads = together.div_ceil(parts).max(1);
    units.clear();
    let slot_len = together * hd + 2 * together;
    let slots_per_chunk = n_kv_heads * group.div_ceil(together);
    let mut slots = 0;
    for (tile, t) in tiles.iter().enumerate() {
        if split(t) {
            for chunk in chunks_of(span_of(&rows[t.0])) {
                units.push(Unit {
                    tile,
                    kv_head: 0,
                    head: 0,
                    heads: together,
                    chunk: Some((chunk, slots)),
                });
                slots += slots_per_chunk;
            }
            continue;
        }
        for (kv_head, head, heads) in head_parts(n_kv_heads, group, whole_heads) {
            units.push(Unit {
                tile,
                kv_head,
                head,
                heads,
                chunk: None,
            });
        }
    }
    let n_units = units.len();
    let n_chunks = pool.n_threads().min(n_units);
    let max_heads = together.max(whole_heads);
    let scratch_len = attention::tile_scratch_len(attention::TILE_ROWS, max_heads, hd);
    let per_chunk = scratch_len + attention::TILE_ROWS * max_heads * hd;
    let scratch = fit(scratch, n_chunks * per_chunk);
    let states = fit(states, slots * slot_len);
    let attn_ptr = UnitOutputs(attn.as_mut_ptr());
    let states_ptr = UnitOutputs(states.as_mut_ptr());
    // Views are checked up front so the parallel part cannot fail.
    for row in rows {
        kv.view(layer, row.seq, 0, la.keys_end(row))?;
    }
    let (tiles, units) = (&tiles[..], &units[..]);
    // A prompt's tiles (no split rows) are claimed one at a time, the last first: a tile's cost
    // grows with its position, so the costliest go out while the others can still balance
    // them (dealt round-robin, one thread could be left with the last long tile while the
    // other waits). Split rows keep the round-robin deal their chunks' prefetches count on.
    // Each unit writes only its own rows' heads: the order changes no bit.
    let claimed = chunk_units == 0;
    let next_unit = AtomicUsize::new(0);
    let claim = |chunk: usize, taken: usize| -> Option<&Unit> {
        if claimed {
            let i = next_unit.fetch_add(1, Ordering::Relaxed);
            (i < n_units).then(|| &units[n_units - 1 - i])
        } else {
            units.get(chunk + taken * n_chunks)
        }
    };
    pool.run_chunks_mut(scratch, per_chunk, |chunk, mine| {
        let (scratch, out) = mine.split_at_mut(scratch_len);
        let mut taken = 0;
        while let Some(unit) = claim(chunk, taken) {
            taken += 1;
            let Unit {
                tile,
                kv_head,
                head,
                heads,
                chunk: key_chunk,
            } = *unit;
            let (start, len) = tiles[tile];
            let tile_rows = &rows[start..start + len];
            let end = tile_rows.iter().map(|r| la.keys_end(r)).max().unwrap_or(0);
            let shape_of = |head: usize, heads: usize| ops::ScoreShape {
                scale: cfg.attention_scale,
                softcap: cfg.attn_logit_softcap,
                sinks: sinks.map(|s| &s[head..head + heads]),
            };
            if let Some((c, first_slot)) = key_chunk {
                let (first, last) = span_of(&tile_rows[0]);
                let c0 = c * attention::KEY_CHUNK;
                let span = [(first.max(c0), last.min(c0 + attention::KEY_CHUNK))];
                let parts = head_parts(n_kv_heads, group, together);
                for (slot, (kv_head, head, heads)) in (first_slot..).zip(parts) {
                    // Checked above for every row; a failure here cannot happen.
                    let Ok(view) = kv.view(layer, tile_rows[0].seq, kv_head, end) else {
                        continue;
                    };
                    // The first keys of this task's next chunk of the row (units are dealt
                    // round-robin), asked for now, wait in the second-level cache for it (the
                    // chunk's own blocks ask for the next within it): attention against the
                    // head 0.549 -> 0.522 for Gemma 3 at depth 16384, three runs each.
                    let next = (c + n_chunks) * attention::KEY_CHUNK;
                    if next < last {
                        let n = attention::KEY_BLOCK.min(last - next);
                        view.prefetch(next, n, CachePart::Keys);
                    }
                    // SAFETY: the unit is the only writer of its slots.
                    let state = unsafe {
                        std::slice::from_raw_parts_mut(
                            states_ptr.get().add(slot * slot_len),
                            slot_len,
                        )
                    };
                    let (acc, rest) = state.split_at_mut(together * hd);
                    let (max, sum) = rest.split_at_mut(together);
                    let qs = &q[start * q_dim + head * hd..];
                    let shape = shape_of(head, heads);
                    attention::attend_chunk(
                        qs, q_dim, &span, heads, hd, &view, shape, scratch, acc, max, sum,
                    );
                }
                continue;
            }
            // Checked above for every row; a failure here cannot happen.
            let Ok(view) = kv.view(layer, tile_rows[0].seq, kv_head, end) else {
                continue;
            };
            let mut spans = [(0, 0); attention::TILE_ROWS];
            for (span, row) in spans.iter_mut().zip(tile_rows) {
                *span = span_of(row);
            }
            let shape = shape_of(head, heads);
            let qs = &q[start * q_dim + head * hd..];
            let span = &spans[..len];
            attention::attend_tile(qs, q_dim, span, heads, hd, &view, shape, scratch, out);
            for (r, o) in out.chunks_exact(heads * hd).take(len).enumerate() {
                let at = (start + r) * q_dim + head * hd;
                // SAFETY: unit (tile, heads) is the only writer of these rows' heads.
                let dst =
                    unsafe { std::slice::from_raw_parts_mut(attn_ptr.get().add(at), o.len()) };
                dst.copy_from_slice(o);
            }
        }
    });
    // The split rows: their chunks' states merged in order, as `attend_tile` merges them.
    let mut i = 0;
    while i < units.len() {
        let tile = units[i].tile;
        if units[i].chunk.is_none() {
            i += 1;
            continue;
        }
        let n = units[i..]
            .iter()
            .take_while(|u| u.tile == tile && u.chunk.is_some())
            .count();
        let chunk_units = &units[i..i + n];
        let row = tiles[tile].0;
        for (part, (_, head, heads)) in head_parts(n_kv_heads, group, together).enumerate() {
            let at = row * q_dim + head * hd;
            for g in 0..heads {
                let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
                let o = &mut attn[at + g * hd..at + (g + 1) * hd];
                o.iter_mut().for_each(|x| *x = 0.0);
                for u in chunk_units {
                    let Some((_, first_slot)) = u.chunk else {
                        continue;
                    };
                    let slot = first_slot + part;
                    let state = &states[slot * slot_len..(slot + 1) * slot_len];
                    let (acc, rest) = state.split_at(together * hd);
                    attention::merge_state(
                        (&mut max, &mut sum),
                        o,
                        (rest[g], rest[together + g]),
                        &acc[g * hd..(g + 1) * hd],
                    );
                }
                let sink = sinks.map(|s| s[head + g]);
                attention::finish_state(max, sum, sink, o);
            }
        }
        i += n;
    }
    Ok(())
}

/// Each KV head's query heads in parts of at most `per`: (KV head, first query head, heads).
fn head_parts(
    n_kv_heads: usize,
    group: usize,
    per: usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..n_kv_heads).flat_map(move |kv_head| {
        let end = (kv_head + 1) * group;
        (kv_head * group..end)
            .step_by(per)
            .map(move |head| (kv_head, head, per.min(end - head)))
    })
}

/// An output buffer whose parts belong to attention's work units (a row's heads, a split row's
/// chunk state): every unit writes only the parts it owns, which the units' layout makes
/// disjoint, so the pool's tasks write it at once. The per-chunk scratch goes through
/// [`rill_kernels::ThreadPool::run_chunks_mut`] instead; these parts are not chunks of equal
/// size in task order, so their disjointness is the unit layout's to vouch for.
#[derive(Clone, Copy)]
struct UnitOutputs(*mut f32);

// SAFETY: every unit touches only the (row, head) slices and state slots it owns.
unsafe impl Send for UnitOutputs {}
unsafe impl Sync for UnitOutputs {}

impl UnitOutputs {
    /// A method, not a field access, so closures capture the whole (Sync) wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}
