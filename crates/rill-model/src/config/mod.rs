//! Architectures as data: everything the forward pass varies on, read from GGUF metadata.

use rill_gguf::Metadata;
use rill_kernels::ops::{GateActivation, RopeStyle};
use rill_kernels::Activations;

use crate::ModelError;

mod gemma4;
mod parts;
mod per_layer;
mod rope;
mod traits;

pub use parts::{
    Architecture, AttentionShape, DeltaNetConfig, LayerKind, Mamba2Config, MoeConfig, MoeGating,
    QkNorm,
};

use per_layer::{kinds_by_kv_heads, per_layer_counts, positive, recurrent_layers, sliding_layers};

pub use rope::RopeScaling;

/// Everything about a model's shape and numerics.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    /// The context length the model was trained for.
    pub context_length: usize,
    pub rms_eps: f32,
    pub rope_style: RopeStyle,
    /// Dimensions of each head that rotate (the rest pass through).
    pub rope_dim: usize,
    pub rope_base: f64,
    /// RoPE base of sliding-window layers.
    pub rope_base_local: f64,
    pub rope_scaling: RopeScaling,
    /// Position scaling of sliding-window layers (Gemma 3 scales only its global layers).
    pub rope_scaling_local: RopeScaling,
    pub activation: GateActivation,
    /// Multiplier applied to token embeddings (Gemma: sqrt(d_model)).
    pub embedding_scale: Option<f32>,
    /// RMSNorm of the queries and keys before RoPE.
    pub qk_norm: QkNorm,
    /// RMSNorm of the residual stream before attention and before the feed-forward (every
    /// architecture but OLMo 2, which normalises their outputs instead).
    pub pre_norms: bool,
    /// Per layer: does it rotate queries and keys (SmolLM3 leaves every fourth layer without)?
    pub layer_uses_rope: Vec<bool>,
    /// Attention and feed-forward outputs are multiplied by this before the residual add
    /// (Granite).
    pub residual_scale: Option<f32>,
    /// Logits are divided by this (Granite).
    pub logit_scale: Option<f32>,
    /// Attention scores become `cap * tanh(score / cap)` before the softmax (Gemma 2).
    pub attn_logit_softcap: Option<f32>,
    /// A routed feed-forward in every layer instead of a dense one.
    pub moe: Option<MoeConfig>,
    /// A bias on the attention output projection (gpt-oss).
    pub attn_output_bias: bool,
    /// A learned sink logit per head joins each softmax (gpt-oss).
    pub attn_sinks: bool,
    /// The name of the feed-forward's pre-norm tensor (`blk.N.<name>.weight`).
    pub ffn_norm_tensor: &'static str,
    /// q, k and v stored as one `attn_qkv` tensor (rows: q, then k, then v) (Phi-3).
    pub fused_qkv: bool,
    /// Gate and up stored as one `ffn_up` tensor of twice the rows (gate first) (Phi-3).
    pub fused_gate_up: bool,
    /// Biases added to the query, key and value projections (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm of the attention and feed-forward outputs before the residual add (Gemma 2/3).
    pub post_norms: bool,
    /// Scale of the query-key dot products.
    pub attention_scale: f32,
    /// Window of sliding-window layers: a query at p sees keys k with `p - k < window`.
    pub sliding_window: Option<usize>,
    /// Per layer: does it use the sliding window (and the local RoPE base)?
    pub layer_is_sliding: Vec<bool>,
    /// Logits become `cap * tanh(logits / cap)`.
    pub final_logit_softcap: Option<f32>,
    /// How the fast path feeds the feed-forward down projection's input to its weights. 8-bit
    /// blocks suffice for SiLU-gated models; Gemma's GeGLU output has outliers that make one
    /// 8-bit scale per block coarse, so it goes in unquantized against exactly dequantized
    /// weights (more accurate, and cheaper than two 8-bit levels).
    pub ffn_down_activations: Activations,
    /// Per layer: attention or a recurrent mixer.
    pub layer_kinds: Vec<LayerKind>,
    /// A sigmoid gate on each attention output element, from the query projection (Qwen3.5).
    pub attn_output_gate: bool,
    /// The DeltaNet layers' shape, for a model that has them.
    pub delta_net: Option<DeltaNetConfig>,
    /// The short-convolution layers' kernel size, for a model that has them.
    pub short_conv_kernel: Option<usize>,
    /// The Mamba-2 layers' shape, for a model that has them.
    pub mamba2: Option<Mamba2Config>,
    /// The final norm's tensor name (LFM2 stores it as `token_embd_norm`).
    pub output_norm_tensor: &'static str,
    /// A shared expert beside the routed ones, gated by a sigmoid (Qwen3.5-MoE): its FFN size.
    pub shared_expert_ffn_dim: Option<usize>,
    /// Leading layers with a dense feed-forward before the routed ones (LFM2-MoE).
    pub dense_leading_layers: usize,
    /// Multi-token-prediction blocks stored after the main ones (Qwen3.5's MTP draft head;
    /// not counted in `n_layers`).
    pub mtp_layers: usize,
    /// Per layer: its heads' shape. The same for every layer but Gemma 4's, whose sliding
    /// layers have smaller heads (`n_kv_heads`, `head_dim` and `rope_dim` are the global ones').
    pub layer_attention: Vec<AttentionShape>,
    /// RoPE dimensions of sliding-window layers.
    pub rope_dim_local: usize,
    /// Per layer: the layer whose keys and values it attends over (itself but for Gemma 4's
    /// KV-shared layers, which compute none).
    pub kv_source: Vec<usize>,
    /// Per layer: the dense feed-forward's width (Gemma 4 doubles its KV-shared layers');
    /// `ffn_dim` is the widest.
    pub layer_ffn_dims: Vec<usize>,
    /// Width of each layer's slice of the per-layer input embeddings (Gemma 4's E2B/E4B).
    pub per_layer_input: Option<usize>,
    /// A weightless RMSNorm of each value head before it is cached (Gemma 4).
    pub v_norm: bool,
    /// The file's `rope_freqs` divide the sliding-window layers' frequencies too (Gemma 4's
    /// are for its global layers only).
    pub rope_freqs_local: bool,
    /// A dense feed-forward beside the routed experts in every layer, each branch with norms
    /// of its own, the router reading the residual stream (Gemma 4 26B-A4B).
    pub dense_beside_experts: bool,
    /// Every position attends to every position of its sequence, not only to earlier ones
    /// (an encoder: BERT). A sequence's rows must then go through in one pass.
    pub bidirectional: bool,
    /// LayerNorms (weight and bias) of the residual stream after each residual add, and of the
    /// summed embeddings, instead of RMSNorms before each sublayer (BERT's post-LN).
    pub post_layer_norms: bool,
    /// Learned absolute position embeddings added to the tokens' (`position_embd`; BERT).
    pub learned_positions: bool,
    /// An ungated, biased feed-forward: `down(gelu(up · h))`, GELU by the error function (BERT).
    pub ungated_ffn: bool,
    /// An output head over the vocabulary (every generative model; an encoder has none: its
    /// output is its last hidden states).
    pub output_head: bool,
}

impl ModelConfig {
    /// Reads the configuration of a GGUF file (metadata, with the vocabulary size taken from the
    /// token embedding when the metadata has none).
    pub fn from_file(file: &rill_gguf::GgufFile) -> Result<ModelConfig, ModelError> {
        let vocab_rows = file
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .and_then(|v| usize::try_from(v).ok());
        let mut config = ModelConfig::from_metadata(file.metadata(), vocab_rows)?;
        if let RopeScaling::LongRope { attn_factor, .. } = config.rope_scaling {
            // Phi-3's converter writes the original context for every file but the LongRoPE
            // factors only for the long-context models; llama.cpp loads them where present.
            // Without them (Phi-3-mini-4k and the like) the rotation is plain RoPE.
            let short = file.tensor("rope_factors_short.weight").is_some();
            let long = file.tensor("rope_factors_long.weight").is_some();
            match (short, long) {
                (true, true) => {}
                (false, false) if attn_factor == 1.0 => {
                    config.rope_scaling = RopeScaling::None;
                    config.rope_scaling_local = RopeScaling::None;
                }
                (false, false) => {
                    return Err(ModelError::BadMetadata {
                        key: format!("{}.rope.scaling.attn_factor", config.architecture.name()),
                        reason: format!(
                            "a LongRoPE attention factor ({attn_factor}) without the LongRoPE \
                             factors (rope_factors_short/long.weight): no converter writes that"
                        ),
                    })
                }
                (false, true) => {
                    return Err(ModelError::MissingTensor(
                        "rope_factors_short.weight".into(),
                    ))
                }
                (true, false) => {
                    return Err(ModelError::MissingTensor("rope_factors_long.weight".into()))
                }
            }
        }
        Ok(config)
    }

    /// Reads the configuration from GGUF metadata. `vocab_rows` is the row count of the token
    /// embedding tensor, used when the metadata has no `vocab_size`.
    pub fn from_metadata(
        meta: &Metadata,
        vocab_rows: Option<usize>,
    ) -> Result<ModelConfig, ModelError> {
        let arch_name = meta
            .get_str("general.architecture")?
            .ok_or_else(|| ModelError::MissingMetadata("general.architecture".into()))?;
        let architecture = Architecture::from_name(arch_name)
            .ok_or_else(|| ModelError::UnsupportedArchitecture(arch_name.to_string()))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize, ModelError> {
            let full = key(k);
            let v = meta
                .get_u64(&full)?
                .ok_or_else(|| ModelError::MissingMetadata(full.clone()))?;
            positive(&full, v)
        };
        let opt = |k: &str| -> Result<Option<usize>, ModelError> {
            let full = key(k);
            meta.get_u64(&full)?.map(|v| positive(&full, v)).transpose()
        };
        let optf = |k: &str| -> Result<Option<f64>, ModelError> { Ok(meta.get_f64(&key(k))?) };
        let moe = |gating: MoeGating, biases: bool| -> Result<MoeConfig, ModelError> {
            let (n_experts, n_used) = (req("expert_count")?, req("expert_used_count")?);
            if n_used > n_experts {
                return Err(ModelError::BadMetadata {
                    key: key("expert_used_count"),
                    reason: format!("{n_used} of only {n_experts} experts"),
                });
            }
            Ok(MoeConfig {
                n_experts,
                n_used,
                expert_ffn_dim: req("expert_feed_forward_length")?,
                gating,
                biases,
            })
        };
        // Where 0 means "none" (a sliding window of 0, as llama.cpp reads it).
        let opt_zero = |k: &str| -> Result<Option<usize>, ModelError> {
            let full = key(k);
            (meta.get_u64(&full)?.filter(|&v| v > 0))
                .map(|v| positive(&full, v))
                .transpose()
        };

        let n_layers = req("block_count")?;
        let d_model = req("embedding_length")?;
        // A model whose every layer is routed may give only the experts' size (Qwen3.5-MoE);
        // Gemma 4 gives one width per layer.
        let ffn_dims = per_layer_counts(meta, &key("feed_forward_length"), n_layers)?;
        let ffn_dim = match &ffn_dims {
            Some(dims) => dims.iter().copied().max().unwrap_or(0).max(1),
            None => match opt("feed_forward_length")? {
                Some(f) => f,
                None => opt("expert_feed_forward_length")?
                    .ok_or_else(|| ModelError::MissingMetadata(key("feed_forward_length")))?,
            },
        };
        let n_heads = req("attention.head_count")?;
        // LFM2 gives one KV head count per layer (0 for its convolution layers).
        let kv_heads_per_layer = per_layer_counts(meta, &key("attention.head_count_kv"), n_layers)?;
        let n_kv_heads = match &kv_heads_per_layer {
            Some(counts) => counts.iter().copied().find(|&c| c > 0).unwrap_or(n_heads),
            None => opt("attention.head_count_kv")?.unwrap_or(n_heads),
        };
        if let (Some(counts), false) = (&kv_heads_per_layer, architecture == Architecture::Gemma4) {
            if counts.iter().any(|&c| c != 0 && c != n_kv_heads) {
                return Err(ModelError::BadMetadata {
                    key: key("attention.head_count_kv"),
                    reason: "attention layers with different KV head counts".into(),
                });
            }
        }
        if n_heads % n_kv_heads != 0 {
            return Err(ModelError::BadMetadata {
                key: key("attention.head_count_kv"),
                reason: format!("{n_kv_heads} does not divide the {n_heads} query heads"),
            });
        }
        let head_dim = match opt("attention.key_length")? {
            Some(v) => v,
            None => {
                if d_model % n_heads != 0 {
                    return Err(ModelError::BadMetadata {
                        key: key("embedding_length"),
                        reason: format!("{d_model} is not divisible by {n_heads} heads"),
                    });
                }
                d_model / n_heads
            }
        };
        if let Some(v) = opt("attention.value_length")? {
            if v != head_dim {
                return Err(ModelError::BadMetadata {
                    key: key("attention.value_length"),
                    reason: format!("value length {v} differs from key length {head_dim}"),
                });
            }
        }
        let rope_dim = opt("rope.dimension_count")?.unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(ModelError::BadMetadata {
                key: key("rope.dimension_count"),
                reason: format!("{rope_dim} must be even and at most the head size {head_dim}"),
            });
        }
        let vocab_size = match opt("vocab_size")? {
            Some(v) => v,
            None => vocab_rows.ok_or_else(|| ModelError::MissingMetadata(key("vocab_size")))?,
        };
        let context_length = opt("context_length")?.unwrap_or(2048);
        let rms_eps = optf("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5) as f32;
        let rope_base = optf("rope.freq_base")?.unwrap_or(10_000.0);
        let rope_scaling = match meta.get_str(&key("rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some(kind @ ("linear" | "yarn")) => {
                let positive_f32 = |k: &str, default: f64| -> Result<f32, ModelError> {
                    let v = optf(k)?.unwrap_or(default) as f32;
                    if v > 0.0 && v.is_finite() {
                        Ok(v)
                    } else {
                        Err(ModelError::BadMetadata {
                            key: key(k),
                            reason: format!("{v} is not a positive number"),
                        })
                    }
                };
                let factor = positive_f32("rope.scaling.factor", 1.0)?;
                if kind == "linear" {
                    RopeScaling::Linear { factor }
                } else {
                    RopeScaling::Yarn {
                        factor,
                        original_context: opt("rope.scaling.original_context_length")?
                            .unwrap_or(context_length),
                        beta_fast: positive_f32("rope.scaling.yarn_beta_fast", 32.0)?,
                        beta_slow: positive_f32("rope.scaling.yarn_beta_slow", 1.0)?,
                        attn_factor: positive_f32("rope.scaling.attn_factor", 1.0)?,
                        truncate: true,
                    }
                }
            }
            Some(other) => {
                return Err(ModelError::BadMetadata {
                    key: key("rope.scaling.type"),
                    reason: format!("unsupported RoPE scaling {other:?}"),
                })
            }
        };
        let final_logit_softcap = optf("final_logit_softcapping")?
            .filter(|c| *c > 0.0)
            .map(|c| c as f32);

        let mut config = ModelConfig {
            architecture,
            n_layers,
            d_model,
            n_heads,
            n_kv_heads,
            head_dim,
            ffn_dim,
            vocab_size,
            context_length,
            rms_eps,
            rope_style: RopeStyle::Adjacent,
            rope_dim,
            rope_base,
            rope_base_local: rope_base,
            rope_scaling,
            rope_scaling_local: rope_scaling,
            activation: GateActivation::Silu,
            embedding_scale: None,
            qk_norm: QkNorm::None,
            pre_norms: true,
            layer_uses_rope: vec![true; n_layers],
            residual_scale: None,
            logit_scale: None,
            attn_logit_softcap: None,
            moe: None,
            attn_output_bias: false,
            attn_sinks: false,
            ffn_norm_tensor: "ffn_norm",
            fused_qkv: false,
            fused_gate_up: false,
            qkv_bias: false,
            post_norms: false,
            attention_scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: None,
            layer_is_sliding: vec![false; n_layers],
            final_logit_softcap,
            // Measured on the references (fast path, `--test reference`): SmolLM2 with plain
            // 8-bit inputs to ffn_down has mean last-position KL 0.0027 and top-1 0.970 (with
            // two levels: 0.0029 and 0.973), so the extra work buys nothing there.
            ffn_down_activations: Activations::Int8,
            layer_kinds: vec![LayerKind::Attention; n_layers],
            attn_output_gate: false,
            delta_net: None,
            short_conv_kernel: None,
            mamba2: None,
            output_norm_tensor: "output_norm",
            shared_expert_ffn_dim: None,
            mtp_layers: 0,
            dense_leading_layers: 0,
            layer_attention: vec![
                AttentionShape {
                    n_kv_heads,
                    head_dim,
                    rope_dim
                };
                n_layers
            ],
            rope_dim_local: rope_dim,
            kv_source: (0..n_layers).collect(),
            layer_ffn_dims: ffn_dims.clone().unwrap_or_else(|| vec![ffn_dim; n_layers]),
            per_layer_input: None,
            v_norm: false,
            rope_freqs_local: true,
            dense_beside_experts: false,
            bidirectional: false,
            post_layer_norms: false,
            learned_positions: false,
            ungated_ffn: false,
            output_head: true,
        };

        // Gemma scales queries by 1/sqrt(query_pre_attn_scalar), which converters do not write:
        // the file's `attention.scale` where it has one (llama.cpp's own model saver writes it),
        // else llama.cpp's rule: the head size, but d_model / n_heads for the 27B, which
        // llama.cpp knows by its layer count (`layers_27b`).
        let gemma_query_scale = |layers_27b: usize| -> Result<f32, ModelError> {
            if let Some(scale) = optf("attention.scale")? {
                if !(scale.is_finite() && scale > 0.0) {
                    return Err(ModelError::BadMetadata {
                        key: key("attention.scale"),
                        reason: format!("{scale} is not a positive scale"),
                    });
                }
                return Ok(scale as f32);
            }
            let scalar = if n_layers == layers_27b {
                d_model / n_heads
            } else {
                head_dim
            };
            Ok(1.0 / (scalar as f32).sqrt())
        };
        match architecture {
            Architecture::Llama => {}
            // HF's Qwen2/Qwen3 rotate the two halves of each head (rotate_half), and
            // convert_hf_to_gguf.py keeps their q/k rows as they are (it permutes only llama's).
            Architecture::Qwen2 => {
                config.rope_style = RopeStyle::NeoX;
                config.qkv_bias = true;
            }
            Architecture::Qwen3 => {
                config.rope_style = RopeStyle::NeoX;
                config.qk_norm = QkNorm::PerHead;
            }
            Architecture::Qwen3Moe => {
                config.rope_style = RopeStyle::NeoX;
                config.qk_norm = QkNorm::PerHead;
                // GGUF does not carry norm_topk_prob: llama.cpp always renormalises for Qwen3-MoE
                // (every released model sets it).
                let gating = MoeGating::SoftmaxThenTop { renormalize: true };
                config.moe = Some(moe(gating, false)?);
            }
            Architecture::Qwen35 | Architecture::Qwen35Moe => {
                config.rope_style = RopeStyle::NeoX;
                config.qk_norm = QkNorm::PerHead;
                config.attn_output_gate = true;
                // The feed-forward's pre-norm is stored under the name of a post-attention norm.
                config.ffn_norm_tensor = "post_attention_norm";
                config.delta_net = Some(DeltaNetConfig {
                    n_k_heads: req("ssm.group_count")?,
                    n_v_heads: req("ssm.time_step_rank")?,
                    d_k: req("ssm.state_size")?,
                    d_v: req("ssm.inner_size")? / req("ssm.time_step_rank")?,
                    conv_kernel: req("ssm.conv_kernel")?,
                });
                let dn = config.delta_net.expect("just set");
                if !dn.n_v_heads.is_multiple_of(dn.n_k_heads)
                    || dn.d_v * dn.n_v_heads != req("ssm.inner_size")?
                {
                    return Err(ModelError::BadMetadata {
                        key: key("ssm.inner_size"),
                        reason: format!(
                            "{} value heads over {} key heads do not fit",
                            dn.n_v_heads, dn.n_k_heads
                        ),
                    });
                }
                config.layer_kinds =
                    recurrent_layers(meta, &key("attention.recurrent_layers"), n_layers)?
                        .into_iter()
                        .map(|r| {
                            if r {
                                LayerKind::DeltaNet
                            } else {
                                LayerKind::Attention
                            }
                        })
                        .collect();
                // A multi-token-prediction block (the converter's `nextn` layers) follows the
                // main ones: the main pass stops before it.
                let mtp = meta.get_u64(&key("nextn_predict_layers"))?.unwrap_or(0) as usize;
                if mtp >= n_layers {
                    return Err(ModelError::BadMetadata {
                        key: key("nextn_predict_layers"),
                        reason: format!("{mtp} of only {n_layers} blocks"),
                    });
                }
                config.mtp_layers = mtp;
                config.n_layers = n_layers - mtp;
                for v in [&mut config.layer_uses_rope, &mut config.layer_is_sliding] {
                    v.truncate(n_layers - mtp);
                }
                config.layer_kinds.truncate(n_layers - mtp);
                config.layer_attention.truncate(n_layers - mtp);
                config.kv_source.truncate(n_layers - mtp);
                config.layer_ffn_dims.truncate(n_layers - mtp);
                if architecture == Architecture::Qwen35Moe {
                    let gating = MoeGating::SoftmaxThenTop { renormalize: true };
                    config.moe = Some(moe(gating, false)?);
                    config.shared_expert_ffn_dim = opt("expert_shared_feed_forward_length")?;
                }
            }
            Architecture::Lfm2 | Architecture::Lfm2Moe => {
                if architecture == Architecture::Lfm2Moe {
                    // llama.cpp's gating functions: 1 softmax, 2 sigmoid.
                    let gating_func = meta.get_u64(&key("expert_gating_func"))?.unwrap_or(2);
                    if gating_func != 2 {
                        return Err(ModelError::BadMetadata {
                            key: key("expert_gating_func"),
                            reason: format!(
                                "{gating_func} (rill runs LFM2-MoE's sigmoid router, 2)"
                            ),
                        });
                    }
                    let scale = optf("expert_weights_scale")?
                        .filter(|s| *s != 0.0)
                        .unwrap_or(1.0) as f32;
                    config.moe = Some(moe(MoeGating::SigmoidThenTop { scale }, false)?);
                    config.dense_leading_layers = meta
                        .get_u64(&key("leading_dense_block_count"))?
                        .unwrap_or(0) as usize;
                }
                config.rope_style = RopeStyle::NeoX;
                config.qk_norm = QkNorm::PerHead;
                config.output_norm_tensor = "token_embd_norm";
                config.short_conv_kernel = Some(req("shortconv.l_cache")?);
                config.layer_kinds =
                    kinds_by_kv_heads(&kv_heads_per_layer, LayerKind::ShortConv, &key)?;
            }
            Architecture::Phi3 => {
                config.rope_style = RopeStyle::NeoX;
                config.fused_qkv = true;
                config.fused_gate_up = true;
                if let Some(original_context) = opt("rope.scaling.original_context_length")? {
                    let attn_factor = optf("rope.scaling.attn_factor")?.unwrap_or(1.0) as f32;
                    config.rope_scaling = RopeScaling::LongRope {
                        original_context,
                        attn_factor,
                    };
                    config.rope_scaling_local = config.rope_scaling;
                }
                if let Some(window) = opt_zero("attention.sliding_window")? {
                    config.sliding_window = Some(window);
                    config.layer_is_sliding = vec![true; n_layers];
                }
            }
            Architecture::GptOss => {
                config.rope_style = RopeStyle::NeoX;
                config.qkv_bias = true;
                config.attn_output_bias = true;
                config.attn_sinks = true;
                config.activation = GateActivation::SwigluClamped;
                // The feed-forward's pre-norm is stored under the name of a post-attention norm.
                config.ffn_norm_tensor = "post_attention_norm";
                // HF's gpt-oss YaRN keeps the ramp's ends fractional (truncate = false), which
                // GGUF does not say.
                if let RopeScaling::Yarn { truncate, .. } = &mut config.rope_scaling {
                    *truncate = false;
                }
                config.rope_scaling_local = config.rope_scaling;
                let window = opt_zero("attention.sliding_window")?.unwrap_or(128);
                config.sliding_window = Some(window);
                config.layer_is_sliding =
                    sliding_layers(meta, &key("attention.sliding_window_pattern"), n_layers, 2)?;
                config.moe = Some(moe(MoeGating::TopThenSoftmax, true)?);
            }
            Architecture::Olmo2 => {
                config.rope_style = RopeStyle::NeoX;
                config.qk_norm = QkNorm::Whole;
                config.pre_norms = false;
                config.post_norms = true;
            }
            // The converter permutes SmolLM3's and Granite's q/k as llama's (adjacent pairs).
            Architecture::Smollm3 => {
                // llama.cpp fixes the interval at 4 (HF's no_rope_layer_interval default).
                config.layer_uses_rope = (0..n_layers).map(|il| (il + 1) % 4 != 0).collect();
            }
            Architecture::Granite | Architecture::GraniteHybrid => {
                let scale = |k: &str| -> Result<Option<f32>, ModelError> {
                    Ok(optf(k)?
                        .map(|v| v as f32)
                        .filter(|v| v.is_finite() && *v != 0.0))
                };
                if architecture == Architecture::GraniteHybrid {
                    if opt_zero("expert_count")?.is_some() {
                        return Err(ModelError::BadMetadata {
                            key: key("expert_count"),
                            reason: "granitehybrid with routed experts (Granite 4.0-H Tiny/Small) \
                                     is not supported yet; the dense ones (Micro, 1B, 350M) are"
                                .into(),
                        });
                    }
                    let (d_inner, n_heads) = (req("ssm.inner_size")?, req("ssm.time_step_rank")?);
                    let n_groups = req("ssm.group_count")?;
                    if d_inner % n_heads != 0 || n_heads % n_groups != 0 || d_inner % n_groups != 0
                    {
                        return Err(ModelError::BadMetadata {
                            key: key("ssm.time_step_rank"),
                            reason: format!(
                                "{n_heads} heads in {n_groups} groups do not divide {d_inner} channels"
                            ),
                        });
                    }
                    config.mamba2 = Some(Mamba2Config {
                        d_inner,
                        n_heads,
                        n_groups,
                        d_state: req("ssm.state_size")?,
                        conv_kernel: req("ssm.conv_kernel")?,
                    });
                    // Layers without KV heads are Mamba-2 layers (as llama.cpp tells them).
                    config.layer_kinds =
                        kinds_by_kv_heads(&kv_heads_per_layer, LayerKind::Mamba2, &key)?;
                    // `rope.scaling.finetuned` false is llama.cpp's switch for no RoPE at all
                    // (Granite 4.0-H's attention has none).
                    if meta
                        .get(&key("rope.scaling.finetuned"))
                        .and_then(|v| v.as_bool())
                        == Some(false)
                    {
                        config.layer_uses_rope = vec![false; n_layers];
                    }
                }
                config.embedding_scale = scale("embedding_scale")?;
                config.residual_scale = scale("residual_scale")?;
                config.logit_scale = scale("logit_scale")?;
                if let Some(a) = scale("attention.scale")? {
                    config.attention_scale = a;
                }
            }
            Architecture::Gemma2 => {
                config.rope_style = RopeStyle::NeoX;
                config.activation = GateActivation::GeluTanh;
                config.embedding_scale = Some((d_model as f32).sqrt());
                config.post_norms = true;
                config.ffn_down_activations = Activations::Float;
                config.attn_logit_softcap = optf("attn_logit_softcapping")?
                    .filter(|c| *c > 0.0)
                    .map(|c| c as f32);
                config.attention_scale = gemma_query_scale(46)?;
                // Every other layer (the even ones) slides; 4096 when the file says nothing.
                let window = opt_zero("attention.sliding_window")?.unwrap_or(4096);
                config.sliding_window = Some(window);
                config.layer_is_sliding =
                    sliding_layers(meta, &key("attention.sliding_window_pattern"), n_layers, 2)?;
            }
            Architecture::Gemma4 => {
                gemma4::configure(&mut config, meta, &key, kv_heads_per_layer.as_deref())?
            }
            Architecture::Bert | Architecture::NomicBert => {
                // The converter writes `attention.causal` false for every BERT.
                let causal = meta.get(&key("attention.causal")).and_then(|v| v.as_bool());
                config.bidirectional = !causal.unwrap_or(false);
                config.pre_norms = false;
                config.post_layer_norms = true;
                config.output_head = false;
                config.rms_eps = optf("attention.layer_norm_epsilon")?.unwrap_or(1e-12) as f32;
                if architecture == Architecture::Bert {
                    config.learned_positions = true;
                    config.ungated_ffn = true;
                    config.qkv_bias = true;
                    config.attn_output_bias = true;
                    config.layer_uses_rope = vec![false; n_layers];
                } else {
                    // nomic's rotary is GPT-NeoX's (rotary_emb_interleaved false), base 1000.
                    config.rope_style = RopeStyle::NeoX;
                    config.fused_qkv = true;
                }
            }
            Architecture::Gemma3 => {
                config.rope_style = RopeStyle::NeoX;
                config.activation = GateActivation::GeluTanh;
                config.embedding_scale = Some((d_model as f32).sqrt());
                config.qk_norm = QkNorm::PerHead;
                config.post_norms = true;
                // Measured on the references (fast path): one 8-bit level leaves Gemma 3 at mean
                // KL 0.0054 and top-1 0.966, two levels at 0.0021 and 0.984, f32 activations at
                // 0.0023 and 0.982 (the limit is 0.006) with a third of two levels' prompt time.
                config.ffn_down_activations = Activations::Float;
                config.rope_base_local = optf("rope.freq_base_swa")?.unwrap_or(10_000.0);
                config.rope_scaling_local = RopeScaling::None;
                config.attention_scale = gemma_query_scale(62)?;
                // 0 means no sliding window, as in llama.cpp.
                let window = meta
                    .get_u64(&key("attention.sliding_window"))?
                    .filter(|&w| w > 0)
                    .map(|w| positive(&key("attention.sliding_window"), w))
                    .transpose()?;
                config.sliding_window = window;
                if window.is_some() {
                    config.layer_is_sliding = sliding_layers(
                        meta,
                        &key("attention.sliding_window_pattern"),
                        n_layers,
                        6,
                    )?;
                }
            }
        }
        Ok(config)
    }

    /// Width of one layer's keys (or values) for one token.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Layer `il`'s recurrent state (none for an attention layer).
    pub fn layer_state(&self, il: usize) -> crate::kv_cache::LayerState {
        use crate::kv_cache::LayerState;
        match self.layer_kinds.get(il) {
            Some(LayerKind::DeltaNet) => match &self.delta_net {
                Some(c) => LayerState {
                    conv: (c.conv_kernel - 1) * c.conv_channels(),
                    ssm: c.n_v_heads * c.d_k * c.d_v,
                },
                None => LayerState::default(),
            },
            Some(LayerKind::Mamba2) => match &self.mamba2 {
                Some(c) => LayerState {
                    conv: (c.conv_kernel - 1) * c.conv_channels(),
                    ssm: c.d_inner * c.d_state,
                },
                None => LayerState::default(),
            },
            Some(LayerKind::ShortConv) => LayerState {
                conv: (self.short_conv_kernel.unwrap_or(1) - 1) * self.d_model,
                ssm: 0,
            },
            _ => LayerState::default(),
        }
    }

    /// The first of the last layers that attend over an earlier layer's keys and values
    /// (Gemma 4's KV-shared layers), when the model ends with such layers: from there on, a
    /// row changes nothing another row reads, so only rows whose logits are wanted go on.
    pub fn kv_shared_tail(&self) -> Option<usize> {
        let last_storing = (self.kv_source.iter().enumerate()).rposition(|(il, &s)| s == il)?;
        Some(last_storing + 1).filter(|&first| first < self.n_layers)
    }

    /// Whether some layers keep a recurrent state.
    pub fn is_hybrid(&self) -> bool {
        self.layer_kinds.iter().any(|&k| k != LayerKind::Attention)
    }
}
