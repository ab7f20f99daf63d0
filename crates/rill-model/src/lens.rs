//! The layers tier of the glass box: the residual stream recorded during a forward pass, and the
//! model's final norm and output head applied to it (the unadjusted logit lens).

use rill_kernels::ops;

use crate::forward::{attention_softmax, fit, output_head};
use crate::{Batch, Model, ModelError, Precision};

/// What a forward pass records, when asked ([`Model::set_capture`]), for the rows of its batch
/// that ask for logits: the residual stream after the embeddings (layer 0) and after every block
/// (layer `l`). Nothing is recorded, allocated or branched on beyond one flag per layer when
/// capturing is off.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Capture {
    /// `residuals[l]`: `rows × d_model` values, the rows in batch order.
    pub residuals: Vec<Vec<f32>>,
    /// `attention[l][row][head]`: the attention weights of the row's query over positions
    /// `0..=pos` (0 outside a sliding window), as the forward pass computed them (a sink's
    /// share, gpt-oss, is the part missing from 1).
    pub attention: Vec<Vec<Vec<Vec<f32>>>>,
    /// `mids[l - 1]`: the residual stream inside block `l`, after its attention was added and
    /// before its feed-forward (so block `l`'s attention wrote `mids[l - 1] - residuals[l - 1]`
    /// and its feed-forward `residuals[l] - mids[l - 1]`).
    pub mids: Vec<Vec<f32>>,
    /// `head_outputs[l - 1]`: block `l`'s attention output before its output projection,
    /// `rows × q_dim` (each query head's weighted sum of values, back to back).
    pub head_outputs: Vec<Vec<f32>>,
    /// Rows recorded (the batch's rows with logits).
    pub rows: usize,
}

impl Capture {
    /// Row `row`'s residual stream after layer `layer` (0: the embeddings).
    pub fn residual(&self, layer: usize, row: usize) -> Option<&[f32]> {
        let all = self.residuals.get(layer)?;
        let d = all.len().checked_div(self.rows)?;
        all.get(row * d..(row + 1) * d)
    }

    /// Starts a pass of `rows` rows with logits.
    pub(crate) fn begin(&mut self, rows: usize) {
        self.residuals.clear();
        self.mids.clear();
        self.attention.clear();
        self.head_outputs.clear();
        self.rows = rows;
    }

    /// Records layer `layer`'s attention weights for the rows with logits: each head's query
    /// (`q`, after its norm and rotation) against the cached keys, with the pass's scores and
    /// softmax over the whole row. On the exact path these are the pass's weights, bit for bit;
    /// the fast path's tiled kernel never holds a whole row of weights (it normalises block by
    /// block, online), so there they equal the weights it applied up to rounding.
    pub(crate) fn record_attention(
        &mut self,
        batch: &Batch,
        la: &crate::attention::LayerAttention,
        q: &[f32],
        precision: Precision,
    ) -> Result<(), ModelError> {
        let crate::attention::LayerAttention {
            kv,
            layer,
            shape,
            window,
            cfg,
            sinks,
            ..
        } = *la;
        let softmax = attention_softmax(precision);
        let hd = shape.head_dim;
        let q_dim = cfg.n_heads * hd;
        let group = cfg.n_heads / shape.n_kv_heads;
        let mut rows = Vec::with_capacity(self.rows);
        let mut out = vec![0.0f32; hd];
        for (t, row) in batch.rows.iter().enumerate().filter(|(_, r)| r.logits) {
            let last = la.keys_end(row);
            let first = window.map_or(0, |w| last.saturating_sub(w));
            let mut scores = vec![0.0f32; last];
            let mut heads = Vec::with_capacity(cfg.n_heads);
            for head in 0..cfg.n_heads {
                let view = kv.view(layer, row.seq, head / group, last)?;
                let at = t * q_dim + head * hd;
                let shape = ops::ScoreShape {
                    scale: cfg.attention_scale,
                    softcap: cfg.attn_logit_softcap,
                    sinks: sinks.map(|s| &s[head..head + 1]),
                };
                ops::attend(
                    &q[at..at + hd],
                    &view,
                    (first, last),
                    shape,
                    softmax,
                    &mut scores,
                    &mut out,
                );
                let mut weights = vec![0.0f32; last];
                weights[first..].copy_from_slice(&scores[..last - first]);
                heads.push(weights);
            }
            rows.push(heads);
        }
        self.attention.push(rows);
        Ok(())
    }

    /// Records a recurrent layer's place: it has no attention weights or head outputs.
    pub(crate) fn record_recurrent_layer(&mut self) {
        self.attention.push(vec![Vec::new(); self.rows]);
        self.head_outputs.push(Vec::new());
    }

    /// Records `x` (`t_rows × d`) after the next layer, the rows flagged in `with_logits`.
    pub(crate) fn record(&mut self, x: &[f32], d: usize, with_logits: impl Iterator<Item = bool>) {
        let rows = Self::rows_of(self.rows, x, d, with_logits);
        self.residuals.push(rows);
    }

    /// Records the next block's attention output (`t_rows × q_dim`) before its output
    /// projection.
    pub(crate) fn record_head_outputs(
        &mut self,
        attn: &[f32],
        q_dim: usize,
        with_logits: impl Iterator<Item = bool>,
    ) {
        let rows = Self::rows_of(self.rows, attn, q_dim, with_logits);
        self.head_outputs.push(rows);
    }

    /// Records `x` inside the next block, between its attention and its feed-forward.
    pub(crate) fn record_mid(
        &mut self,
        x: &[f32],
        d: usize,
        with_logits: impl Iterator<Item = bool>,
    ) {
        let rows = Self::rows_of(self.rows, x, d, with_logits);
        self.mids.push(rows);
    }

    fn rows_of(n: usize, x: &[f32], d: usize, with_logits: impl Iterator<Item = bool>) -> Vec<f32> {
        let mut out = Vec::with_capacity(n * d);
        for (t, keep) in with_logits.enumerate() {
            if keep {
                out.extend_from_slice(&x[t * d..(t + 1) * d]);
            }
        }
        out
    }
}

impl Model {
    /// Records the residual stream of the rows with logits in every following forward pass
    /// (each pass replaces the last record), or stops recording.
    pub fn set_capture(&mut self, on: bool) {
        self.capture = on.then(Capture::default);
    }

    /// The last forward pass's record (None when capturing is off).
    pub fn capture(&self) -> Option<&Capture> {
        self.capture.as_ref()
    }

    /// Token `token`'s row of the output head, dequantized, times the final norm's weight: the
    /// direction whose dot product with a normalised residual stream is that token's logit
    /// (before the logit scale and soft cap).
    pub fn head_direction(&self, token: u32) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.config;
        let w = &self.weights.output;
        let row_bytes = w.row_bytes();
        let t = token as usize;
        if t >= cfg.vocab_size {
            return Err(ModelError::BadBatch {
                row: 0,
                reason: format!(
                    "token {token} is outside the vocabulary of {}",
                    cfg.vocab_size
                ),
            });
        }
        let data = w.data(&self.file);
        let mut row = vec![0.0f32; cfg.d_model];
        rill_kernels::dequantize_row(w.ty, &data[t * row_bytes..(t + 1) * row_bytes], &mut row)?;
        for (r, g) in row.iter_mut().zip(&self.weights.output_norm) {
            *r *= g;
        }
        Ok(row)
    }

    /// The logits the model would give if each row of `residuals` (`n × d_model`) were its
    /// final residual stream: its final norm, output head, logit scale and soft cap, as the
    /// forward pass applies them (the unadjusted logit lens). `logits` gets `n × vocab_size`.
    pub fn lens_logits(
        &mut self,
        residuals: &[f32],
        precision: Precision,
        logits: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let d = cfg.d_model;
        if !residuals.len().is_multiple_of(d) {
            return Err(ModelError::BadBatch {
                row: 0,
                reason: format!(
                    "{} residual values are not whole rows of {d}",
                    residuals.len()
                ),
            });
        }
        let n = residuals.len() / d;
        logits.clear();
        if n == 0 {
            return Ok(());
        }
        let ws = &mut self.workspace;
        let rows = fit(&mut ws.logit_rows, n * d);
        for i in 0..n {
            ops::rms_norm(
                &residuals[i * d..(i + 1) * d],
                &self.weights.output_norm,
                cfg.rms_eps,
                &mut rows[i * d..(i + 1) * d],
            );
        }
        output_head(
            &self.pool,
            precision,
            &self.file,
            &self.weights,
            cfg,
            rows,
            n,
            logits,
            &mut ws.quant_scratch,
        )
    }
}
