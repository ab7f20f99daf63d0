//! The logit lens (the glass box's layers tier): at a position, what the model would predict if
//! its computation stopped after each layer, read by applying its final norm and output head to
//! the residual stream there. Unadjusted (no per-layer translators, unlike the tuned lens):
//! early layers are not trained to be read this way, and their distributions say so.

use rill_model::{Batch, KvCache};

use crate::logprobs::{log_softmax_stats, top_logprobs};
use crate::{Engine, EngineError};

/// One layer of the lens.
#[derive(Debug, Clone, PartialEq)]
pub struct LensLayer {
    /// 0: the embeddings; `l`: after block `l`.
    pub layer: usize,
    /// The most likely tokens with their natural-log probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
    /// The final prediction's token ([`Lens::chosen`]): its rank here (0: most likely) and its
    /// log-probability.
    pub chosen_rank: usize,
    pub chosen_logprob: f32,
    /// Entropy of this layer's distribution, nats.
    pub entropy: f32,
    /// KL(final ‖ this layer), nats: how far this layer's prediction is from the model's.
    pub kl_to_final: f32,
    /// L2 norm of the residual stream after this layer.
    pub residual_norm: f32,
}

/// The lens at one position, with the attention there.
#[derive(Debug, Clone, PartialEq)]
pub struct Lens {
    /// The final distribution's most likely token.
    pub chosen: u32,
    /// One entry per layer, the embeddings first and the model's own output last.
    pub layers: Vec<LensLayer>,
    /// The first layer from which `chosen` is the most likely token at every later layer
    /// ("where the model made up its mind").
    pub settled_at: usize,
    /// Per block, per head: the position's attention weights over every position up to and
    /// including itself (0 outside a sliding window), as the forward pass computed them.
    pub attention: Vec<Vec<Vec<f32>>>,
}

impl Engine {
    /// The logit lens at the last position of `tokens`, with the `top_n` most likely tokens per
    /// layer, computed in a cache of its own with the engine's precision (the same numerics as
    /// its generations).
    pub fn logit_lens(&mut self, tokens: &[u32], top_n: usize) -> Result<Lens, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let cfg = self.model.config();
        let (d, vocab) = (cfg.d_model, cfg.vocab_size);
        let mut kv: KvCache = self.model.new_kv_cache(tokens.len(), self.precision)?;
        kv.add_sequence(0)?;
        let mut logits = Vec::new();
        self.model.set_capture(true);
        let run = self.model.forward(
            &Batch::prompt(0, tokens, 0, false),
            &mut kv,
            self.precision,
            &mut logits,
        );
        let capture = self.model.capture().cloned();
        self.model.set_capture(false);
        run?;
        let capture = capture.unwrap_or_default();
        let residuals: Vec<f32> = capture.residuals.concat();
        let n_layers = capture.residuals.len();
        let mut lens_logits = Vec::new();
        self.model
            .lens_logits(&residuals, self.precision, &mut lens_logits)?;
        let rows: Vec<&[f32]> = lens_logits.chunks_exact(vocab).collect();
        let final_row = rows[n_layers - 1];
        let final_norm = log_softmax_stats(final_row).log_normalizer;
        let chosen = top_logprobs(final_row, 1).first().map_or(0, |&(t, _)| t);
        let mut layers = Vec::with_capacity(n_layers);
        for (layer, row) in rows.iter().enumerate() {
            let stats = log_softmax_stats(row);
            let norm = stats.log_normalizer;
            let chosen_logit = row[chosen as usize];
            let chosen_rank = row
                .iter()
                .enumerate()
                .filter(|&(t, &l)| l > chosen_logit || (l == chosen_logit && (t as u32) < chosen))
                .count();
            let kl: f64 = final_row
                .iter()
                .zip(row.iter())
                .map(|(&f, &l)| {
                    let lf = f64::from(f - final_norm);
                    let p = lf.exp();
                    if p > 0.0 {
                        p * (lf - f64::from(l - norm))
                    } else {
                        0.0
                    }
                })
                .sum();
            let residual = &residuals[layer * d..(layer + 1) * d];
            let residual_norm = residual
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                .sqrt() as f32;
            layers.push(LensLayer {
                layer,
                top: top_logprobs(row, top_n),
                chosen_rank,
                chosen_logprob: chosen_logit - norm,
                entropy: stats.entropy,
                kl_to_final: kl.max(0.0) as f32,
                residual_norm,
            });
        }
        let settled_at = layers
            .iter()
            .rposition(|l| l.chosen_rank != 0)
            .map_or(0, |i| i + 1);
        let attention = capture
            .attention
            .into_iter()
            .map(|mut rows| rows.pop().unwrap_or_default())
            .collect();
        Ok(Lens {
            chosen,
            layers,
            settled_at,
            attention,
        })
    }
}
