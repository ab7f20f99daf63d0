//! The two passes: the copy's logits and their bounds, the cut's threshold, the file's rows
//! where the bounds reach it.

use rill_gguf::GgufFile;
use rill_kernels::{Activations, QuantProduct, ThreadPool};

use super::sketch::{HeadSketch, ERR_BLOCK};
use super::{HeadCut, HeadStats};
use crate::{ModelConfig, ModelError, Weight};

/// A row whose activation term exceeds the running mean by this factor takes the one-pass head.
const OUTLIER_RATIO: f64 = 1.4;

/// Refining at least one group in this many goes through the one-pass head instead.
const FULL_HEAD_SHARE_INV: usize = 4;

/// The first pass's activations.
const FIRST_PASS: Activations = Activations::Int8;

/// `‖x − x̂‖₂` bound for `x` quantized to 8 bits in blocks of `block` elements, one level.
fn act_error(x: &[f32], block: usize) -> f64 {
    let mut sq = 0f64;
    for b in x.chunks(block) {
        let amax = b.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let step = ACT_ERR * amax / 127.0;
        sq += b.len() as f64 * step * step;
    }
    sq.sqrt()
}

/// The largest element of any activation block the kernels quantize to 8 bits (Q8_K's).
const ACT_BLOCK: usize = 256;

/// Per element, `|x − x̂| ≤ ACT_ERR · amax / 127` for an 8-bit block with scale `amax / 127`:
/// half a step for the rounding, plus the scale's storage as f16 (2⁻¹¹ relative, times up to
/// 127 steps), with room to spare.
const ACT_ERR: f64 = 0.57;

/// Relative room for the rounding of the products' f32 sums (a few hundred additions of
/// rounded terms: under 1e-4 of `‖w‖·‖h‖` by a wide margin).
const SUM_SLACK: f64 = 1e-4;

/// A model's head, its copy, and the architecture's transform of the product.
pub(crate) struct TwoPass<'a> {
    pub(crate) pool: &'a ThreadPool,
    pub(crate) file: &'a GgufFile,
    pub(crate) head: &'a Weight,
    pub(crate) sketch: &'a HeadSketch,
    pub(crate) cfg: &'a ModelConfig,
    /// Rows predicted to reach far take the one-pass head ([`super::TwoPassMode::Auto`]).
    pub(crate) adaptive: bool,
}

/// Buffers the two passes reuse from step to step.
#[derive(Default)]
pub(crate) struct TwoPassScratch {
    /// Per logits row: ‖h‖ over each error block, then the row's constant term.
    block_norms: Vec<f32>,
    /// Per logits row: (the whole-row term per unit of ‖w‖, the cut's threshold).
    row_terms: Vec<(f32, f32)>,
    /// Head groups refined so far, and whether each group is.
    groups: Vec<u32>,
    refined: Vec<bool>,
    /// Groups the next refinement computes.
    pending: Vec<u32>,
    gathered: Vec<u8>,
    exact: Vec<f32>,
    best: Vec<(f32, u32)>,
    /// One row of logits' upper bounds.
    upper: Vec<f32>,
    /// Running mean of the rows' activation terms (see [`OUTLIER_RATIO`]).
    usual_per_norm: f64,
}

impl TwoPass<'_> {
    /// The architecture's transform of a product (logit scale, final soft cap), as the one-pass
    /// head applies it.
    fn transform(&self, v: f32) -> f32 {
        let mut l = v;
        if let Some(s) = self.cfg.logit_scale {
            l /= s;
        }
        if let Some(cap) = self.cfg.final_logit_softcap {
            l = cap * (l / cap).tanh();
        }
        l
    }

    /// Every logit of `n` rows by the one-pass head (into `out`, resized).
    fn one_pass(
        &self,
        rows: &[f32],
        n: usize,
        out: &mut Vec<f32>,
        scratch: &mut Vec<u8>,
    ) -> Result<(), ModelError> {
        let precision = crate::Precision::Fast;
        let (pool, file, head, cfg) = (self.pool, self.file, self.head, self.cfg);
        crate::forward::head_logits(pool, precision, file, head, cfg, rows, n, out, scratch)
    }

    /// A product below which the transform is certainly below `t` (a bit lower than its
    /// inverse, for the prefilter; the exact test is done on the transform).
    fn raw_below(&self, t: f32) -> f32 {
        let mut r = t as f64;
        if let Some(cap) = self.cfg.final_logit_softcap {
            let c = cap as f64;
            let ratio = r / c;
            if ratio >= 1.0 {
                return f32::INFINITY;
            }
            if ratio <= -1.0 {
                return f32::NEG_INFINITY;
            }
            r = c * ratio.atanh();
        }
        if let Some(s) = self.cfg.logit_scale {
            r *= s as f64;
        }
        (r - 1e-3 * (1.0 + r.abs())) as f32
    }
}

/// Logits of `n = cuts.len()` rows (`rows`: the head's inputs, `n × cols`) into `logits`
/// (`n × vocab`): every token a row's cut needs holds the one-pass head's value bit for bit, and
/// every other token holds the first pass's estimate, certified below the cut.
pub(crate) fn two_pass_logits(
    tp: &TwoPass,
    rows: &[f32],
    cuts: &[HeadCut],
    logits: &mut Vec<f32>,
    scratch: &mut Vec<u8>,
    s: &mut TwoPassScratch,
) -> Result<HeadStats, ModelError> {
    let sk = tp.sketch;
    let (vocab, cols, n) = (sk.rows, sk.cols, cuts.len());
    let rows = &rows[..n * cols];
    logits.clear();
    logits.resize(n * vocab, 0.0);

    // Each row's side of the bounds.
    let blocks = cols / ERR_BLOCK;
    // Whole-row bounds on the activations' quantization error, per 8-bit block size: the
    // copy's (32-element blocks) and the head's own (its paired format's blocks and levels).
    let head_block = if tp.head.ty.block_size() >= ACT_BLOCK {
        ACT_BLOCK
    } else {
        ERR_BLOCK
    };
    let levels = |a: Activations| match a {
        Activations::Int8Refined => ACT_ERR / 127.0,
        Activations::Float => 0.0,
        Activations::Int8 | Activations::Int16 => 1.0,
    };
    s.block_norms.clear();
    s.row_terms.clear();
    for h in rows.chunks_exact(cols) {
        for b in h.chunks_exact(ERR_BLOCK) {
            let norm = b.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt() * (1.0 + 1e-9);
            s.block_norms.push((norm as f32).next_up());
        }
        let h_norm = h.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
        let copy_act = act_error(h, ERR_BLOCK) * levels(FIRST_PASS);
        let head_act = act_error(h, head_block) * levels(tp.head.activations);
        let per_norm = copy_act + head_act + SUM_SLACK * h_norm;
        s.row_terms.push(((per_norm * (1.0 + 1e-6)) as f32, 0.0));
    }

    // Rows whose activation term stands far above the usual (an outlier-heavy hidden state)
    // have bounds wide enough to reach most of the vocabulary: measured on Gemma 3, such rows
    // refined 45-100% of the head after a wasted first pass, while rows under 1.4 times the
    // running mean refined under 5%. Those go to the one-pass head directly.
    let usual = s.usual_per_norm;
    let outlier = tp.adaptive
        && usual > 0.0
        && s.row_terms
            .iter()
            .any(|&(per_norm, _)| per_norm as f64 > OUTLIER_RATIO * usual);
    if outlier {
        tp.one_pass(rows, n, logits, scratch)?;
        return Ok(HeadStats {
            full_rows: n as u64,
            bytes: tp.head.fast_data(tp.file).0.len() as u64,
            ..HeadStats::default()
        });
    }
    for &(per_norm, _) in &s.row_terms {
        s.usual_per_norm = if usual == 0.0 {
            per_norm as f64
        } else {
            usual + (per_norm as f64 - usual) / 32.0
        };
    }

    // First pass: the copy's products.
    rill_kernels::matmul_quant_group(
        &mut [QuantProduct {
            ty: sk.ty,
            weights: &sk.data,
            n_rows: vocab,
            out: &mut logits[..],
            activations: FIRST_PASS,
            layout: sk.layout,
        }],
        cols,
        rows,
        n,
        scratch,
        tp.pool,
    )?;

    // The seeds: each row's best first-pass tokens.
    s.groups.clear();
    s.refined.clear();
    s.refined.resize(vocab.div_ceil(sk.group), false);
    s.pending.clear();
    for (t, cut) in cuts.iter().enumerate() {
        let k = match *cut {
            HeadCut::TopK(k) => k as usize,
            _ => 1,
        };
        let a = &logits[t * vocab..(t + 1) * vocab];
        top_by_estimate(a, k, &mut s.best);
        for &(_, j) in &s.best {
            let g = j as usize / sk.group;
            if !s.refined[g] {
                s.refined[g] = true;
                s.pending.push(g as u32);
            }
        }
    }
    refine(tp, rows, n, logits, scratch, s)?;

    // Each row's threshold from its exact values so far, then every token whose bound reaches it.
    for (t, cut) in cuts.iter().enumerate() {
        let row = &logits[t * vocab..(t + 1) * vocab];
        let threshold = match *cut {
            HeadCut::TopK(k) => {
                let k = k as usize;
                s.exact.clear();
                for &g in &s.groups {
                    let g = g as usize * sk.group;
                    s.exact
                        .extend_from_slice(&row[g..(g + sk.group).min(vocab)]);
                }
                // The k-th largest exact value so far is at most the true k-th largest (the
                // seeds alone are k tokens).
                if s.exact.len() < k {
                    f32::NEG_INFINITY
                } else {
                    let at = s.exact.len() - k;
                    s.exact.select_nth_unstable_by(at, |a, b| a.total_cmp(b));
                    s.exact[at]
                }
            }
            HeadCut::Within(delta) => {
                let mut best = f32::NEG_INFINITY;
                for &g in &s.groups {
                    let g = g as usize * sk.group;
                    for &v in &row[g..(g + sk.group).min(vocab)] {
                        best = best.max(v);
                    }
                }
                best - delta
            }
            HeadCut::Full => f32::NEG_INFINITY,
        };
        s.row_terms[t].1 = threshold;
    }
    for t in 0..n {
        let (per_norm, threshold) = s.row_terms[t];
        let raw = tp.raw_below(threshold);
        s.upper.resize(vocab, 0.0);
        // Over the pool, in parts of whole groups: memory-bound, a few MB of codes a row.
        let estimate = &logits[t * vocab..(t + 1) * vocab];
        let block_norms = &s.block_norms[t * blocks..(t + 1) * blocks];
        let group = rill_kernels::ops::BOUND_GROUP;
        let part = vocab
            .div_ceil(tp.pool.n_threads().max(1))
            .next_multiple_of(group)
            .max(group);
        let failed = std::sync::atomic::AtomicBool::new(false);
        tp.pool.run_chunks_mut(&mut s.upper, part, |i, upper| {
            let r = i * part..i * part + upper.len();
            let g = r.start / group * blocks * group..r.end.div_ceil(group) * blocks * group;
            let bounds = rill_kernels::ops::HeadBounds {
                estimate: &estimate[r.clone()],
                codes: &sk.codes[g],
                unit: &sk.unit[r.clone()],
                norm: &sk.norm[r],
                block_norms,
                per_norm,
            };
            if rill_kernels::ops::head_upper_bounds(&bounds, upper).is_err() {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        if failed.into_inner() {
            return Err(rill_kernels::KernelError::LengthMismatch {
                what: "head bound codes",
                expected: sk.codes.len(),
                actual: vocab,
            }
            .into());
        }
        // Most chunks hold no token that reaches the cut.
        const CHUNK: usize = 64;
        for (c, chunk) in s.upper.chunks(CHUNK).enumerate() {
            if chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max) < raw {
                continue;
            }
            for (i, &u) in chunk.iter().enumerate() {
                let g = (c * CHUNK + i) / sk.group;
                if u >= raw && !s.refined[g] && tp.transform(u) >= threshold {
                    s.refined[g] = true;
                    s.pending.push(g as u32);
                }
            }
        }
    }
    refine(tp, rows, n, logits, scratch, s)?;

    // Everything not refined keeps its estimate, transformed as the head's values are.
    let has_transform = tp.cfg.logit_scale.is_some() || tp.cfg.final_logit_softcap.is_some();
    if has_transform {
        for t in 0..n {
            let row = &mut logits[t * vocab..(t + 1) * vocab];
            for (g, chunk) in row.chunks_mut(sk.group).enumerate() {
                if !s.refined[g] {
                    chunk.iter_mut().for_each(|v| *v = tp.transform(*v));
                }
            }
        }
    }
    let refined_rows = (s.groups.len() * sk.group).min(vocab);
    let fell_back = refined_rows == vocab;
    let head_row_bytes = tp.head.fast_data(tp.file).0.len() / vocab.max(1);
    Ok(HeadStats {
        rows: n as u64,
        full_rows: 0,
        fallback_rows: if fell_back { n as u64 } else { 0 },
        refined: (n * refined_rows) as u64,
        vocab: (n * vocab) as u64,
        bytes: (sk.bytes() + refined_rows * head_row_bytes) as u64,
    })
}

/// The `k` largest values of `a` with their indices (ties: any), into `best`.
fn top_by_estimate(a: &[f32], k: usize, best: &mut Vec<(f32, u32)>) {
    best.clear();
    if k == 1 {
        // Two vectorisable passes: the largest value, then where it first is.
        let max = a.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let at = a.iter().position(|&v| v == max).unwrap_or(0);
        best.push((max, at as u32));
        return;
    }
    let mut floor = f32::NEG_INFINITY;
    for (j, &v) in a.iter().enumerate() {
        if best.len() < k || v > floor {
            if best.len() == k {
                best.pop();
            }
            let at = best.partition_point(|&(b, _)| b >= v);
            best.insert(at, (v, j as u32));
            if best.len() == k {
                floor = best[k - 1].0;
            }
        }
    }
}

/// Computes the file's rows of the pending groups for every row of logits, exactly as the
/// one-pass head does, and writes them (transformed) over the estimates.
fn refine(
    tp: &TwoPass,
    rows: &[f32],
    n: usize,
    logits: &mut [f32],
    scratch: &mut Vec<u8>,
    s: &mut TwoPassScratch,
) -> Result<(), ModelError> {
    if s.pending.is_empty() {
        return Ok(());
    }
    let sk = tp.sketch;
    let vocab = sk.rows;
    let (data, layout) = tp.head.fast_data(tp.file);
    let row_bytes = data.len() / vocab;
    let g_rows = sk.group;
    let g_bytes = g_rows * row_bytes;
    let groups = vocab.div_ceil(g_rows);
    if s.pending.len() * FULL_HEAD_SHARE_INV >= groups {
        // So many groups that copying them out costs more than reading every row in place:
        // the one-pass head over everything (the rows refined before are computed again, to
        // the same bits).
        tp.one_pass(rows, n, &mut s.exact, scratch)?;
        logits[..n * vocab].copy_from_slice(&s.exact[..n * vocab]);
        s.pending.clear();
        s.groups.clear();
        s.groups.extend(0..groups as u32);
        s.refined.iter_mut().for_each(|r| *r = true);
        return Ok(());
    }
    s.pending.sort_unstable();
    s.gathered.clear();
    for &g in &s.pending {
        let start = g as usize * g_bytes;
        s.gathered.extend_from_slice(&data[start..start + g_bytes]);
    }
    let m = s.pending.len() * g_rows;
    s.exact.clear();
    s.exact.resize(n * m, 0.0);
    rill_kernels::matmul_quant_group(
        &mut [QuantProduct {
            ty: tp.head.ty,
            weights: &s.gathered,
            n_rows: m,
            out: &mut s.exact[..],
            activations: tp.head.activations,
            layout,
        }],
        tp.head.cols,
        rows,
        n,
        scratch,
        tp.pool,
    )?;
    for t in 0..n {
        for (i, &g) in s.pending.iter().enumerate() {
            let dst = g as usize * g_rows;
            let src = &s.exact[t * m + i * g_rows..t * m + (i + 1) * g_rows];
            for (o, &v) in logits[t * vocab + dst..t * vocab + dst + g_rows]
                .iter_mut()
                .zip(src)
            {
                *o = tp.transform(v);
            }
        }
    }
    s.groups.append(&mut s.pending);
    Ok(())
}
