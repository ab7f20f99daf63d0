//! The parts a model's configuration is made of: its architecture, attention's shape, each
//! layer's kind, the recurrent layers' settings, mixture-of-experts and QK-norm.

/// The architectures rill runs. Each maps to a set of traits in [`ModelConfig`]; the forward
/// pass itself never matches on this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Gemma3,
    /// Qwen2 / Qwen2.5 (and the DeepSeek-R1 Qwen distills): biases on q, k and v.
    Qwen2,
    /// Qwen3 (dense): RMSNorm of each query and key head, no biases.
    Qwen3,
    /// Gemma 2: Gemma's GeGLU, scaled embeddings and post norms; soft-capped attention scores and
    /// logits; sliding-window layers alternating with global ones.
    Gemma2,
    /// OLMo 2: norms after attention and the feed-forward instead of before, and RMSNorm of the
    /// whole query and key vectors.
    Olmo2,
    /// SmolLM3: llama with every fourth layer without RoPE.
    Smollm3,
    /// Granite (3.x dense): llama with embedding, residual, attention and logit multipliers.
    Granite,
    /// Qwen3 mixture of experts (Qwen3-30B-A3B, 235B-A22B): Qwen3's attention, and a routed
    /// feed-forward of `expert_count` experts, `expert_used_count` chosen per token.
    Qwen3Moe,
    /// gpt-oss (20b, 120b): biases on every attention projection, attention sinks, a 128-token
    /// window on every other layer, YaRN; a biased router whose top experts are weighted by a
    /// softmax over them alone, biased experts with a clamped SwiGLU.
    GptOss,
    /// Phi-3 / Phi-3.5 / Phi-4-mini: q, k and v in one tensor, gate and up in one, rotary on part
    /// of each head, LongRoPE.
    Phi3,
    /// Qwen3.5 (dense): three Gated DeltaNet layers in four, the fourth gated attention with
    /// partial RoPE and per-head q/k norms.
    Qwen35,
    /// Qwen3.5 mixture of experts: Qwen3.5's layers with routed experts and a gated shared
    /// expert.
    Qwen35Moe,
    /// LFM2 / LFM2.5 (Liquid): gated short convolutions with a few attention layers.
    Lfm2,
    /// LFM2-MoE (LFM2-8B-A1B): LFM2's layers with routed experts after the first dense ones
    /// (a sigmoid router with a selection bias).
    Lfm2Moe,
    /// Granite 4.0-H (dense): Mamba-2 layers with a few attention layers (no RoPE), Granite's
    /// multipliers.
    GraniteHybrid,
    /// Gemma 4 (dense: E2B, E4B, 31B): per-layer input embeddings, sliding layers with smaller
    /// heads than the global ones, last layers that attend over an earlier layer's keys and
    /// values, weightless value norms, unit attention scale, a scale on each layer's output.
    Gemma4,
    /// BERT encoders (bge, MiniLM, e5 and the like: embedding models): every position attends to
    /// every other, learned absolute positions, LayerNorms after each residual add, an ungated
    /// GELU feed-forward, biases everywhere, no output head.
    Bert,
    /// nomic-bert (nomic-embed-text v1/v1.5): BERT's post-LN encoder with NeoX RoPE (base 1000)
    /// instead of learned positions, q/k/v in one tensor, a SwiGLU feed-forward, no biases.
    NomicBert,
}

/// The shape of one attention layer's heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Dimensions of each head that rotate.
    pub rope_dim: usize,
}

impl AttentionShape {
    /// Width of one position's keys (or values).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// What mixes positions in a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Attention,
    /// Gated DeltaNet: a fixed-size state per head, updated by the gated delta rule.
    DeltaNet,
    /// A gated short convolution: the last few inputs.
    ShortConv,
    /// Mamba-2: a fixed-size state per head, a selective state-space scan.
    Mamba2,
}

/// Mamba-2's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mamba2Config {
    pub d_inner: usize,
    pub n_heads: usize,
    pub n_groups: usize,
    pub d_state: usize,
    pub conv_kernel: usize,
}

impl Mamba2Config {
    pub fn head_dim(&self) -> usize {
        self.d_inner / self.n_heads
    }

    /// Channels of the convolution: `x`, then each group's `B` and `C`.
    pub fn conv_channels(&self) -> usize {
        self.d_inner + 2 * self.n_groups * self.d_state
    }

    /// Rows of the input projection: `z`, the convolution's channels, one `dt` per head.
    pub fn in_proj_rows(&self) -> usize {
        self.d_inner + self.conv_channels() + self.n_heads
    }
}

/// Gated DeltaNet's shape (Qwen3.5's linear-attention layers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetConfig {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
    pub conv_kernel: usize,
}

impl DeltaNetConfig {
    /// Channels of the convolution: queries, keys and values.
    pub fn conv_channels(&self) -> usize {
        2 * self.n_k_heads * self.d_k + self.n_v_heads * self.d_v
    }
}

impl Architecture {
    /// Every architecture rill runs, by its GGUF name.
    pub const ALL: [Architecture; 19] = [
        Architecture::Llama,
        Architecture::Gemma2,
        Architecture::Gemma3,
        Architecture::Qwen2,
        Architecture::Qwen3,
        Architecture::Olmo2,
        Architecture::Smollm3,
        Architecture::Granite,
        Architecture::Qwen3Moe,
        Architecture::GptOss,
        Architecture::Phi3,
        Architecture::Qwen35,
        Architecture::Qwen35Moe,
        Architecture::Lfm2,
        Architecture::Lfm2Moe,
        Architecture::GraniteHybrid,
        Architecture::Gemma4,
        Architecture::Bert,
        Architecture::NomicBert,
    ];

    pub fn from_name(name: &str) -> Option<Architecture> {
        Architecture::ALL.into_iter().find(|a| a.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Gemma3 => "gemma3",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma2 => "gemma2",
            Architecture::Olmo2 => "olmo2",
            Architecture::Smollm3 => "smollm3",
            Architecture::Granite => "granite",
            Architecture::Qwen3Moe => "qwen3moe",
            Architecture::GptOss => "gpt-oss",
            Architecture::Phi3 => "phi3",
            Architecture::Qwen35 => "qwen35",
            Architecture::Qwen35Moe => "qwen35moe",
            Architecture::Lfm2 => "lfm2",
            Architecture::Lfm2Moe => "lfm2moe",
            Architecture::GraniteHybrid => "granitehybrid",
            Architecture::Gemma4 => "gemma4",
            Architecture::Bert => "bert",
            Architecture::NomicBert => "nomic-bert",
        }
    }

    /// The supported names, comma-separated (for error messages).
    pub fn supported_names() -> String {
        Architecture::ALL.map(Architecture::name).join(", ")
    }
}

/// A routed feed-forward: every layer's FFN is `n_experts` SwiGLU experts of `expert_ffn_dim`,
/// of which each token uses the `n_used` its router ranks highest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    pub n_used: usize,
    pub expert_ffn_dim: usize,
    pub gating: MoeGating,
    /// Biases on the router and on each expert's three projections (gpt-oss).
    pub biases: bool,
}

/// How a token's router logits become its experts' weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MoeGating {
    /// Softmax over every expert, the top `n_used`, renormalised over them when `renormalize`
    /// (Qwen3-MoE).
    SoftmaxThenTop { renormalize: bool },
    /// The top `n_used` logits, then a softmax over those alone (gpt-oss).
    TopThenSoftmax,
    /// A sigmoid of every logit; the top `n_used` by sigmoid plus the layer's selection bias
    /// (`exp_probs_b`, when the file has one); their sigmoids renormalised to sum 1, times
    /// `scale` (LFM2-MoE).
    SigmoidThenTop { scale: f32 },
}

/// Where the query and key RMSNorms apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head alone, with one `head_dim` weight shared by the heads (Gemma 3, Qwen3).
    PerHead,
    /// The whole query (`q_dim`) and key (`kv_dim`) vectors (OLMo 2).
    Whole,
}
