//! The logit lens (the glass box's layers tier): at a position, what the model would predict if
//! its computation stopped after each layer, read by applying its final norm and output head to
//! the residual stream there. Unadjusted (no per-layer translators, unlike the tuned lens):
//! early layers are not trained to be read this way, and their distributions say so.

use rill_model::{Batch, HeadReadout, KvCache, SeqId};

use crate::engine::start_from_prefix;
use crate::logprobs::{rank_of, top_logprobs, top_logprobs_into};
use crate::{CacheLease, Engine, EngineError};

/// One layer of the lens.
#[derive(Debug, Clone, PartialEq)]
pub struct LensLayer {
    /// 0: the embeddings; `l`: after block `l`.
    pub layer: usize,
    /// The most likely tokens with their natural-log probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
    /// The followed token ([`Lens::chosen`]): its rank here (0: most likely) and its
    /// log-probability.
    pub chosen_rank: usize,
    pub chosen_logprob: f32,
    /// Entropy of this layer's distribution, nats.
    pub entropy: f32,
    /// KL(final ‖ this layer), nats: how far this layer's prediction is from the model's.
    pub kl_to_final: f32,
    /// L2 norm of the residual stream after this layer.
    pub residual_norm: f32,
    /// What block `layer` wrote into the residual stream (None for the embeddings): the L2 norms
    /// of its attention's and its feed-forward's additions, and their direct contributions to the
    /// final choice's logit (through the output head and the final norm's scale at this
    /// position). The embeddings' contribution plus every block's add up to the choice's logit
    /// (before a final soft cap).
    pub writes: Option<LayerWrites>,
    /// Block `layer`'s attention contribution to the choice's logit, query head by query head
    /// (empty for the embeddings); with [`LayerWrites::attention_bias_logit`] they add up to
    /// [`LayerWrites::attention_logit`].
    pub head_logits: Vec<f32>,
}

/// What one block added to the residual stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerWrites {
    pub attention_norm: f32,
    pub ffn_norm: f32,
    pub attention_logit: f32,
    pub ffn_logit: f32,
    /// The attention output projection's bias's part of `attention_logit` (0 without one).
    pub attention_bias_logit: f32,
}

/// Most multiply-adds a lens spends on value norms (positions × heads × head_dim² × layers):
/// about half a second of the engine loop. Past it the lens leaves value weighting out (and
/// says so) rather than hold every other request for longer: SmolLM2 weighs up to ~7,000
/// positions, Gemma 3 (256-element heads) ~1,700.
pub const MAX_VALUE_WEIGHT_WORK: u64 = 8_000_000_000;

/// What a lens computes besides the per-layer predictions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LensOptions {
    /// Most likely tokens listed per layer.
    pub top: usize,
    /// Also weigh each attention weight by the norm of what its position's value writes
    /// ([`Lens::value_weighted`]).
    pub value_weighted: bool,
    /// Most multiply-adds value weighting may take (default [`MAX_VALUE_WEIGHT_WORK`]).
    pub value_work_limit: u64,
    /// Most positions [`Engine::logit_lens_in`] may compute beyond the cached prefix (default:
    /// no limit). Past it the lens errs with [`EngineError::NotCached`] without computing
    /// anything, so that a caller on the serving loop can bring the context into the cache
    /// with ordinary requests first (chunked between steps) instead of holding the loop.
    pub max_computed: usize,
    /// The token the lens follows (its rank, probability and where its logit came from at
    /// every layer): a sampled token that was not the most likely. Default: the final
    /// distribution's most likely token.
    pub follow: Option<u32>,
}

impl LensOptions {
    pub fn top(top: usize) -> LensOptions {
        LensOptions {
            top,
            value_weighted: false,
            value_work_limit: MAX_VALUE_WEIGHT_WORK,
            max_computed: usize::MAX,
            follow: None,
        }
    }

    /// The `top` tokens per layer, with value weighting.
    pub fn value_weighted(top: usize) -> LensOptions {
        LensOptions {
            value_weighted: true,
            ..LensOptions::top(top)
        }
    }
}

/// The lens at one position, with the attention there.
#[derive(Debug, Clone, PartialEq)]
pub struct Lens {
    /// The token followed: [`LensOptions::follow`], else [`Lens::most_likely`].
    pub chosen: u32,
    /// The final distribution's most likely token.
    pub most_likely: u32,
    /// One entry per layer, the embeddings first and the model's own output last.
    pub layers: Vec<LensLayer>,
    /// The first layer from which `chosen` is the most likely token at every later layer
    /// ("where the model made up its mind"); the number of layers when it is not the most
    /// likely at the last one (a sampled token the model did not rank first).
    pub settled_at: usize,
    /// Per block, per head: the position's attention weights over every position up to and
    /// including itself (0 outside a sliding window), as the forward pass computed them.
    pub attention: Vec<Vec<Vec<f32>>>,
    /// The embeddings' direct contribution to the choice's logit.
    pub embedding_logit: f32,
    /// The choice's logit from the final residual stream (before a final soft cap): the sum of
    /// the embeddings' and every block's contributions.
    pub chosen_logit: f32,
    /// When asked ([`LensOptions::value_weighted`]), per block, per head: each attention weight
    /// times the norm of what that position's value writes through the head's part of the
    /// output projection (and the block's scaling after it), in residual-stream units: how much
    /// each position moved the residual stream, not only how much it was looked at.
    pub value_weighted: Option<Vec<Vec<Vec<f32>>>>,
    /// Value weighting was asked for but left out: its work would pass
    /// [`LensOptions::value_work_limit`].
    pub value_weighting_skipped: bool,
    /// Per block, its sliding window (None: the block reads every position).
    pub windows: Vec<Option<usize>>,
    /// Leading positions read from the prefix cache rather than computed for the lens.
    pub cached_tokens: usize,
}

impl Engine {
    /// The logit lens at the last position of `tokens`, computed in a cache of its own with the
    /// engine's precision (the same numerics as its generations).
    pub fn logit_lens(&mut self, tokens: &[u32], top: usize) -> Result<Lens, EngineError> {
        self.logit_lens_with(tokens, LensOptions::top(top))
    }

    /// [`Engine::logit_lens`] with options.
    pub fn logit_lens_with(
        &mut self,
        tokens: &[u32],
        options: LensOptions,
    ) -> Result<Lens, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let mut kv: KvCache = self.model.new_kv_cache(tokens.len(), self.precision)?;
        kv.add_sequence(0)?;
        self.lens_pass(&mut kv, 0, tokens, 0, options)
    }

    /// The logit lens in a shared cache (the serving loop's arena): starts from the longest
    /// prefix of `tokens` already cached there, so that only the positions after it are
    /// computed (one decode step when the context was just generated), publishes what it
    /// computed for the next lens, and gives its blocks back. Where the arena has no room, it
    /// computes in a cache of its own instead. The result's bits are the same either way
    /// (batch invariance: a row's numbers do not depend on how its prompt was split).
    pub fn logit_lens_in(
        &mut self,
        cache: CacheLease<'_>,
        tokens: &[u32],
        options: LensOptions,
    ) -> Result<Lens, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let CacheLease {
            kv,
            seq,
            prefix_caching,
        } = cache;
        let not_cached = |uncached: usize| EngineError::NotCached {
            uncached,
            limit: options.max_computed,
        };
        let Some(hit) = start_from_prefix(kv, seq, tokens, prefix_caching)? else {
            if tokens.len() > options.max_computed {
                return Err(not_cached(tokens.len()));
            }
            return self.logit_lens_with(tokens, options);
        };
        if tokens.len() - hit > options.max_computed {
            let _ = kv.remove_sequence(seq);
            return Err(not_cached(tokens.len() - hit));
        }
        let lens = self.lens_pass(kv, seq, tokens, hit, options);
        if lens.is_ok() && prefix_caching {
            let _ = kv.publish_tail(seq, tokens);
        }
        let _ = kv.remove_sequence(seq);
        lens
    }

    /// Computes `tokens[start..]` of `seq` (whose first `start` positions are cached) with the
    /// residual stream recorded, and reads the lens at the last position.
    fn lens_pass(
        &mut self,
        kv: &mut KvCache,
        seq: SeqId,
        tokens: &[u32],
        start: usize,
        options: LensOptions,
    ) -> Result<Lens, EngineError> {
        let cfg = self.model.config();
        let (d, vocab, eps, logit_scale) = (
            cfg.d_model,
            cfg.vocab_size,
            cfg.rms_eps,
            cfg.logit_scale.unwrap_or(1.0),
        );
        let windows: Vec<Option<usize>> = cfg
            .layer_is_sliding
            .iter()
            .map(|&sliding| if sliding { cfg.sliding_window } else { None })
            .collect();
        let mut logits = Vec::new();
        self.model.set_capture(true);
        let run = self.model.forward(
            &Batch::prompt(seq, &tokens[start..], start, false),
            kv,
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
        let most_likely = top_logprobs(final_row, 1).first().map_or(0, |&(t, _)| t);
        let chosen = match options.follow {
            Some(t) if (t as usize) < vocab => t,
            Some(t) => {
                return Err(EngineError::TokenOutOfVocab {
                    what: "the lens's followed token",
                    token: t,
                    vocab_size: vocab,
                })
            }
            None => most_likely,
        };
        // Direct logit attribution: the choice's logit is (head row ⊙ final norm weight) ·
        // x_final · s / logit_scale with s = 1 / rms(x_final), linear in what each part wrote.
        let direction = self.model.head_direction(chosen)?;
        let x_final = &residuals[(n_layers - 1) * d..n_layers * d];
        let mean_sq = x_final
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            / d as f64;
        let s = 1.0 / (mean_sq + f64::from(eps)).sqrt() / f64::from(logit_scale);
        let attribute = |v: &mut dyn Iterator<Item = f64>| -> f64 {
            v.zip(&direction)
                .map(|(x, &w)| x * f64::from(w))
                .sum::<f64>()
                * s
        };
        let norm_of =
            |v: &mut dyn Iterator<Item = f64>| -> f64 { v.map(|x| x * x).sum::<f64>().sqrt() };
        let layer_row = |l: usize| &residuals[l * d..(l + 1) * d];
        let embedding_logit = attribute(&mut layer_row(0).iter().map(|&v| f64::from(v))) as f32;
        let chosen_logit = attribute(&mut x_final.iter().map(|&v| f64::from(v))) as f32;

        // Per block, its heads' writes (and, when asked and affordable, every position's value
        // norms).
        let len = tokens.len();
        let work = (len as u64)
            .saturating_mul(cfg_heads_work(&self.model))
            .saturating_mul(capture.head_outputs.len() as u64);
        let value_weighting = options.value_weighted && work <= options.value_work_limit;
        let (model, kv_read) = (&self.model, &*kv);
        let readouts = model
            .pool()
            .map(capture.head_outputs.len(), |block| {
                // A recurrent layer has no heads to read out.
                if capture.head_outputs[block].is_empty() {
                    return Ok(None);
                }
                model
                    .head_readout(
                        kv_read,
                        seq,
                        block,
                        len,
                        &capture.head_outputs[block],
                        value_weighting,
                    )
                    .map(Some)
            })
            .into_iter()
            .collect::<Result<Vec<Option<HeadReadout>>, _>>()?;

        // Every layer's distribution read at once, the rows spread over the model's threads.
        let (final_reading, final_exps) = read_row(final_row, chosen, options.top, None);
        let final_probs: Vec<f32> = final_exps.map_or_else(Vec::new, |(e, s)| {
            e.iter().map(|&e| (f64::from(e) / s) as f32).collect()
        });
        let final_entropy = final_reading.entropy;
        let mut readings = self.model.pool().map(n_layers - 1, |layer| {
            let final_dist = Some((final_probs.as_slice(), final_entropy));
            read_row(rows[layer], chosen, options.top, final_dist).0
        });
        readings.push(final_reading);
        let mut layers = Vec::with_capacity(n_layers);
        for (layer, reading) in readings.into_iter().enumerate() {
            let residual = &residuals[layer * d..(layer + 1) * d];
            let residual_norm = residual
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                .sqrt() as f32;
            let readout = layer
                .checked_sub(1)
                .and_then(|b| readouts.get(b))
                .and_then(Option::as_ref);
            let head_logits: Vec<f32> = readout.map_or_else(Vec::new, |r| {
                r.head_writes
                    .iter()
                    .map(|w| attribute(&mut w.iter().map(|&v| f64::from(v))) as f32)
                    .collect()
            });
            let writes = (layer > 0).then(|| {
                let before = layer_row(layer - 1);
                let mid = &capture.mids[layer - 1];
                let after = layer_row(layer);
                let attn = || {
                    mid.iter()
                        .zip(before)
                        .map(|(&m, &b)| f64::from(m) - f64::from(b))
                };
                let ffn = || {
                    after
                        .iter()
                        .zip(mid)
                        .map(|(&a, &m)| f64::from(a) - f64::from(m))
                };
                LayerWrites {
                    attention_norm: norm_of(&mut attn()) as f32,
                    ffn_norm: norm_of(&mut ffn()) as f32,
                    attention_logit: attribute(&mut attn()) as f32,
                    ffn_logit: attribute(&mut ffn()) as f32,
                    attention_bias_logit: readout.map_or(0.0, |r| {
                        attribute(&mut r.bias_write.iter().map(|&v| f64::from(v))) as f32
                    }),
                }
            });
            layers.push(LensLayer {
                layer,
                top: reading.top,
                chosen_rank: reading.chosen_rank,
                chosen_logprob: rows[layer][chosen as usize] - reading.log_normalizer,
                entropy: reading.entropy,
                kl_to_final: reading.kl_to_final,
                residual_norm,
                writes,
                head_logits,
            });
        }
        let settled_at = layers
            .iter()
            .rposition(|l| l.chosen_rank != 0)
            .map_or(0, |i| i + 1);
        let attention: Vec<Vec<Vec<f32>>> = capture
            .attention
            .into_iter()
            .map(|mut rows| rows.pop().unwrap_or_default())
            .collect();
        let value_weighted = value_weighting.then(|| {
            attention
                .iter()
                .zip(&readouts)
                .map(|(heads, readout)| {
                    let norms = readout
                        .as_ref()
                        .and_then(|r| r.value_norms.as_deref())
                        .unwrap_or_default();
                    heads
                        .iter()
                        .zip(norms)
                        .map(|(w, n)| w.iter().zip(n).map(|(&w, &n)| w * n).collect())
                        .collect()
                })
                .collect()
        });
        Ok(Lens {
            chosen,
            most_likely,
            layers,
            settled_at,
            attention,
            embedding_logit,
            chosen_logit,
            value_weighted,
            value_weighting_skipped: options.value_weighted && !value_weighting,
            windows,
            cached_tokens: start,
        })
    }
}

/// Multiply-adds of one position's value norms over every head of one block.
fn cfg_heads_work(model: &rill_model::Model) -> u64 {
    let c = model.config();
    (c.n_heads as u64) * (c.head_dim as u64) * (c.head_dim as u64)
}

/// One layer's lens distribution, summarised.
struct RowReading {
    log_normalizer: f32,
    entropy: f32,
    chosen_rank: usize,
    top: Vec<(u32, f32)>,
    /// KL(final ‖ this layer); 0 for the final row itself.
    kl_to_final: f32,
}

/// The largest logit that is not NaN (eight running maxima, so the loop vectorises).
fn finite_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            // NaN compares false and is passed over.
            *m = if v > *m { v } else { *m };
        }
    }
    lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m })
}

/// Reads one row of lens logits: its log-normaliser and entropy (the exponentials eight lanes
/// at a time, summed in f64), the chosen token's rank, the top tokens, and with the final
/// distribution's probabilities and entropy, KL(final ‖ row).
/// Also gives back the row's exponentials `exp(l - max)` and their sum (None for a row with
/// no finite logit).
fn read_row(
    row: &[f32],
    chosen: u32,
    top: usize,
    final_dist: Option<(&[f32], f32)>,
) -> (RowReading, Option<(Vec<f32>, f64)>) {
    let max = finite_max(row);
    let mut reading = RowReading {
        log_normalizer: max,
        entropy: 0.0,
        chosen_rank: rank_of(row, chosen),
        top: Vec::with_capacity(top + 1),
        kl_to_final: 0.0,
    };
    let mut exps = None;
    if max.is_finite() {
        let mut e = row.to_vec();
        rill_kernels::ops::exp_shifted_sum(&mut e, max);
        // s = Σ e, t = Σ e·d (d = l - max) and Σ p·l over the final probabilities p, in four
        // f64 lanes each (independent sums, so the loop is not one long chain of additions).
        let none = [];
        let probs = final_dist.map_or(&none[..], |(p, _)| p);
        let (mut s, mut t, mut pl) = ([0.0f64; 4], [0.0f64; 4], [0.0f64; 4]);
        let mut add = |lane: usize, e: &mut f32, l: f32, p: f32| {
            let d = l - max;
            // -inf and NaN weigh nothing (the polynomial's floor is not 0).
            let finite = d > f32::NEG_INFINITY;
            *e = if finite { *e } else { 0.0 };
            let d = if finite { d } else { 0.0 };
            s[lane] += f64::from(*e);
            t[lane] += f64::from(*e) * f64::from(d);
            pl[lane] += if p > 0.0 {
                f64::from(p) * f64::from(l)
            } else {
                0.0
            };
        };
        let n = e.len() / 4 * 4;
        let zeros = [0.0f32; 4];
        for (i, (ec, lc)) in e[..n]
            .chunks_exact_mut(4)
            .zip(row[..n].chunks_exact(4))
            .enumerate()
        {
            let pc = probs.get(i * 4..i * 4 + 4).unwrap_or(&zeros);
            for lane in 0..4 {
                add(lane, &mut ec[lane], lc[lane], pc[lane]);
            }
        }
        for i in n..e.len() {
            add(
                i % 4,
                &mut e[i],
                row[i],
                probs.get(i).copied().unwrap_or(0.0),
            );
        }
        let sum4 = |v: [f64; 4]| (v[0] + v[1]) + (v[2] + v[3]);
        let (s, t, pl) = (sum4(s), sum4(t), sum4(pl));
        // H = -Σ p ln p with p = e / s and ln p = d - ln s: H = ln s - t / s.
        let ln_s = s.ln();
        reading.log_normalizer = max + ln_s as f32;
        reading.entropy = (ln_s - t / s).max(0.0) as f32;
        if let Some((_, final_entropy)) = final_dist {
            // KL(final ‖ row) = Σ p (ln p - ln q) = ln Z_row - Σ p l - H_final.
            let kl = f64::from(reading.log_normalizer) - pl - f64::from(final_entropy);
            reading.kl_to_final = kl.max(0.0) as f32;
        }
        exps = Some((e, s));
    }
    top_logprobs_into(row, top, reading.log_normalizer, &mut reading.top);
    (reading, exps)
}
