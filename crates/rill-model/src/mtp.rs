//! Qwen3.5's multi-token-prediction (MTP) block, run as a draft. The block was trained with the
//! model to predict the token after next: at pair `(h_{p-1}, x_p)` (the model's last hidden
//! state at the position before token `x_p`, after its final norm, and that token) it reads
//! `eh_proj(cat(rms(embed(x_p), enorm), rms(h_{p-1}, hnorm)))`, runs one gated-attention block
//! over the earlier pairs (a KV cache of its own, one layer) and gives logits for `x_{p+1}`
//! through the model's head after `shared_head_norm`. Its output state (after that norm) stands
//! in for the model's at the next pair when it drafts several tokens in a row.
//! `tools/models/make_mtp.py` holds the reference (transformers' own layer classes).

use rill_gguf::GgufFile;
use rill_kernels::ops;

use crate::attention_layer::AttentionBuffers;
use crate::forward::{fit, for_rows, Batch, Pass};
use crate::kv_cache::{KvCache, SeqId};
use crate::linear::linear;
use crate::model::Model;
use crate::profile::Laps;
use crate::weights::{matrix, vector, AttentionWeights, Expert, FeedForward, LayerWeights, Weight};
use crate::{ModelConfig, ModelError, Precision};

/// The MTP block's weights (`blk.<n_layers>.*`, with its `nextn.*` tensors).
#[derive(Debug, Clone)]
pub struct MtpWeights {
    /// `nextn.eh_proj`: `2 × d_model` (the normed embedding, then the normed hidden state) to
    /// `d_model`.
    pub eh_proj: Weight,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// An attention block of the model's own kind (gated attention, a dense feed-forward).
    pub block: LayerWeights,
    /// `nextn.shared_head_norm`, else the model's final norm.
    pub head_norm: Vec<f32>,
    /// `nextn.shared_head_head` where the file has one, else the model's head.
    pub head: Option<Weight>,
    /// `nextn.embed_tokens` where the file has one, else the model's embedding.
    pub embed: Option<Weight>,
}

impl MtpWeights {
    /// The block after the main ones, where the file has one this forward pass can run: one
    /// block, dense, of a model whose attention layers are all alike and unwindowed (Qwen3.5).
    /// `Ok(None)` where there is none (or it cannot run: the reason in `why_not`).
    pub(crate) fn load(
        file: &GgufFile,
        config: &ModelConfig,
        layers: &[LayerWeights],
        output_norm: &[f32],
    ) -> Result<Option<MtpWeights>, ModelError> {
        if why_not(config).is_some() {
            return Ok(None);
        }
        let il = config.n_layers;
        let d = config.d_model;
        let name = |s: &str| format!("blk.{il}.{s}.weight");
        if file.tensor(&name("nextn.eh_proj")).is_none() {
            return Ok(None);
        }
        let optional = |s: &str, load: &dyn Fn(&str) -> Result<Weight, ModelError>| match file
            .tensor(&name(s))
        {
            Some(_) => load(&name(s)).map(Some),
            None => Ok(None),
        };
        let attention = crate::weights::attention_weights(file, config, il)?;
        let template = layers
            .first()
            .ok_or(ModelError::MissingTensor(name("attn_norm")))?;
        let opt_vec = |s: &str, wanted: bool| -> Result<Option<Vec<f32>>, ModelError> {
            if wanted {
                vector(file, &name(s), d).map(Some)
            } else {
                Ok(None)
            }
        };
        let f = config.ffn_dim;
        let block = LayerWeights {
            attn_norm: opt_vec("attn_norm", template.attn_norm.is_some())?,
            mixer: attention,
            post_attn_norm: opt_vec("post_attention_norm", template.post_attn_norm.is_some())?,
            ffn_norm: opt_vec(config.ffn_norm_tensor, template.ffn_norm.is_some())?,
            ffn: FeedForward::Dense(Expert {
                gate: matrix(file, &name("ffn_gate"), d, f)?,
                up: matrix(file, &name("ffn_up"), d, f)?,
                down: {
                    let mut down = matrix(file, &name("ffn_down"), f, d)?;
                    down.activations = config.ffn_down_activations;
                    down
                },
                biases: None,
            }),
            post_ffn_norm: opt_vec("post_ffw_norm", template.post_ffn_norm.is_some())?,
            per_layer_input: None,
            output_scale: None,
            residual_norms: None,
        };
        let head_norm = match file.tensor(&name("nextn.shared_head_norm")) {
            Some(_) => vector(file, &name("nextn.shared_head_norm"), d)?,
            None => output_norm.to_vec(),
        };
        let vocab = config.vocab_size;
        Ok(Some(MtpWeights {
            eh_proj: matrix(file, &name("nextn.eh_proj"), 2 * d, d)?,
            enorm: vector(file, &name("nextn.enorm"), d)?,
            hnorm: vector(file, &name("nextn.hnorm"), d)?,
            block,
            head_norm,
            head: optional("nextn.shared_head_head", &|n| matrix(file, n, d, vocab))?,
            embed: optional("nextn.embed_tokens", &|n| matrix(file, n, d, vocab))?,
        }))
    }

    fn attention(&self) -> Option<&AttentionWeights> {
        self.block.mixer.attention()
    }
}

/// Why a file's MTP block cannot run here, if it cannot (`None`: it can, where the file has
/// one).
pub fn why_not(config: &ModelConfig) -> Option<String> {
    if config.mtp_layers == 0 {
        return Some("the file has no multi-token-prediction block".into());
    }
    if config.mtp_layers > 1 {
        return Some(format!(
            "{} multi-token-prediction blocks (rill runs files with one)",
            config.mtp_layers
        ));
    }
    if config.moe.is_some() {
        return Some("the MTP block of a mixture of experts is not supported yet".into());
    }
    let uniform = config.layer_attention.windows(2).all(|w| w[0] == w[1]);
    if !uniform || config.layer_is_sliding.iter().any(|&s| s) {
        return Some("the MTP block of a model with sliding or differing attention layers".into());
    }
    None
}

impl Model {
    /// Whether the model carries an MTP block rill can run ([`crate::mtp::why_not`] says why
    /// not).
    pub fn has_mtp(&self) -> bool {
        self.weights.mtp.is_some()
    }

    /// A KV cache for the MTP block: one layer of the model's attention heads.
    pub fn new_mtp_kv_cache(
        &self,
        capacity_tokens: usize,
        precision: Precision,
    ) -> Result<KvCache, crate::KvError> {
        let c = &self.config;
        let shape = c.layer_attention[0];
        KvCache::new(
            1,
            shape.n_kv_heads,
            shape.head_dim,
            capacity_tokens,
            KvCache::DEFAULT_BLOCK_SIZE,
            self.kv_types(precision),
        )
    }

    /// The MTP block over `batch`'s rows (tokens `x_p` at their pairs' positions in `kv`, an
    /// [`Model::new_mtp_kv_cache`]), each with `h_prev`'s row (the hidden state before it):
    /// `logits` for the rows that ask (`n × vocab`, in row order), `h_out` every row's output
    /// state (`rows × d_model`, after the head norm: the next pair's `h` when drafting on).
    pub fn forward_mtp(
        &mut self,
        batch: &Batch,
        h_prev: &[f32],
        kv: &mut KvCache,
        precision: Precision,
        logits: &mut Vec<f32>,
        h_out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let d = self.config.d_model;
        let t_rows = batch.len();
        logits.clear();
        let bad = |row: usize, reason: String| ModelError::BadBatch { row, reason };
        let Some(mtp) = self.weights.mtp.as_ref() else {
            let why = why_not(&self.config).unwrap_or_else(|| "no MTP block loaded".into());
            return Err(bad(0, why));
        };
        if h_prev.len() != t_rows * d {
            return Err(bad(
                0,
                format!("{} hidden values for {t_rows} rows", h_prev.len()),
            ));
        }
        let mut next: Vec<(SeqId, usize)> = Vec::new();
        for (i, row) in batch.rows.iter().enumerate() {
            if row.token as usize >= self.config.vocab_size {
                return Err(ModelError::TokenOutOfRange {
                    id: row.token,
                    vocab_size: self.config.vocab_size,
                });
            }
            let slot = match next.iter().position(|&(s, _)| s == row.seq) {
                Some(p) => p,
                None => {
                    next.push((row.seq, kv.seq_len(row.seq)?));
                    next.len() - 1
                }
            };
            if row.pos != next[slot].1 {
                return Err(bad(
                    i,
                    format!("the MTP cache continues at position {}", next[slot].1),
                ));
            }
            next[slot].1 += 1;
        }
        if t_rows == 0 {
            return Ok(());
        }
        kv.reserve_all(&next)?;

        let (cfg, file, w, pool) = (&self.config, &self.file, &self.weights, &self.pool);
        let ws = &mut self.workspace;
        let mut laps = Laps::start(None);
        let pass = Pass {
            pool,
            precision,
            file,
            cfg,
            batch,
            seq_ends: &[],
        };
        // The pair's input: the normed embedding and hidden state side by side, projected.
        let embed = mtp.embed.as_ref().unwrap_or(&w.token_embd);
        let table = embed.data(file);
        let row_bytes = embed.row_bytes();
        let pair = fit(&mut ws.mtp_pairs, t_rows * 2 * d);
        for (t, row) in batch.rows.iter().enumerate() {
            let tok = row.token as usize;
            let (e, h) = pair[t * 2 * d..(t + 1) * 2 * d].split_at_mut(d);
            rill_kernels::dequantize_row(
                embed.ty,
                &table[tok * row_bytes..(tok + 1) * row_bytes],
                e,
            )?;
            if let Some(s) = cfg.embedding_scale {
                e.iter_mut().for_each(|v| *v *= s);
            }
            ops::rms_norm_inplace(e, &mtp.enorm, cfg.rms_eps);
            ops::rms_norm(&h_prev[t * d..(t + 1) * d], &mtp.hnorm, cfg.rms_eps, h);
        }
        let x = fit(&mut ws.x, t_rows * d);
        linear(
            pool,
            precision,
            file,
            &mtp.eh_proj,
            pair,
            t_rows,
            x,
            &mut ws.quant_scratch,
        )?;
        ws.rope_tables(cfg, w, batch, kv.capacity_tokens());

        // The block: attention, then the feed-forward, each added to the stream.
        let block = &mtp.block;
        let norm = |x: &[f32], weight: Option<&[f32]>, h: &mut [f32]| match weight {
            Some(weight) => for_rows(pool, t_rows, [h], [d], |t, [ht]| {
                ops::rms_norm(&x[t * d..(t + 1) * d], weight, cfg.rms_eps, ht);
            }),
            None => h.copy_from_slice(x),
        };
        let h = fit(&mut ws.h, t_rows * d);
        norm(&ws.x[..t_rows * d], block.attn_norm.as_deref(), h);
        let o = fit(&mut ws.o, t_rows * d);
        let attention = mtp.attention().ok_or(bad(0, "no attention".into()))?;
        // Layer 0's shape and rotation stand for the block's (the model's attention layers
        // are all alike: `why_not`); the cache has the one layer.
        crate::attention_layer::attention_layer(
            &pass,
            attention,
            0,
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
            None,
            &mut laps,
        )?;
        let x = &mut ws.x[..t_rows * d];
        crate::forward::residual_add(pool, x, o, None, block.post_attn_norm.as_deref(), cfg);
        let h = &mut ws.h[..t_rows * d];
        norm(x, block.ffn_norm.as_deref(), h);
        let FeedForward::Dense(ffn) = &block.ffn else {
            return Err(bad(0, "a routed MTP feed-forward".into()));
        };
        let o = &mut ws.o[..t_rows * d];
        let bufs = (&mut ws.gate, &mut ws.up);
        crate::moe::dense_expert(&pass, ffn, h, bufs, o, &mut ws.quant_scratch)?;
        crate::forward::residual_add(pool, x, o, None, block.post_ffn_norm.as_deref(), cfg);
        for &(seq, len) in &next {
            kv.set_len(seq, len)?;
        }

        // Every row's output state, and the logits of those that ask.
        h_out.resize(t_rows * d, 0.0);
        for_rows(pool, t_rows, [&mut h_out[..]], [d], |t, [out]| {
            ops::rms_norm(&x[t * d..(t + 1) * d], &mtp.head_norm, cfg.rms_eps, out);
        });
        let n_logits = batch.n_logits();
        if n_logits == 0 {
            return Ok(());
        }
        let rows = fit(&mut ws.logit_rows, n_logits * d);
        for (i, t) in (batch.rows.iter().enumerate())
            .filter(|(_, r)| r.logits)
            .map(|(t, _)| t)
            .enumerate()
        {
            rows[i * d..(i + 1) * d].copy_from_slice(&h_out[t * d..(t + 1) * d]);
        }
        let head = mtp.head.as_ref().unwrap_or(&w.output);
        crate::forward::head_logits(
            pool,
            precision,
            file,
            head,
            cfg,
            rows,
            n_logits,
            logits,
            &mut ws.quant_scratch,
        )?;
        Ok(())
    }
}
