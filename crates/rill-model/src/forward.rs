//! The forward pass: one implementation for every architecture, driven by [`ModelConfig`].

use rill_kernels::ops;

use crate::attention_layer::AttentionBuffers;
use crate::kv_cache::{KvCache, SeqId};
use crate::linear::{linear, linear_group};
use crate::model::Model;
use crate::pass_cost::{count_flops, dense_weight_bytes};
use crate::profile::{Laps, Stage};
use crate::two_pass_head::{two_pass_logits, HeadCut, HeadStats, TwoPass};
use crate::weights::Mixer;
pub(crate) use crate::workspace::{fit, Workspace};
use crate::{FeedForward, ModelConfig, ModelError};

/// What every layer of one pass shares.
#[derive(Clone, Copy)]
pub(crate) struct Pass<'a> {
    pub pool: &'a rill_kernels::ThreadPool,
    pub precision: Precision,
    pub file: &'a rill_gguf::GgufFile,
    pub cfg: &'a ModelConfig,
    pub batch: &'a Batch,
    /// Each sequence of the batch and its length after the pass (where a bidirectional
    /// model's rows see up to).
    pub seq_ends: &'a [(SeqId, usize)],
}

/// How activations are represented in the matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// f32 activations against exactly dequantized weights: the reference path.
    Exact,
    /// Activations quantized to 8-bit blocks, integer dot products: the fast path.
    Fast,
}

/// One row of a batch: a token of a sequence at a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRow {
    pub seq: SeqId,
    pub token: u32,
    pub pos: usize,
    /// Compute this row's logits.
    pub logits: bool,
    /// Which of its logits must be exact (every one unless a sampler says less; see
    /// [`HeadCut`]).
    pub head: HeadCut,
}

/// Rows processed by one forward pass. Rows of one sequence must be in position order and
/// continue that sequence's cache without gaps.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub rows: Vec<BatchRow>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// A prompt's rows for `seq`, starting at `start_pos`; logits for the last row only, or for
    /// every row when `all_logits`.
    pub fn prompt(seq: SeqId, tokens: &[u32], start_pos: usize, all_logits: bool) -> Batch {
        let n = tokens.len();
        Batch {
            rows: tokens
                .iter()
                .enumerate()
                .map(|(i, &token)| BatchRow {
                    seq,
                    token,
                    pos: start_pos + i,
                    logits: all_logits || i + 1 == n,
                    head: HeadCut::Full,
                })
                .collect(),
        }
    }

    pub fn push(&mut self, seq: SeqId, token: u32, pos: usize, logits: bool) {
        self.rows.push(BatchRow {
            seq,
            token,
            pos,
            logits,
            head: HeadCut::Full,
        });
    }

    /// A row with logits of which only `head`'s cut must be exact.
    pub fn push_cut(&mut self, seq: SeqId, token: u32, pos: usize, head: HeadCut) {
        self.rows.push(BatchRow {
            seq,
            token,
            pos,
            logits: true,
            head,
        });
    }

    /// Whether every row with logits lets the head take two passes.
    pub fn head_may_cut(&self) -> bool {
        let mut any = false;
        for r in self.rows.iter().filter(|r| r.logits) {
            if r.head.is_full() {
                return false;
            }
            any = true;
        }
        any
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Rows that produce logits.
    pub fn n_logits(&self) -> usize {
        self.rows.iter().filter(|r| r.logits).count()
    }
}

impl Model {
    /// Runs `batch` through the model, appending its keys and values to `kv`, and writes the
    /// logits of the rows that asked for them into `logits` (`n_logits × vocab_size`, in row
    /// order). On error nothing is written to the cache.
    pub fn forward(
        &mut self,
        batch: &Batch,
        kv: &mut KvCache,
        precision: Precision,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let n_layers = self.config.n_layers;
        self.forward_layers(batch, kv, precision, logits, n_layers)
    }

    /// [`Model::forward`] through the first `n_layers` blocks only, then the final norm and the
    /// output head: the model's own shallow self (a self-speculative draft). Layers from
    /// `n_layers` on are neither computed nor written in `kv` (the cache keeps the full model's
    /// shape, so such a cache serves only this depth). `n_layers` must be 1..=the model's layers.
    pub fn forward_layers(
        &mut self,
        batch: &Batch,
        kv: &mut KvCache,
        precision: Precision,
        logits: &mut Vec<f32>,
        n_layers: usize,
    ) -> Result<(), ModelError> {
        if n_layers == 0 || n_layers > self.config.n_layers {
            return Err(ModelError::BadBatch {
                row: 0,
                reason: format!(
                    "layer count {n_layers} is outside 1..={}",
                    self.config.n_layers
                ),
            });
        }
        let t_rows = batch.len();
        logits.clear();
        if t_rows == 0 {
            return Ok(());
        }
        if precision == Precision::Fast && batch.head_may_cut() {
            self.ensure_sketch()?;
        }
        let mut new_lens = std::mem::take(&mut self.workspace.seq_lens);
        let result = self
            .validate(batch, kv, &mut new_lens)
            .and_then(|()| Ok(kv.reserve_all(&new_lens)?))
            .and_then(|()| self.compute(batch, kv, precision, logits, &new_lens, n_layers));
        self.workspace.seq_lens = new_lens;
        result
    }

    fn compute(
        &mut self,
        batch: &Batch,
        kv: &mut KvCache,
        precision: Precision,
        logits: &mut Vec<f32>,
        new_lens: &[(SeqId, usize)],
        n_layers: usize,
    ) -> Result<(), ModelError> {
        let t_rows = batch.len();

        let cfg = &self.config;
        let file = &self.file;
        let w = &self.weights;
        let pool = &self.pool;
        let ws = &mut self.workspace;
        let d = cfg.d_model;
        let mut laps = Laps::start(self.profile.as_mut());
        if let Some(p) = laps.times() {
            count_flops(p, cfg, batch, n_layers);
            p.weight_bytes += dense_weight_bytes(w, batch, n_layers, precision);
        }

        // Embeddings.
        let x = fit(&mut ws.x, t_rows * d);
        let embd = w.token_embd.data(file);
        let row_bytes = w.token_embd.row_bytes();
        for (t, row) in batch.rows.iter().enumerate() {
            let tok = row.token as usize;
            let xr = &mut x[t * d..(t + 1) * d];
            rill_kernels::dequantize_row(
                w.token_embd.ty,
                &embd[tok * row_bytes..(tok + 1) * row_bytes],
                xr,
            )?;
            if let Some(s) = cfg.embedding_scale {
                xr.iter_mut().for_each(|v| *v *= s);
            }
        }
        if let Some(e) = &w.encoder {
            e.apply(pool, file, cfg, batch, x)?;
        }

        ws.rope_tables(cfg, w, batch, kv.capacity_tokens());

        if let Some(p) = &w.per_layer_inputs {
            let pass = Pass {
                pool,
                precision,
                file,
                cfg,
                batch,
                seq_ends: new_lens,
            };
            let [inputs, table_rows, ..] = &mut ws.per_layer;
            let x0 = &ws.x[..t_rows * d];
            p.compute(&pass, x0, (inputs, table_rows), &mut ws.quant_scratch)?;
        }
        laps.lap(Stage::Embed);
        let mut capture = self.capture.take();
        if let Some(c) = capture.as_mut() {
            c.begin(batch.n_logits());
            c.record(&ws.x[..t_rows * d], d, batch.rows.iter().map(|r| r.logits));
        }

        fit(&mut ws.h, t_rows * d);
        fit(&mut ws.o, t_rows * d);
        fit(&mut ws.gate, t_rows * cfg.ffn_dim);
        fit(&mut ws.up, t_rows * cfg.ffn_dim);

        if kv.recurrent().is_some() {
            crate::recurrent::group_rows(batch, kv.block_size(), &mut ws.recurrent.seqs);
            // A pass of several rows continuing a sequence (a draft's verification, a prompt's
            // next chunk) may be rolled back: its state after its first row is kept (a round's
            // rollback keeps the pending token's row, so it needs no recomputation).
            for s in &mut ws.recurrent.seqs {
                if s.rows.len() > 1 && batch.rows[s.rows[0]].pos > 0 && kv.keeps_checkpoints(s.seq)
                {
                    s.checkpoint_after = Some(0);
                }
            }
        }
        // Layers that store no keys or values (Gemma 4's KV-shared last layers) change nothing
        // later rows read: past the last layer that stores some, only the rows with logits go on.
        let full_batch = batch;
        let logging = self.hidden_log.is_some();
        let tail_from = (cfg.kv_shared_tail())
            .filter(|&first| first < n_layers && kv.recurrent().is_none() && !logging);
        let mut tail = std::mem::take(&mut ws.tail_batch);
        tail.rows.clear();
        if tail_from.is_some() {
            tail.rows.extend(batch.rows.iter().filter(|r| r.logits));
        }
        let mut batch = full_batch;
        let mut t_rows = t_rows;
        for (il, lw) in w.layers.iter().enumerate().take(n_layers) {
            if Some(il) == tail_from && tail.len() < t_rows {
                if tail.is_empty() {
                    break;
                }
                let kept = full_batch.rows.iter().enumerate().filter(|(_, r)| r.logits);
                let widths = [
                    d,
                    cfg.rope_dim / 2,
                    cfg.rope_dim_local / 2,
                    cfg.n_layers * cfg.per_layer_input.unwrap_or(0),
                ];
                for (i, (t, _)) in kept.enumerate() {
                    let [x, cos_g, sin_g, cos_l, sin_l, inputs] = [
                        (&mut ws.x, widths[0]),
                        (&mut ws.cos_global, widths[1]),
                        (&mut ws.sin_global, widths[1]),
                        (&mut ws.cos_local, widths[2]),
                        (&mut ws.sin_local, widths[2]),
                        (&mut ws.per_layer[0], widths[3]),
                    ];
                    for (buf, width) in [x, cos_g, sin_g, cos_l, sin_l, inputs] {
                        buf.copy_within(t * width..(t + 1) * width, i * width);
                    }
                }
                batch = &tail;
                t_rows = tail.len();
            }
            let pass = Pass {
                pool,
                precision,
                file,
                cfg,
                batch,
                seq_ends: new_lens,
            };
            let x = &mut ws.x[..t_rows * d];
            let h = &mut ws.h[..t_rows * d];
            norm_rows(pool, x, lw.attn_norm.as_deref(), cfg, h);
            laps.lap(Stage::Norm);
            let o = &mut ws.o[..t_rows * d];
            let o_bias = match &lw.mixer {
                Mixer::Attention(a) => {
                    crate::attention_layer::attention_layer(
                        &pass,
                        a,
                        il,
                        kv,
                        AttentionBuffers {
                            h,
                            q: &mut ws.q,
                            k: &mut ws.k,
                            v: &mut ws.v,
                            gate: &mut ws.attn_gate,
                            attn: &mut ws.attn,
                            o: &mut *o,
                            scores: &mut ws.scores,
                            tiles: &mut ws.tiles,
                            quant_scratch: &mut ws.quant_scratch,
                            rope: [&ws.cos_global, &ws.sin_global, &ws.cos_local, &ws.sin_local],
                        },
                        capture.as_mut(),
                        &mut laps,
                    )?;
                    a.o_bias.as_deref()
                }
                recurrent => {
                    crate::recurrent::recurrent_layer(
                        &pass,
                        recurrent,
                        il,
                        kv,
                        (h, o),
                        &mut ws.recurrent,
                        &mut ws.quant_scratch,
                        &mut laps,
                    )?;
                    if let Some(c) = capture.as_mut() {
                        c.record_recurrent_layer();
                    }
                    None
                }
            };
            let o = &mut ws.o[..t_rows * d];
            residual_add(pool, x, o, o_bias, lw.post_attn_norm.as_deref(), cfg);
            if let Some(norms) = &lw.residual_norms {
                crate::encoder::layer_norm_rows(pool, x, &norms[0], cfg);
            }
            laps.lap(Stage::Residual);
            if let Some(c) = capture.as_mut() {
                c.record_mid(x, d, batch.rows.iter().map(|r| r.logits));
            }

            norm_rows(pool, x, lw.ffn_norm.as_deref(), cfg, h);
            laps.lap(Stage::Norm);
            match &lw.ffn {
                FeedForward::Plain(ffn) => {
                    let f = ffn.up.rows;
                    let up = &mut ws.up[..t_rows * f];
                    let scratch = &mut ws.quant_scratch;
                    linear(pool, precision, file, &ffn.up, h, t_rows, up, scratch)?;
                    laps.lap(Stage::GateUp);
                    crate::encoder::biased_gelu_rows(pool, up, ffn.up_bias.as_deref(), precision);
                    laps.lap(Stage::Activation);
                    linear(pool, precision, file, &ffn.down, up, t_rows, o, scratch)?;
                    laps.lap(Stage::Down);
                }
                FeedForward::Dense(ffn) => {
                    // Gemma 4's layers differ in width.
                    let f = ffn.gate.rows;
                    let gate = &mut ws.gate[..t_rows * f];
                    let up = &mut ws.up[..t_rows * f];
                    linear_group(
                        pool,
                        precision,
                        file,
                        &mut [(&ffn.gate, &mut *gate), (&ffn.up, &mut *up)],
                        h,
                        t_rows,
                        &mut ws.quant_scratch,
                    )?;
                    laps.lap(Stage::GateUp);
                    gate_in_parallel(pool, gate, up, cfg.activation, precision);
                    laps.lap(Stage::Activation);
                    linear(
                        pool,
                        precision,
                        file,
                        &ffn.down,
                        gate,
                        t_rows,
                        o,
                        &mut ws.quant_scratch,
                    )?;
                    laps.lap(Stage::Down);
                }
                FeedForward::Routed {
                    router,
                    router_bias,
                    selection_bias,
                    experts,
                    shared,
                    beside,
                    expert_scales,
                    ..
                } => {
                    let moe = cfg.moe.as_ref().ok_or(ModelError::MissingMetadata(
                        "expert_count (the file has routed experts)".into(),
                    ))?;
                    let mut router = crate::moe::Router {
                        weight: router,
                        bias: router_bias.as_deref(),
                        selection_bias: selection_bias.as_deref(),
                        input: None,
                        expert_scales: expert_scales.as_deref(),
                    };
                    // Gemma 4: the dense branch first (into `o`), then the experts' input and
                    // the router's, both from the residual stream; the experts' output goes to
                    // a buffer of its own, added to `o` once normed.
                    let (mut branch, mut router_input) = (None, Vec::new());
                    if let Some(b) = beside {
                        let scratch = &mut ws.quant_scratch;
                        crate::moe::dense_beside(&pass, b, x, (h, o), &mut ws.moe, scratch)?;
                        laps.lap(Stage::Down);
                        router_input = std::mem::take(&mut ws.moe.router_input);
                        branch = Some(std::mem::take(&mut ws.moe.branch));
                    }
                    if beside.is_some() {
                        router.input = Some(&router_input[..t_rows * d]);
                    }
                    let out: &mut [f32] = match &mut branch {
                        Some(buf) => fit(buf, t_rows * d),
                        None => &mut *o,
                    };
                    crate::moe::routed_ffn(
                        pool,
                        precision,
                        file,
                        moe,
                        cfg.activation,
                        router,
                        experts,
                        h,
                        t_rows,
                        out,
                        &mut ws.moe,
                        &mut ws.quant_scratch,
                        &mut laps,
                    )?;
                    if let (Some(b), Some(mut buf)) = (beside, branch) {
                        let (eps, norm) = (cfg.rms_eps, &b.routed_post_norm);
                        let routed = &mut buf[..t_rows * d];
                        for_rows(pool, t_rows, [&mut *o, routed], [d, d], |_, [or, br]| {
                            ops::rms_norm_inplace(br, norm, eps);
                            or.iter_mut().zip(br.iter()).for_each(|(a, &b)| *a += b);
                        });
                        ws.moe.branch = buf;
                    }
                    ws.moe.router_input = router_input;
                    if let Some(shared) = shared {
                        crate::moe::shared_expert(
                            &pass,
                            shared,
                            h,
                            o,
                            &mut ws.moe,
                            &mut ws.quant_scratch,
                        )?;
                        laps.lap(Stage::Down);
                    }
                }
            }
            let down_bias = match &lw.ffn {
                FeedForward::Plain(ffn) => ffn.down_bias.as_deref(),
                _ => None,
            };
            residual_add(pool, x, o, down_bias, lw.post_ffn_norm.as_deref(), cfg);
            if let Some(norms) = &lw.residual_norms {
                crate::encoder::layer_norm_rows(pool, x, &norms[1], cfg);
            }
            if let Some(p) = &lw.per_layer_input {
                let [inputs, _, gate, own] = &mut ws.per_layer;
                let bufs = crate::per_layer_input::LayerInputBuffers {
                    inputs,
                    gate,
                    own,
                    o,
                    scratch: &mut ws.quant_scratch,
                };
                p.apply(&pass, il, x, bufs)?;
            }
            if let Some(scale) = lw.output_scale {
                x.iter_mut().for_each(|v| *v *= scale);
            }
            laps.lap(Stage::Residual);
            if let Some(c) = capture.as_mut() {
                c.record(x, d, batch.rows.iter().map(|r| r.logits));
            }
        }
        self.capture = capture;

        for &(seq, len) in new_lens {
            kv.set_len(seq, len)?;
        }
        if kv.recurrent().is_some() {
            for s in &ws.recurrent.seqs {
                if let Some(i) = s.snapshot_after {
                    kv.set_snapshot_at(s.seq, full_batch.rows[s.rows[i]].pos + 1)?;
                }
                if let Some(i) = s.checkpoint_after {
                    kv.set_checkpoint_at(s.seq, full_batch.rows[s.rows[i]].pos + 1)?;
                }
            }
        }

        if let Some(log) = self.hidden_log.as_mut() {
            let x = &ws.x[..t_rows * d];
            let start = log.data.len();
            log.data.resize(start + t_rows * d, 0.0);
            for (t, row) in batch.rows.iter().enumerate() {
                let out = &mut log.data[start + t * d..start + (t + 1) * d];
                match w.output_norm.is_empty() {
                    // An encoder's last layer ends in its own norm.
                    true => out.copy_from_slice(&x[t * d..(t + 1) * d]),
                    false => {
                        ops::rms_norm(&x[t * d..(t + 1) * d], &w.output_norm, cfg.rms_eps, out)
                    }
                }
                log.rows.push((row.seq, row.pos));
            }
        }

        // Output head, only for the rows that asked.
        let n_logits = batch.n_logits();
        if n_logits == 0 {
            ws.tail_batch = tail;
            return Ok(());
        }
        let rows = fit(&mut ws.logit_rows, n_logits * d);
        let x = &ws.x[..t_rows * d];
        for (i, t) in batch
            .rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.logits)
            .map(|(t, _)| t)
            .enumerate()
        {
            ops::rms_norm(
                &x[t * d..(t + 1) * d],
                &w.output_norm,
                cfg.rms_eps,
                &mut rows[i * d..(i + 1) * d],
            );
        }
        let may_cut = precision == Precision::Fast && batch.head_may_cut();
        let sketch = match may_cut && self.two_pass.take_turn() {
            true => self.two_pass.sketch.as_ref(),
            false => None,
        };
        let two_passes = sketch.is_some();
        let result = match sketch {
            Some(sketch) => {
                ws.head_cuts.clear();
                ws.head_cuts
                    .extend(batch.rows.iter().filter(|r| r.logits).map(|r| r.head));
                let pass = TwoPass {
                    pool,
                    file,
                    head: &w.output,
                    sketch,
                    cfg,
                    adaptive: self.two_pass.mode == crate::TwoPassMode::Auto,
                };
                two_pass_logits(
                    &pass,
                    rows,
                    &ws.head_cuts,
                    logits,
                    &mut ws.quant_scratch,
                    &mut ws.two_pass,
                )
            }
            None => output_head(
                pool,
                precision,
                file,
                w,
                cfg,
                rows,
                n_logits,
                logits,
                &mut ws.quant_scratch,
            )
            .map(|()| HeadStats {
                full_rows: n_logits as u64,
                bytes: w.output.bytes_read(precision) as u64,
                ..HeadStats::default()
            }),
        };
        ws.tail_batch = tail;
        let stats = result?;
        self.two_pass.stats.add(&stats);
        if two_passes {
            self.two_pass.observe(&stats);
        }
        if let Some(p) = laps.times() {
            p.weight_bytes += stats.bytes;
            p.head.add(&stats);
        }
        laps.lap(Stage::Head);
        Ok(())
    }

    /// Checks every row before anything is computed; returns each sequence's length after the
    /// batch.
    fn validate(
        &self,
        batch: &Batch,
        kv: &KvCache,
        next: &mut Vec<(SeqId, usize)>,
    ) -> Result<(), ModelError> {
        let vocab = self.config.vocab_size;
        let wanted_state = &self.recurrent_shape;
        if kv.recurrent() != wanted_state.as_ref() {
            let what = match (kv.recurrent(), wanted_state) {
                (None, Some(_)) => "the model has recurrent layers, the cache keeps no state",
                (Some(_), None) => "the cache keeps recurrent state, the model has no such layers",
                _ => "the recurrent layers' state sizes differ",
            };
            return Err(ModelError::StateShape(what.into()));
        }
        if kv.layout() != &self.kv_layout {
            return Err(ModelError::KvShape {
                cache: Box::new(kv.layout().clone()),
                model: Box::new(self.kv_layout.clone()),
            });
        }
        next.clear();
        let max_positions =
            (self.weights.encoder.as_ref()).map_or(usize::MAX, |e| e.max_positions());
        for (i, row) in batch.rows.iter().enumerate() {
            if row.logits && !self.config.output_head {
                return Err(ModelError::BadBatch {
                    row: i,
                    reason: format!(
                        "{} is an encoder: it has no output head, so no logits (it embeds text; it \
                         does not generate)",
                        self.config.architecture.name()
                    ),
                });
            }
            if row.pos >= max_positions {
                return Err(ModelError::BadBatch {
                    row: i,
                    reason: format!(
                        "position {} is past the {max_positions} positions the model learned",
                        row.pos
                    ),
                });
            }
            if row.token as usize >= vocab {
                return Err(ModelError::TokenOutOfRange {
                    id: row.token,
                    vocab_size: vocab,
                });
            }
            let slot = match next.iter().position(|&(s, _)| s == row.seq) {
                Some(p) => p,
                None => {
                    let cached = kv.seq_len(row.seq)?;
                    if self.config.bidirectional && cached > 0 {
                        return Err(ModelError::BadBatch {
                            row: i,
                            reason: format!(
                                "an encoder sees a whole input at once: sequence {} must start \
                                 at position 0 in one pass, and {cached} positions are cached",
                                row.seq
                            ),
                        });
                    }
                    next.push((row.seq, cached));
                    next.len() - 1
                }
            };
            let expected = next[slot].1;
            if row.pos != expected {
                return Err(ModelError::BadBatch {
                    row: i,
                    reason: format!(
                        "sequence {} continues at position {expected}, row has position {}",
                        row.seq, row.pos
                    ),
                });
            }
            next[slot].1 += 1;
        }
        Ok(())
    }
}

/// `x += norm(o)` (or `x += o` without a post-norm), row by row.
pub(crate) fn residual_add(
    pool: &rill_kernels::ThreadPool,
    x: &mut [f32],
    o: &mut [f32],
    bias: Option<&[f32]>,
    post_norm: Option<&[f32]>,
    cfg: &ModelConfig,
) {
    let d = cfg.d_model;
    for_rows(pool, x.len() / d, [x, o], [d, d], |_, [xr, or]| {
        if let Some(bias) = bias {
            or.iter_mut().zip(bias).for_each(|(o, &b)| *o += b);
        }
        if let Some(norm) = post_norm {
            ops::rms_norm_inplace(or, norm, cfg.rms_eps);
        }
        match cfg.residual_scale {
            None => xr.iter_mut().zip(or.iter()).for_each(|(xv, &ov)| *xv += ov),
            Some(s) => xr
                .iter_mut()
                .zip(or.iter())
                .for_each(|(xv, &ov)| *xv += ov * s),
        }
    });
}

/// `h` row `t` = RMSNorm(`x` row `t`) · `weight`, for every row (a copy of `x` without a weight).
fn norm_rows(
    pool: &rill_kernels::ThreadPool,
    x: &[f32],
    weight: Option<&[f32]>,
    cfg: &ModelConfig,
    h: &mut [f32],
) {
    let Some(weight) = weight else {
        // No pre-norm (OLMo 2): the sublayer reads the residual stream itself.
        h.copy_from_slice(x);
        return;
    };
    let d = cfg.d_model;
    for_rows(pool, x.len() / d, [h], [d], |t, [ht]| {
        ops::rms_norm(&x[t * d..(t + 1) * d], weight, cfg.rms_eps, ht);
    });
}

/// `f(t, rows)` for every row `t < n_rows`, with row `t` of each buffer (`widths[b]` elements
/// of buffer `b`): over the pool when there are enough rows to pay for a dispatch (a prompt), on
/// this thread otherwise (decoding). Each row is computed alone, so the split changes no bit.
pub(crate) fn for_rows<const N: usize>(
    pool: &rill_kernels::ThreadPool,
    n_rows: usize,
    bufs: [&mut [f32]; N],
    widths: [usize; N],
    f: impl Fn(usize, [&mut [f32]; N]) + Sync,
) {
    const MIN_ROWS: usize = 16;
    // One range of every row: the pool runs a single task on this thread.
    let min_rows = if n_rows < MIN_ROWS || pool.n_threads() == 1 {
        n_rows.max(1)
    } else {
        MIN_ROWS / 2
    };
    pool.for_rows_mut(n_rows, min_rows, bufs, widths, f);
}

/// `gate = act(gate) * up` over the pool: tanh/exp per element is the costliest elementwise step
/// of a prompt (Gemma's GELU), too slow for one thread. Elementwise, so the split changes no bit.
fn gate_in_parallel(
    pool: &rill_kernels::ThreadPool,
    gate: &mut [f32],
    up: &[f32],
    act: rill_kernels::ops::GateActivation,
    precision: Precision,
) {
    // The reference path keeps libm's arithmetic; the fast path a vectorised polynomial.
    let gated = match precision {
        Precision::Exact => ops::gated_activation,
        Precision::Fast => ops::gated_activation_fast,
    };
    const MIN_CHUNK: usize = 4096;
    let n = gate.len();
    if n < 2 * MIN_CHUNK || pool.n_threads() == 1 {
        gated(gate, up, act);
        return;
    }
    pool.parallel_for_mut(gate, MIN_CHUNK, |range, g| gated(g, &up[range], act));
}

/// The output head over `rows` (`n` rows already through the final norm): the product with the
/// output matrix, then the logit scale and the final soft cap where the architecture has them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn output_head(
    pool: &rill_kernels::ThreadPool,
    precision: Precision,
    file: &rill_gguf::GgufFile,
    w: &crate::Weights,
    cfg: &crate::ModelConfig,
    rows: &[f32],
    n: usize,
    logits: &mut Vec<f32>,
    scratch: &mut Vec<u8>,
) -> Result<(), ModelError> {
    head_logits(
        pool, precision, file, &w.output, cfg, rows, n, logits, scratch,
    )
}

/// [`output_head`] with the head `head` (Qwen3.5's MTP block may have its own).
#[allow(clippy::too_many_arguments)]
pub(crate) fn head_logits(
    pool: &rill_kernels::ThreadPool,
    precision: Precision,
    file: &rill_gguf::GgufFile,
    head: &crate::Weight,
    cfg: &crate::ModelConfig,
    rows: &[f32],
    n: usize,
    logits: &mut Vec<f32>,
    scratch: &mut Vec<u8>,
) -> Result<(), ModelError> {
    logits.resize(n * cfg.vocab_size, 0.0);
    linear(pool, precision, file, head, rows, n, logits, scratch)?;
    if let Some(s) = cfg.logit_scale {
        logits.iter_mut().for_each(|l| *l /= s);
    }
    if let Some(cap) = cfg.final_logit_softcap {
        logits.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
    }
    Ok(())
}

/// The softmax of attention scores: the reference path keeps libm's exp and an f64 sum, the
/// fast path a vectorised one.
pub(crate) fn attention_softmax(precision: Precision) -> fn(&mut [f32]) {
    match precision {
        Precision::Exact => ops::softmax_inplace,
        Precision::Fast => ops::softmax_inplace_fast,
    }
}
