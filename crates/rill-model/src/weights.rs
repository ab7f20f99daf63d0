//! Weights: matrices stay quantized, as views into the mmapped file, or repacked once at load
//! into the layout the fast kernels read best (see [`rill_kernels::WeightLayout`]); small
//! vectors (norms) are dequantized once to f32.

use std::sync::Arc;

use rill_gguf::{GgufFile, TensorInfo};
use rill_kernels::{Activations, QuantType, WeightLayout};

use crate::config::LayerKind;
pub use crate::feed_forward::{DenseBeside, Expert, FeedForward, PlainFfn, SharedExpert};
use crate::large_buffer::LargeBuffer;
use crate::recurrent::{DeltaNetWeights, Mamba2Weights, ShortConvWeights};
use crate::{ModelConfig, ModelError, QkNorm, RopeScaling};

/// A weight matrix of `rows` rows of `cols` elements, stored in the file's quantized layout.
#[derive(Debug, Clone)]
pub struct Weight {
    pub name: String,
    pub ty: QuantType,
    pub rows: usize,
    pub cols: usize,
    /// How this product's activations meet the weights on the fast path (see
    /// `rill_kernels::Activations`).
    pub activations: Activations,
    /// Byte range of the data inside the file.
    offset: usize,
    len: usize,
    /// The same rows repacked for the fast path, where another layout is faster on this CPU.
    packed: Option<Box<PackedRows>>,
}

/// A weight's rows in another layout: a range of the buffer all of a model's repacked weights
/// share (one mapping, so that they sit on huge pages end to end; see `large_buffer`).
#[derive(Debug, Clone)]
struct PackedRows {
    buffer: Arc<LargeBuffer<u8>>,
    range: std::ops::Range<usize>,
    layout: WeightLayout,
}

impl Weight {
    /// The raw blocks in the file's layout, borrowed from the file.
    pub fn data<'f>(&self, file: &'f GgufFile) -> &'f [u8] {
        // Empty (and so rejected by the kernels' size checks) if `file` is not this weight's.
        file.data_section()
            .get(self.offset..self.offset + self.len)
            .unwrap_or(&[])
    }

    /// The rows the fast path reads, and their layout: the repacked copy if there is one, else
    /// the file's blocks.
    pub fn fast_data<'a>(&'a self, file: &'a GgufFile) -> (&'a [u8], WeightLayout) {
        match &self.packed {
            Some(p) => (&p.buffer[p.range.clone()], p.layout),
            None => (self.data(file), WeightLayout::Blocks),
        }
    }

    /// Bytes held in memory by a repacked copy (0 when the rows are read from the file).
    pub fn packed_bytes(&self) -> usize {
        self.packed.as_ref().map_or(0, |p| p.range.len())
    }

    /// The layout of the rows the fast path reads.
    pub fn layout(&self) -> WeightLayout {
        self.packed
            .as_ref()
            .map_or(WeightLayout::Blocks, |p| p.layout)
    }

    /// The layout the fast kernels run this product best in on this CPU
    /// ([`WeightLayout::fastest_for_product`], which may also trade float activations for
    /// 16-bit ones), with those activations and the bytes a repacked copy takes; `None` where
    /// that layout is the file's (or the rows are repacked already).
    fn repack_plan(&self) -> Result<Option<(WeightLayout, Activations, usize)>, ModelError> {
        let (layout, activations) =
            WeightLayout::fastest_for_product(self.ty, self.rows, self.activations);
        if self.packed.is_some() || layout == WeightLayout::Blocks {
            return Ok(None);
        }
        let bytes = layout.row_bytes(self.ty, self.cols)?.checked_mul(self.rows);
        let bytes = bytes.ok_or(ModelError::OutOfMemory { bytes: usize::MAX })?;
        Ok(Some((layout, activations, bytes)))
    }

    /// Repacks the rows into `dst` (the size [`Self::repack_plan`] gave) in `layout`, then
    /// lets the OS drop the file's pages of it from memory: they are only read again by the
    /// exact path.
    fn repack_into(
        &self,
        file: &GgufFile,
        layout: WeightLayout,
        dst: &mut [u8],
    ) -> Result<(), ModelError> {
        let repack: rill_kernels::layout::Repack = match layout {
            WeightLayout::RowInterleaved => rill_kernels::repack_rows_interleaved,
            WeightLayout::RowInterleavedNibbles => rill_kernels::repack_rows_interleaved_nibbles,
            _ => rill_kernels::repack_scales_first,
        };
        let packed_row = dst.len() / self.rows.max(1);
        // A few MB of rows (whole groups of 16) at a time, each part's file pages released as
        // soon as it is copied, so that loading never holds both copies of a large matrix
        // (Gemma's head: 178 MB).
        let rows_per_part = ((4 << 20) / self.row_bytes().max(1) + 1).next_multiple_of(16);
        let part_bytes = rows_per_part * self.row_bytes();
        let data = self.data(file);
        for (k, (src, dst)) in data
            .chunks(part_bytes)
            .zip(dst.chunks_mut(rows_per_part * packed_row))
            .enumerate()
        {
            repack(self.ty, self.cols, src, dst)?;
            file.release_resident(self.offset + k * part_bytes, src.len());
        }
        Ok(())
    }

    /// Bytes one row takes.
    pub fn row_bytes(&self) -> usize {
        self.len / self.rows
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// Bytes a product on `precision`'s path reads: the repacked copy on the fast path where
    /// there is one (interleaved groups hold decoded scales: a few percent more), else the
    /// file's rows.
    pub fn bytes_read(&self, precision: crate::Precision) -> usize {
        match (&self.packed, precision) {
            (Some(packed), crate::Precision::Fast) => packed.range.len(),
            _ => self.len,
        }
    }
}

/// Per-layer weights.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// Pre-norms (absent where the architecture normalises outputs instead: OLMo 2).
    pub attn_norm: Option<Vec<f32>>,
    /// What mixes positions: attention, or a recurrent layer.
    pub mixer: Mixer,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Option<Vec<f32>>,
    pub ffn: FeedForward,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// Gemma 4: this layer's gate and projection of the per-layer inputs.
    pub per_layer_input: Option<crate::per_layer_input::LayerInputWeights>,
    /// Gemma 4: the whole residual stream is multiplied by this after the layer.
    pub output_scale: Option<f32>,
    /// BERT: LayerNorms of the residual stream after attention's add and the feed-forward's.
    pub residual_norms: Option<Box<[crate::encoder::LayerNorm; 2]>>,
}

/// A layer's token mixer.
#[derive(Debug, Clone)]
pub enum Mixer {
    Attention(AttentionWeights),
    /// Gated DeltaNet linear attention (Qwen3.5's linear layers).
    DeltaNet(crate::recurrent::DeltaNetWeights),
    /// A gated short convolution (LFM2's conv layers).
    ShortConv(crate::recurrent::ShortConvWeights),
    /// Mamba-2 (Granite 4.0-H's state-space layers).
    Mamba2(crate::recurrent::Mamba2Weights),
}

/// An attention layer's weights.
#[derive(Debug, Clone)]
pub struct AttentionWeights {
    pub wq: Weight,
    /// The key projection; `None` for a layer that attends over an earlier layer's keys and
    /// values (Gemma 4's KV-shared layers).
    pub wk: Option<Weight>,
    /// The value projection; `None` where the values are the raw keys (Gemma 4 31B's global
    /// layers) or the layer computes neither.
    pub wv: Option<Weight>,
    pub wo: Weight,
    /// A sigmoid gate per query element on the attention output, computed with the queries
    /// (Qwen3.5: `attn_q` holds each head's queries then its gate).
    pub output_gate: bool,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Projection biases (Qwen2, gpt-oss), added before RoPE.
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    /// Output projection bias (gpt-oss).
    pub o_bias: Option<Vec<f32>>,
    /// One sink logit per query head (gpt-oss).
    pub attn_sinks: Option<Vec<f32>>,
}

impl Mixer {
    /// The attention weights, for an attention layer.
    pub fn attention(&self) -> Option<&AttentionWeights> {
        match self {
            Mixer::Attention(a) => Some(a),
            _ => None,
        }
    }

    /// Every matrix of the mixer.
    pub fn matrices(&self) -> Vec<&Weight> {
        match self {
            Mixer::Attention(a) => [Some(&a.wq), a.wk.as_ref(), a.wv.as_ref(), Some(&a.wo)]
                .into_iter()
                .flatten()
                .collect(),
            Mixer::DeltaNet(d) => d.matrices(),
            Mixer::ShortConv(c) => c.matrices(),
            Mixer::Mamba2(m) => m.matrices(),
        }
    }

    fn matrices_mut(&mut self) -> Vec<&mut Weight> {
        match self {
            Mixer::Attention(a) => [
                Some(&mut a.wq),
                a.wk.as_mut(),
                a.wv.as_mut(),
                Some(&mut a.wo),
            ]
            .into_iter()
            .flatten()
            .collect(),
            Mixer::DeltaNet(d) => d.matrices_mut(),
            Mixer::ShortConv(c) => c.matrices_mut(),
            Mixer::Mamba2(m) => m.matrices_mut(),
        }
    }

    /// Elements of the mixer's vectors (norms, biases, sinks, convolution kernels).
    fn vector_len(&self) -> usize {
        match self {
            Mixer::Attention(a) => [
                &a.q_norm,
                &a.k_norm,
                &a.q_bias,
                &a.k_bias,
                &a.v_bias,
                &a.o_bias,
                &a.attn_sinks,
            ]
            .iter()
            .map(|v| v.as_ref().map_or(0, Vec::len))
            .sum(),
            Mixer::DeltaNet(d) => d.vector_len(),
            Mixer::ShortConv(c) => c.vector_len(),
            Mixer::Mamba2(m) => m.vector_len(),
        }
    }
}

impl LayerWeights {
    /// The layer's matrices (q, k, v, output; the feed-forward's), each with the share of tokens
    /// that read it (see [`FeedForward::matrices`]).
    pub fn matrices(&self) -> Vec<(&Weight, f64)> {
        let mut out: Vec<(&Weight, f64)> = self
            .mixer
            .matrices()
            .into_iter()
            .map(|w| (w, 1.0))
            .collect();
        out.extend(self.ffn.matrices());
        if let Some(p) = &self.per_layer_input {
            out.extend([(&p.gate, 1.0), (&p.proj, 1.0)]);
        }
        out
    }

    /// Elements of the layer's norm weights, biases and other vectors.
    pub fn vector_len(&self) -> usize {
        [
            &self.attn_norm,
            &self.post_attn_norm,
            &self.ffn_norm,
            &self.post_ffn_norm,
        ]
        .iter()
        .map(|v| v.as_ref().map_or(0, Vec::len))
        .sum::<usize>()
            + self.mixer.vector_len()
            + self
                .per_layer_input
                .as_ref()
                .map_or(0, |p| p.post_norm.len())
            + usize::from(self.output_scale.is_some())
            + self
                .residual_norms
                .as_ref()
                .map_or(0, |n| n.iter().map(|n| n.len()).sum())
    }

    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Weight> {
        let mut out = self.mixer.matrices_mut();
        out.extend(self.ffn.matrices_mut());
        if let Some(p) = &mut self.per_layer_input {
            out.extend([&mut p.gate, &mut p.proj]);
        }
        out
    }
}

/// All weights of a model.
#[derive(Debug, Clone)]
pub struct Weights {
    pub token_embd: Weight,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// The output head; `token_embd` itself when the embedding is tied (or, never read, when
    /// the model has no head: an encoder's).
    pub output: Weight,
    pub tied_output: bool,
    /// Whether the model has an output head at all (an encoder has none).
    pub has_output_head: bool,
    /// Per-frequency RoPE divisors of global and of sliding-window layers: Llama 3.1+'s
    /// `rope_freqs.weight` when the file has it, times the scaling's own (YaRN's).
    pub rope_divisors_global: Option<Vec<f32>>,
    pub rope_divisors_local: Option<Vec<f32>>,
    /// LongRoPE's long factors (used for every layer when the cache holds more positions than
    /// the original context).
    pub rope_divisors_long: Option<Vec<f32>>,
    /// Gemma 4's per-layer input embeddings and their projection from the embedding.
    pub per_layer_inputs: Option<crate::per_layer_input::PerLayerInputs>,
    /// Qwen3.5's multi-token-prediction block, where the file has one rill can run.
    pub mtp: Option<crate::mtp::MtpWeights>,
    /// An encoder's positions, token type and embedding norm (BERT).
    pub encoder: Option<crate::encoder::EncoderEmbeddings>,
}

impl Weights {
    pub fn load(file: &GgufFile, config: &ModelConfig) -> Result<Weights, ModelError> {
        let d = config.d_model;
        let token_embd = matrix(file, "token_embd.weight", d, config.vocab_size)?;
        let (output, tied_output) = match file.tensor("output.weight") {
            Some(_) => (matrix(file, "output.weight", d, config.vocab_size)?, false),
            None => (token_embd.clone(), true),
        };
        // The head decides between near-tied candidates, so its activations are refined too where
        // that is cheap: measured on Q8_0 heads, fast-path top-1 agreement 0.963 -> 0.972
        // (SmolLM2) and 0.967 -> 0.975 (Gemma 3), for ~8% of decode speed (a prompt computes
        // logits for its last row only). The refined product has tiled kernels for the 32-element
        // block types only; elsewhere it costs several plain passes (Qwen3-1.7B's Q6_K head: 36.9
        // against 7.2 ms a token), so other heads keep plain 8-bit activations.
        let refined_is_cheap = matches!(
            output.ty,
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0
        );
        let output = Weight {
            activations: if refined_is_cheap {
                Activations::Int8Refined
            } else {
                Activations::Int8
            },
            ..output
        };
        // An encoder has no head and no final norm (its last layer ends in a LayerNorm).
        let output_norm = match config.output_head {
            true => vector(file, &format!("{}.weight", config.output_norm_tensor), d)?,
            false => Vec::new(),
        };
        let mut layers = Vec::with_capacity(config.n_layers);
        for il in 0..config.n_layers {
            let name = |s: &str| format!("blk.{il}.{s}.weight");
            let opt_vec =
                |s: &str, n: usize, wanted: bool| -> Result<Option<Vec<f32>>, ModelError> {
                    if wanted {
                        vector(file, &name(s), n).map(Some)
                    } else {
                        Ok(None)
                    }
                };
            let mixer = match config.layer_kinds[il] {
                LayerKind::DeltaNet => {
                    let dn = config.delta_net.as_ref().ok_or_else(|| {
                        ModelError::MissingMetadata("ssm.state_size (DeltaNet layers)".into())
                    })?;
                    Some(Mixer::DeltaNet(DeltaNetWeights::load(file, il, d, dn)?))
                }
                LayerKind::ShortConv => {
                    let kernel = config
                        .short_conv_kernel
                        .ok_or_else(|| ModelError::MissingMetadata("shortconv.l_cache".into()))?;
                    Some(Mixer::ShortConv(ShortConvWeights::load(
                        file, il, d, kernel,
                    )?))
                }
                LayerKind::Mamba2 => {
                    let m = config.mamba2.as_ref().ok_or_else(|| {
                        ModelError::MissingMetadata("ssm.state_size (Mamba-2 layers)".into())
                    })?;
                    Some(Mixer::Mamba2(Mamba2Weights::load(file, il, d, m)?))
                }
                LayerKind::Attention => None,
            };
            let mixer = match mixer {
                Some(m) => m,
                None => attention_weights(file, config, il)?,
            };
            layers.push(LayerWeights {
                attn_norm: opt_vec("attn_norm", d, config.pre_norms)?,
                mixer,
                post_attn_norm: opt_vec("post_attention_norm", d, config.post_norms)?,
                ffn_norm: opt_vec(config.ffn_norm_tensor, d, config.pre_norms)?,
                ffn: crate::feed_forward::load(file, config, il)?,
                post_ffn_norm: opt_vec("post_ffw_norm", d, config.post_norms)?,
                per_layer_input: match config.per_layer_input {
                    Some(n) => Some(crate::per_layer_input::LayerInputWeights::load(
                        file, il, d, n,
                    )?),
                    None => None,
                },
                output_scale: match file.tensor(&name("layer_output_scale")) {
                    Some(_) => Some(vector(file, &name("layer_output_scale"), 1)?[0]),
                    None => None,
                },
                residual_norms: crate::encoder::residual_norms(file, config, il)?,
            });
        }
        let half = config.rope_dim / 2;
        let rope_freqs = match file.tensor("rope_freqs.weight") {
            Some(_) => Some(vector(file, "rope_freqs.weight", half)?),
            None => None,
        };
        // LongRoPE: the short factors by default, the long ones past the original context.
        let (rope_freqs, rope_divisors_long) = match config.rope_scaling {
            RopeScaling::LongRope { .. } => (
                Some(vector(file, "rope_factors_short.weight", half)?),
                Some(vector(file, "rope_factors_long.weight", half)?),
            ),
            _ => (rope_freqs, None),
        };
        let divisors = |scaling: RopeScaling, base: f64, rope_dim: usize, file: bool| match (
            rope_freqs.as_ref().filter(|_| file),
            scaling.freq_divisors(rope_dim, base),
        ) {
            (Some(file), Some(own)) => Some(file.iter().zip(&own).map(|(a, b)| a * b).collect()),
            (file, own) => own.or_else(|| file.cloned()),
        };
        let rope_divisors_global =
            divisors(config.rope_scaling, config.rope_base, config.rope_dim, true);
        let rope_divisors_local = divisors(
            config.rope_scaling_local,
            config.rope_base_local,
            config.rope_dim_local,
            config.rope_freqs_local,
        );
        if let (Some(local), true) = (&rope_divisors_local, config.rope_freqs_local) {
            if local.len() != config.rope_dim_local / 2 {
                return Err(ModelError::BadMetadata {
                    key: "rope_freqs.weight".into(),
                    reason: "sliding-window layers rotate another number of dimensions".into(),
                });
            }
        }
        let per_layer_inputs = match config.per_layer_input {
            Some(n) => Some(crate::per_layer_input::PerLayerInputs::load(
                file, config, n,
            )?),
            None => None,
        };
        let mut mtp = crate::mtp::MtpWeights::load(file, config, &layers, &output_norm)?;
        // The fast path's products (not the embedding lookup, which reads a few rows of the
        // file's blocks per token).
        let mut output = output;
        let mtp_matrices = mtp.iter_mut().flat_map(|m| {
            let mut v = m.block.matrices_mut();
            v.push(&mut m.eh_proj);
            v.extend(m.head.as_mut());
            v
        });
        let head = Some(&mut output).filter(|_| config.output_head);
        let matrices = head
            .into_iter()
            .chain(layers.iter_mut().flat_map(LayerWeights::matrices_mut))
            .chain(mtp_matrices)
            .collect();
        repack_for_fast_path(file, matrices)?;
        Ok(Weights {
            encoder: crate::encoder::EncoderEmbeddings::load(file, config)?,
            mtp,
            per_layer_inputs,
            rope_divisors_global,
            rope_divisors_local,
            rope_divisors_long,
            token_embd,
            layers,
            output_norm,
            output,
            tied_output: tied_output && config.output_head,
            has_output_head: config.output_head,
        })
    }

    /// Bytes of weights repacked for the fast path and held in memory (see
    /// [`Weight::packed_bytes`]).
    pub fn packed_bytes(&self) -> usize {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| l.matrices().into_iter().map(|m| m.0));
        layers.chain([&self.output]).map(|w| w.packed_bytes()).sum()
    }

    /// Every matrix, for accounting (the tied head is listed once), with the share of tokens
    /// that read it (experts: the used fraction, on average).
    pub fn matrices(&self) -> impl Iterator<Item = (&Weight, f64)> {
        let head = (!self.tied_output && self.has_output_head).then_some((&self.output, 1.0));
        let per_layer = (self.per_layer_inputs.iter())
            .flat_map(|p| [(&p.token_embd, 1.0), (&p.model_proj, 1.0)]);
        std::iter::once((&self.token_embd, 1.0))
            .chain(per_layer)
            .chain(self.layers.iter().flat_map(LayerWeights::matrices))
            .chain(head)
    }
}

/// Layer `il`'s attention weights (past the main layers, Qwen3.5's MTP block: shaped as layer 0).
pub(crate) fn attention_weights(
    file: &GgufFile,
    config: &ModelConfig,
    il: usize,
) -> Result<Mixer, ModelError> {
    let d = config.d_model;
    let name = |s: &str| format!("blk.{il}.{s}.weight");
    let shape = (config.layer_attention.get(il)).unwrap_or(&config.layer_attention[0]);
    let (q_dim, kv_dim) = (config.n_heads * shape.head_dim, shape.kv_dim());
    let (q_norm_len, k_norm_len) = match config.qk_norm {
        QkNorm::Whole => (q_dim, kv_dim),
        QkNorm::None | QkNorm::PerHead => (shape.head_dim, shape.head_dim),
    };
    // Gemma 4's KV-shared layers compute no keys or values; its 31B's global layers take the
    // raw keys as values (no `attn_v`).
    let computes_kv = config.kv_source.get(il).is_none_or(|&s| s == il);
    let opt_vec = |s: &str, n: usize, wanted: bool| -> Result<Option<Vec<f32>>, ModelError> {
        if wanted {
            vector(file, &name(s), n).map(Some)
        } else {
            Ok(None)
        }
    };
    let bias = |s: &str, n: usize| -> Result<Option<Vec<f32>>, ModelError> {
        if config.qkv_bias {
            vector(file, &format!("blk.{il}.{s}.bias"), n).map(Some)
        } else {
            Ok(None)
        }
    };
    // Qwen3.5's query projection gives each head's queries then its output gate.
    let q_rows = q_dim * if config.attn_output_gate { 2 } else { 1 };
    let (wq, wk, wv) = if config.fused_qkv {
        let [q, k, v] = row_parts(file, &name("attn_qkv"), d, [q_dim, kv_dim, kv_dim])?;
        (q, Some(k), Some(v))
    } else if !computes_kv {
        (matrix(file, &name("attn_q"), d, q_rows)?, None, None)
    } else {
        let values_are_keys = config.architecture == crate::Architecture::Gemma4
            && file.tensor(&name("attn_v")).is_none();
        (
            matrix(file, &name("attn_q"), d, q_rows)?,
            Some(matrix(file, &name("attn_k"), d, kv_dim)?),
            match values_are_keys {
                true => None,
                false => Some(matrix(file, &name("attn_v"), d, kv_dim)?),
            },
        )
    };
    let has_k_norm = config.qk_norm != QkNorm::None && computes_kv;
    Ok(Mixer::Attention(AttentionWeights {
        wq,
        wk,
        wv,
        wo: matrix(file, &name("attn_output"), q_dim, d)?,
        output_gate: config.attn_output_gate,
        q_norm: opt_vec("attn_q_norm", q_norm_len, config.qk_norm != QkNorm::None)?,
        k_norm: opt_vec("attn_k_norm", k_norm_len, has_k_norm)?,
        q_bias: bias("attn_q", q_dim)?,
        k_bias: bias("attn_k", kv_dim)?,
        v_bias: bias("attn_v", kv_dim)?,
        o_bias: if config.attn_output_bias {
            Some(vector(file, &format!("blk.{il}.attn_output.bias"), d)?)
        } else {
            None
        },
        attn_sinks: opt_vec("attn_sinks", config.n_heads, config.attn_sinks)?,
    }))
}

/// Repacks every matrix whose rows the fast kernels read best in another layout, all into one
/// buffer, each starting on a cache line.
fn repack_for_fast_path(file: &GgufFile, mut matrices: Vec<&mut Weight>) -> Result<(), ModelError> {
    let mut plans = Vec::with_capacity(matrices.len());
    let mut total = 0usize;
    for w in &matrices {
        plans.push(w.repack_plan()?.map(|(layout, activations, bytes)| {
            let start = total;
            total = (start + bytes).next_multiple_of(64);
            (layout, activations, start..start + bytes)
        }));
    }
    let mut buffer = LargeBuffer::zeroed(total).ok_or(ModelError::OutOfMemory { bytes: total })?;
    for (w, plan) in matrices.iter().zip(&plans) {
        if let Some((layout, _, range)) = plan {
            w.repack_into(file, *layout, &mut buffer[range.clone()])?;
        }
    }
    let buffer = Arc::new(buffer);
    for (w, plan) in matrices.iter_mut().zip(plans) {
        if let Some((layout, activations, range)) = plan {
            w.packed = Some(Box::new(PackedRows {
                buffer: buffer.clone(),
                range,
                layout,
            }));
            w.activations = activations;
        }
    }
    Ok(())
}

/// `n` matrices of `rows` rows of `cols` elements stacked in one tensor (ggml dims
/// `[cols, rows, n]`), each a weight of its own over its part of the file.
pub(crate) fn stacked(
    file: &GgufFile,
    name: &str,
    cols: usize,
    rows: usize,
    n: usize,
) -> Result<Vec<Weight>, ModelError> {
    let (info, ty) = shaped(file, name, &[cols, rows, n])?;
    let len = info.size as usize / n;
    Ok((0..n)
        .map(|e| Weight {
            name: format!("{name}[{e}]"),
            ty,
            rows,
            cols,
            activations: Activations::Int8,
            offset: info.offset as usize + e * len,
            len,
            packed: None,
        })
        .collect())
}

fn tensor<'f>(file: &'f GgufFile, name: &str) -> Result<&'f TensorInfo, ModelError> {
    file.tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
}

fn quant_type(info: &TensorInfo) -> Result<QuantType, ModelError> {
    QuantType::from_ggml_id(info.ggml_type.id())
        .filter(|t| !matches!(t, QuantType::Q8_1 | QuantType::Q8_K))
        .ok_or_else(|| ModelError::UnsupportedTensorType {
            name: info.name.clone(),
            ty: info.ggml_type.name().to_string(),
        })
}

/// Tensor `name`, checked to have ggml dims `dims`, with its element type.
pub(crate) fn shaped<'f>(
    file: &'f GgufFile,
    name: &str,
    dims: &[usize],
) -> Result<(&'f TensorInfo, QuantType), ModelError> {
    let info = tensor(file, name)?;
    let expected: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    // Trailing dimensions of 1 say nothing: llama-quantize drops them (it writes ggml's
    // n_dims), the converter keeps them (Qwen3.5-MoE's shared-expert gate: [d, 1] or [d]).
    let trim = |d: &[u64]| -> usize {
        let mut n = d.len();
        while n > 1 && d[n - 1] == 1 {
            n -= 1;
        }
        n
    };
    if info.dims[..trim(&info.dims)] != expected[..trim(&expected)] {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            found: info.dims.clone(),
            expected,
        });
    }
    Ok((info, quant_type(info)?))
}

/// A matrix with `rows` rows of `cols` elements (ggml dims `[cols, rows]`).
pub(crate) fn matrix(
    file: &GgufFile,
    name: &str,
    cols: usize,
    rows: usize,
) -> Result<Weight, ModelError> {
    let (info, ty) = shaped(file, name, &[cols, rows])?;
    Ok(Weight {
        name: name.to_string(),
        ty,
        rows,
        cols,
        activations: Activations::Int8,
        offset: info.offset as usize,
        len: info.size as usize,
        packed: None,
    })
}

/// A matrix of `cols` columns whose rows are several matrices one after another (Phi-3's fused
/// `attn_qkv` and gate/up), each a weight over its rows of the file.
pub(crate) fn row_parts<const N: usize>(
    file: &GgufFile,
    name: &str,
    cols: usize,
    rows: [usize; N],
) -> Result<[Weight; N], ModelError> {
    let whole = matrix(file, name, cols, rows.iter().sum())?;
    Ok(split_rows(&whole, rows))
}

/// A weight's rows cut into consecutive parts of `rows` rows each (their sum: all of them).
pub(crate) fn split_rows<const N: usize>(whole: &Weight, rows: [usize; N]) -> [Weight; N] {
    let row_bytes = whole.len / whole.rows;
    let mut start = 0;
    rows.map(|n| {
        let part = Weight {
            name: format!("{}[rows {start}..{}]", whole.name, start + n),
            rows: n,
            offset: whole.offset + start * row_bytes,
            len: n * row_bytes,
            ..whole.clone()
        };
        start += n;
        part
    })
}

/// `n` vectors of `len` elements stacked in one tensor (ggml dims `[len, n]`), dequantized.
pub(crate) fn stacked_vectors(
    file: &GgufFile,
    name: &str,
    len: usize,
    n: usize,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let (info, ty) = shaped(file, name, &[len, n])?;
    let row_bytes = ty.row_bytes_checked(len)?;
    let data = file.tensor_data(info);
    (0..n)
        .map(|e| {
            let mut out = vec![0.0; len];
            rill_kernels::dequantize_row(ty, &data[e * row_bytes..(e + 1) * row_bytes], &mut out)?;
            Ok(out)
        })
        .collect()
}

/// A vector of `n` elements, dequantized to f32.
pub(crate) fn vector(file: &GgufFile, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
    let (info, ty) = shaped(file, name, &[n])?;
    let mut out = vec![0.0; n];
    rill_kernels::dequantize_row(ty, file.tensor_data(info), &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use rill_gguf::GgmlType;
    use rill_kernels::QuantType;

    /// The file format's size table (rill-gguf) and the kernels' block layouts must agree on
    /// every type both know.
    #[test]
    fn gguf_and_kernel_block_sizes_agree() {
        for qt in QuantType::ALL {
            let gt = GgmlType::from_id(qt.ggml_id()).expect("every kernel type is a ggml type");
            assert_eq!(gt.block_size() as usize, qt.block_size(), "{qt}");
            assert_eq!(gt.block_bytes() as usize, qt.block_bytes(), "{qt}");
        }
    }
}
