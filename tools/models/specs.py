"""The tiny model specs and how their random weights are made.

Every spec is an HF transformers config (the classes' own defaults for everything not named here) and
a seed. The weights are HF's own initialization (normal, std `initializer_range`) followed by
`randomize_extras`, which makes the parts HF initializes to constants (q/k/v biases: 0, RMSNorm
weights: 1) random too, so that a loader that drops them, or applies them in the wrong place, fails."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenizer import SPECIAL_TOKENS, VOCAB_SIZE

EOS_ID = VOCAB_SIZE - len(SPECIAL_TOKENS)  # <|endoftext|>

COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_act="silu",
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    initializer_range=0.2,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    bos_token_id=None,
    eos_token_id=EOS_ID,
    pad_token_id=EOS_ID,
    use_cache=True,
)


QWEN35 = dict(
    num_hidden_layers=4,
    # full attention every 4th layer, as in the real Qwen3.5 models (full_attention_interval 4)
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    head_dim=16,
    attention_bias=False,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    # as the real configs: partial rotary 0.25 (4 of 16 head dims), theta 1e7, text-only interleaved MRoPE
    # sections (all three position components equal for text: plain NEOX rope on the rotated dims)
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
)


# Gemma 4 E2B / E4B's text features at tiny scale: sliding / full layers with different head dims, the last
# three layers KV-shared (the last non-shared layer full and the one before it sliding, as in E2B / E4B, so
# that HF's rule (last non-shared layer of the same type) and llama.cpp's (n_layer_kv_from_start - 2 / - 1)
# agree), per-layer input embeddings, double-wide MLP on the shared layers (E2B), proportional rope on the
# full layers (partial 0.25 of the 32-dim global head)
GEMMA4 = dict(
    num_hidden_layers=6,
    layer_types=["sliding_attention", "sliding_attention", "full_attention",
                 "sliding_attention", "sliding_attention", "full_attention"],
    head_dim=16,
    global_head_dim=32,
    hidden_activation="gelu_pytorch_tanh",
    sliding_window=16,
    num_kv_shared_layers=3,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=VOCAB_SIZE,
    use_double_wide_mlp=True,
    attention_k_eq_v=False,
    final_logit_softcapping=30.0,  # E2B / E4B's
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                     "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 1_000_000.0}},
)


# Granite 4.0-H's layer kinds (legacy spelling, as the real config.json files and the converter have it)
GRANITE_HYBRID_LAYERS = ["mamba", "mamba", "attention", "mamba"]


@dataclass(frozen=True)
class Spec:
    name: str  # output folder under tests/data/tiny/
    arch: str  # the HF class: Qwen2ForCausalLM, LlamaForCausalLM, ... (MODEL_TYPES)
    seed: int
    config: dict
    tests: str  # what the spec is there to test (README)
    # the scale of the final RMSNorm weight: how peaked the next-token distributions are
    out_norm_gain: float = 3.0
    extra: dict = field(default_factory=dict)
    # Gemma's RMSNorm multiplies by (1 + weight): the weight drawn is the effective gain minus this
    norm_offset: float = 0.0
    # the converter's vocabulary writer, where the architecture's own would need a tokenizer.model
    # (SentencePiece) that the tiny byte-level BPE tokenizer does not have: "gpt2" (see convert.py)
    vocab: str | None = None
    notes: str = ""  # anything an engine must know that the GGUF does not say (spec.json, README)
    # gpt-oss: the experts' gate_up_proj times this after HF's init, so that the SwiGLU clamp (+-7) bites
    gate_up_scale: float = 1.0
    # RMSNorm weights (name suffixes) that are plain gains even where norm_offset is set: Qwen3.5's gated
    # norm inside the linear attention (Qwen3_5RMSNormGated) multiplies by w, its other norms by 1 + w
    plain_norms: tuple = ()
    # extra convert_hf_to_gguf.py options (qwen35: --no-mtp, the tiny checkpoint has no MTP head)
    converter_args: tuple = ()
    # keys of the saved config.json replaced after save_pretrained (before conversion and the reference
    # reload): granitehybrid's layer_types in the legacy spelling real checkpoints have ("mamba" /
    # "attention"), which transformers 5 rewrites to "linear_attention" / "full_attention" when it saves
    # and maps back when it loads, and which the converter needs (it looks for "attention")
    config_json: dict = field(default_factory=dict)


SPECS = (
    Spec(
        name="qwen2-tiny",
        arch="Qwen2ForCausalLM",
        seed=20240601,
        config={**COMMON},
        tests="qwen2: q/k/v biases, GQA 4/2, head_dim 16 = d/heads, tied output (no output.weight), "
        "NEOX rope base 1e6",
    ),
    Spec(
        name="qwen2-untied",
        arch="Qwen2ForCausalLM",
        seed=20240602,
        config={**COMMON, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
                "tie_word_embeddings": False},
        tests="qwen2 with a separate output.weight, 3 layers, GQA 8/2 (4 query heads per KV head), "
        "head_dim 8",
    ),
    Spec(
        name="qwen2-q256",
        arch="Qwen2ForCausalLM",
        seed=20240610,
        config={**COMMON, "hidden_size": 256, "intermediate_size": 256, "num_attention_heads": 4,
                "num_key_value_heads": 2, "tie_word_embeddings": False, "initializer_range": 0.1},
        tests="the base of the quantized models (tools/models/quantize_tiny.py): qwen2 with every row "
        "length a multiple of 256 (d 256, FFN 256) so that every quant type applies to every matrix, "
        "GQA 4/2, head_dim 64, untied",
    ),
    Spec(
        name="qwen3-tiny",
        arch="Qwen3ForCausalLM",
        seed=20240603,
        config={**COMMON, "head_dim": 32, "attention_bias": False},
        tests="qwen3: per-head q/k RMSNorm before rope, no biases, head_dim 32 with 4 heads on d=64 "
        "(n_heads*head_dim = 128 != d_model), tied output",
    ),
    Spec(
        name="qwen2-yarn",
        arch="Qwen2ForCausalLM",
        seed=20240604,
        config={**COMMON, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1_000_000.0,
                                              "factor": 4.0, "original_max_position_embeddings": 64}},
        tests="qwen2-tiny's shape with YaRN rope scaling (factor 4, original context 64, HF defaults "
        "beta_fast 32, beta_slow 1, attention_factor 0.1*ln(4)+1 on cos/sin)",
    ),
    Spec(
        name="llama-tiny",
        arch="LlamaForCausalLM",
        seed=20240605,
        config={**COMMON, "num_hidden_layers": 3, "head_dim": 16, "tie_word_embeddings": False,
                "rope_parameters": {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 32}},
        tests="llama: q/k rows permuted by the converter (interleaved NORM rope), untied output, 3 layers, "
        "GQA 4/2, head_dim 16, Llama 3 rope scaling (factor 8, low/high freq factor 1/4, original context "
        "32, theta 1e4: rope pair 0 unscaled, pair 1 in the smooth band, pairs 2-7 divided by 8) written "
        "as rope_freqs.weight",
    ),
    Spec(
        name="gemma2-tiny",
        arch="Gemma2ForCausalLM",
        seed=20240606,
        config={**COMMON, "num_hidden_layers": 4, "head_dim": 32, "hidden_activation": "gelu_pytorch_tanh",
                "hidden_act": "gelu_pytorch_tanh", "query_pre_attn_scalar": 32, "sliding_window": 16,
                "attn_logit_softcapping": 5.0, "final_logit_softcapping": 15.0,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0}},
        norm_offset=1.0,
        vocab="gpt2",
        tests="gemma2: embeddings times sqrt(64) = 8, (1 + w) RMSNorms (the converter stores 1 + w), "
        "post-attention and post-FFN norms, GELU-tanh, attention-logit soft-capping 5 and final-logit "
        "soft-capping 15, sliding window 16 on layers 0 and 2 (global 1 and 3), 4 layers, GQA 4/2, "
        "head_dim 32 on d=64 (query scale 1/sqrt(32), not 1/sqrt(d/heads) = 1/4), tied output",
        notes="query_pre_attn_scalar = head_dim = 32: the converter does not write query_pre_attn_scalar, "
        "and llama.cpp scales queries by 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) only for the 46-layer "
        "27B), so a value other than head_dim could not be reproduced from the GGUF. The sliding/global "
        "layer pattern is not in the GGUF either (llama.cpp: every 2nd layer global, from layer 1).",
    ),
    Spec(
        name="olmo2-tiny",
        arch="Olmo2ForCausalLM",
        seed=20240607,
        config={**COMMON, "num_hidden_layers": 3, "tie_word_embeddings": False,
                "rope_parameters": {"rope_type": "default", "rope_theta": 500_000.0}},
        tests="olmo2: no pre-norms; RMSNorm after attention and after the FFN, before the residual add; "
        "q/k RMSNorm over the whole projected q (64) / k (32) before splitting into heads; 3 layers, "
        "GQA 4/2, head_dim 16, untied",
    ),
    Spec(
        name="smollm3-tiny",
        arch="SmolLM3ForCausalLM",
        seed=20240608,
        config={**COMMON, "num_hidden_layers": 4, "no_rope_layer_interval": 4,
                "rope_parameters": {"rope_type": "default", "rope_theta": 2_000_000.0}},
        tests="smollm3: no RoPE on layer 3 (no_rope_layers [1, 1, 1, 0]: every 4th layer), q/k rows permuted "
        "by the converter (NORM rope), 4 layers, GQA 4/2, head_dim 16, tied output",
        notes="The GGUF does not say which layers skip RoPE: llama.cpp hard-codes n_no_rope_layer_step = 4 "
        "for smollm3 (layer il uses rope iff (il + 1) % 4 != 0), which is HF's default no_rope_layers.",
    ),
    Spec(
        name="granite-tiny",
        arch="GraniteForCausalLM",
        seed=20240609,
        config={**COMMON, "tie_word_embeddings": False, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                "attention_multiplier": 0.0625, "logits_scaling": 8.0,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0}},
        out_norm_gain=24.0,
        tests="granite: embeddings times 12 (embedding_scale), each attention / FFN output times 0.22 "
        "before its residual add (residual_scale), attention scores q.k times 0.0625 = 1/head_dim instead "
        "of 1/sqrt(16) (attention.scale), logits divided by 8 (logit_scale); q/k rows permuted (NORM "
        "rope); 2 layers, GQA 4/2, head_dim 16, untied (tied, the x12 embedding dominates the residual "
        "stream and every position predicts its own token); final-norm gain 24 = 3 x 8",
    ),
    Spec(
        name="phi3-tiny",
        arch="Phi3ForCausalLM",
        seed=20240610,
        config={**COMMON, "tie_word_embeddings": False, "original_max_position_embeddings": 32,
                "rope_parameters": {"rope_type": "longrope", "rope_theta": 10_000.0,
                                    "partial_rotary_factor": 0.5,
                                    "original_max_position_embeddings": 32,
                                    "short_factor": [1.0, 1.25, 1.5, 2.0],
                                    "long_factor": [1.0, 3.0, 6.0, 12.0]},
                "sliding_window": None},
        vocab="gpt2",
        tests="phi3: fused qkv_proj (attn_qkv: q 64 | k 32 | v 32 rows) and gate_up_proj (ffn_up: gate 128 | "
        "up 128 rows), partial rotary (first 8 of 16 head dims, NEOX pairs (j, j+4)), LongRoPE (short / "
        "long factors, original context 32, attention factor sqrt(1 + ln 8 / ln 32) on cos and sin), "
        "2 layers, GQA 4/2, untied",
        notes="HF picks the LongRoPE factors per forward call: long iff the call's largest position + 1 > 32 "
        "(original_max_position_embeddings), for every position of that call; keys already cached keep "
        "the factors they were rotated with. So: len1 uses short factors throughout (positions 0-31); "
        "len33 and len70 long throughout (the prompt already exceeds 32); len7's prompt and first 25 "
        "greedy steps (positions 0-31) use short factors, its later 7 steps (positions 32-37) long ones "
        "(with the cached keys of positions 0-31 still short-rotated). llama.cpp instead picks once per "
        "context: long iff the context size n_ctx > 32.",
    ),
    Spec(
        name="qwen3moe-tiny",
        arch="Qwen3MoeForCausalLM",
        seed=20240611,
        config={**COMMON, "head_dim": 16, "tie_word_embeddings": False, "num_experts": 8,
                "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
                "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False},
        tests="qwen3moe: 8 experts (FFN 32 each), top-2 of the softmax over all 8 router logits, the 2 "
        "weights renormalized to sum 1 (norm_topk_prob), SiLU-gated experts, no shared expert; per-head q/k "
        "RMSNorm; 2 layers, GQA 4/2, head_dim 16, untied",
        notes="norm_topk_prob is not in the GGUF: llama.cpp always renormalizes the top-k weights for "
        "qwen3moe.",
    ),
    Spec(
        name="gptoss-tiny",
        arch="GptOssForCausalLM",
        seed=20240612,
        config={**COMMON, "head_dim": 16, "tie_word_embeddings": False, "num_local_experts": 4,
                "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": 16,
                "attention_bias": True, "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 150_000.0, "factor": 8.0,
                                    "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "truncate": False}},
        gate_up_scale=4.0,
        tests="gpt-oss: attention sinks (one logit per head in the softmax denominator), sliding window 16 "
        "on layer 0 (global layer 1), q/k/v/o biases, 4 experts top-2 (softmax over the 2 chosen router "
        "logits, router bias), clamped SwiGLU experts with biases (gate <= 7, -7 <= up <= 7, "
        "(up + 1) * gate * sigmoid(1.702 gate); gate_up_proj drawn 4x larger so that the clamps bite), "
        "YaRN (factor 8, original context 32, theta 1.5e5, beta_fast 32, beta_slow 1, HF truncate=False), "
        "2 layers, GQA 4/2, head_dim 16, untied",
        notes="YaRN truncate=False (HF's GptOssConfig default) is not in the GGUF: HF then uses the "
        "un-rounded correction range; llama.cpp's ggml_rope_yarn_corr_dims always floors/ceils it.",
    ),
    Spec(
        name="phi3-plain-rope",
        arch="Phi3ForCausalLM",
        seed=20240613,
        config={**COMMON, "tie_word_embeddings": False, "original_max_position_embeddings": 256,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0,
                                    "partial_rotary_factor": 0.5},
                "sliding_window": None},
        vocab="gpt2",
        tests="phi3 without rope scaling (Phi-3-mini-4k-instruct's kind): plain RoPE on the first 8 of 16 "
        "head dims, no rope factor tensors in the GGUF (the converter writes them only for LongRoPE), "
        "fused qkv and gate_up, 2 layers, GQA 4/2, untied",
    ),
    Spec(
        name="gemma3-27b-shape",
        arch="Gemma3ForCausalLM",
        seed=20240614,
        config={**COMMON, "num_hidden_layers": 62, "hidden_size": 32, "intermediate_size": 32,
                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                "hidden_activation": "gelu_pytorch_tanh",
                "hidden_act": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16, "sliding_window": 16,
                "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                for i in range(62)],
                "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                                    "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}},
                "initializer_range": 0.1},
        out_norm_gain=8.0,
        norm_offset=1.0,
        vocab="gpt2",
        tests="gemma3 at the 27B's query scale: 62 layers (the layer count llama.cpp knows the 27B by), "
        "queries scaled by 1/sqrt(query_pre_attn_scalar) = 1/sqrt(d_model / n_heads) = 1/4, not "
        "1/sqrt(head_dim 8); (1 + w) norms, q/k norms, post norms, GELU-tanh, embeddings times "
        "sqrt(32), sliding window 16 on five layers of six (local rope base 1e4, global 1e6), d_model 32, "
        "2 query heads on 1 KV head, FFN 32, tied",
        notes="query_pre_attn_scalar is not in the GGUF: llama.cpp uses 1/sqrt(n_embd / n_head) for the "
        "62-layer gemma3 (its 27B) and 1/sqrt(head_dim) for every other layer count.",
    ),
    Spec(
        name="lfm2-tiny",
        arch="Lfm2ForCausalLM",
        seed=20240615,
        config={**{k: v for k, v in COMMON.items() if k not in ("rms_norm_eps", "hidden_act")},
                "norm_eps": 1e-6, "num_hidden_layers": 4,
                "layer_types": ["conv", "conv", "full_attention", "conv"],
                "conv_L_cache": 3, "conv_bias": False,
                # the FFN size as real LFM2 configs give it: int(2 * 192 / 3) = 128, x 1.0, rounded up to a
                # multiple of 32 = 128 (HF's Lfm2MLP and the converter's _add_feed_forward_length agree)
                "intermediate_size": 192, "block_auto_adjust_ff_dim": True,
                "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 32},
        tests="lfm2: hybrid of gated short convolutions (layers 0, 1, 3: in_proj -> B, C, x; B*x through a "
        "causal depthwise conv of kernel 3 (L_cache), times C, out_proj) and GQA attention (layer 2: 4/2 "
        "heads, head_dim 16, per-head q/k RMSNorm, NEOX rope 1e6); pre-norm (operator_norm, ffn_norm), "
        "SwiGLU FFN 128 (from intermediate_size 192 by block_auto_adjust_ff_dim), final norm "
        "embedding_norm, tied output",
        notes="Which layers are conv layers is said only by lfm2.attention.head_count_kv, an array with 0 for "
        "the conv layers (llama.cpp: recurrent iff n_head_kv(il) == 0). The FFN size is "
        "feed_forward_length = 128 (the adjusted one), not the HF config's intermediate_size 192. The final "
        "norm (HF model.embedding_norm, applied after the last layer, not to the embeddings) is named "
        "token_embd_norm.weight; there is no output_norm.weight. The conv kernel shortconv.conv.weight has "
        "ne [L_cache, d] (HF [d, 1, L] squeezed): tap L-1 multiplies the current token, tap 0 the token "
        "L-1 back; the conv state an engine keeps is the last L-1 = 2 values of B*x per channel. No "
        "rope.dimension_count: NEOX rope over the whole head_dim 16 (= 64 / 4 heads).",
    ),
    Spec(
        name="lfm2moe-tiny",
        arch="Lfm2MoeForCausalLM",
        seed=20240622,
        config={**{k: v for k, v in COMMON.items() if k not in ("rms_norm_eps", "hidden_act")},
                "norm_eps": 1e-6, "num_hidden_layers": 4,
                "layer_types": ["conv", "conv", "full_attention", "conv"],
                "conv_L_cache": 3, "conv_bias": False,
                # Lfm2MoeConfig has no block_auto_adjust_ff_dim: HF's dense Lfm2MoeMLP is intermediate_size wide,
                # and the converter writes intermediate_size as feed_forward_length (both 128)
                "intermediate_size": 128, "num_dense_layers": 1,
                "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                # the real LFM2-8B-A1B's values (= Lfm2MoeConfig's defaults): sigmoid router with a selection
                # bias, top-k weights renormalized, no routed scaling
                "use_expert_bias": True, "norm_topk_prob": True, "routed_scaling_factor": 1.0},
        tests="lfm2moe (LFM2-8B-A1B's kind): lfm2-tiny's hybrid mixers (gated short convs on layers 0, 1, 3, "
        "kernel 3; GQA attention on layer 2: 4/2 heads, head_dim 16, per-head q/k RMSNorm, NEOX rope 1e6) with "
        "a dense SwiGLU FFN 128 on layer 0 (num_dense_layers 1) and a sparse MoE FFN on layers 1-3: 8 experts "
        "of FFN 32, top-2, router scores sigmoid(gate . x), experts chosen by score + expert_bias (a random "
        "per-expert selection bias, N(0, 0.1): per layer it changes the chosen pair at 76-133 of the 235 "
        "routed positions (prompts and greedy steps), and every expert is chosen), weights = the chosen unbiased scores renormalized to sum 1 "
        "(norm_topk_prob), routed_scaling_factor 1; final norm embedding_norm; tied output",
        notes="Which layers are conv layers is said only by lfm2moe.attention.head_count_kv, an array with 0 for "
        "the conv layers (llama.cpp: recurrent iff n_head_kv(il) == 0); which layers are dense by "
        "lfm2moe.leading_dense_block_count = 1 (layer 0: ffn_gate / ffn_up / ffn_down of feed_forward_length "
        "128; layers 1-3: ffn_gate_inp, ffn_{gate,up,down}_exps of expert_feed_forward_length 32, "
        "exp_probs_b.bias). Routing: s = sigmoid(ffn_gate_inp . x) (lfm2moe.expert_gating_func = 2, sigmoid); "
        "the top expert_used_count = 2 experts by s + exp_probs_b.bias; their weights are s (without the "
        "bias) divided by the sum of the 2 (HF: sum + 1e-6; llama.cpp: the sum clamped to >= 6.1e-5), times "
        "routed_scaling_factor = 1. Not in the GGUF: the renormalization (norm_topk_prob; llama.cpp always "
        "renormalizes for lfm2moe) and the scaling factor (no expert_weights_scale key; llama.cpp does not read "
        "one for lfm2moe and applies none; the real LFM2-8B-A1B has 1.0). The final norm is "
        "token_embd_norm.weight (HF model.embedding_norm, after the last layer); the conv kernel as in "
        "lfm2-tiny (ne [L_cache, d], tap L-1 = the current token). No rope.dimension_count: NEOX rope over the "
        "whole head_dim 16.",
    ),
    Spec(
        name="qwen35-tiny",
        arch="Qwen3_5ForCausalLM",
        seed=20240616,
        config={**COMMON, **QWEN35},
        norm_offset=1.0,
        plain_norms=("linear_attn.norm.weight",),
        converter_args=("--no-mtp",),
        tests="qwen35 (Qwen3.5 dense, text): hybrid of gated delta-net linear attention (layers 0-2: 2 key "
        "heads / 4 value heads of dim 16, so each key head serves 2 value heads; causal depthwise conv "
        "of kernel 4 + SiLU on q|k|v, L2-normalized q/k, decay g = -exp(A_log) * softplus(a + dt_bias), "
        "beta = sigmoid(b), gated RMSNorm with SiLU(z)) and gated full attention (layer 3: 4/2 heads of "
        "head_dim 16, q_proj also giving a per-head output gate sigmoid(gate), per-head q/k RMSNorm, "
        "partial NEOX rope on 4 of 16 dims, theta 1e7); (1 + w) RMSNorms (the converter stores 1 + w, "
        "except the gated norm), SwiGLU FFN 128, tied output",
        notes="The converter reorders the linear attention's value heads from HF's grouped order (v-head "
        "i * r + j is the j-th of key head i, r = n_v / n_k = 2) to a tiled one (GGUF v-head j * n_k + i), in "
        "the v rows of attn_qkv and ssm_conv1d, the rows of attn_gate, ssm_alpha, ssm_beta, ssm_a, ssm_dt.bias "
        "and the columns of ssm_out: GGUF v-head h uses key head h % n_k, not h // r (nothing in the GGUF "
        "says so). The q/k L2-norm epsilon (HF: 1e-6) is not in the GGUF (llama.cpp uses the rms eps, equal "
        "here). rope.dimension_sections [11, 11, 10, 0] is interleaved MRoPE; for text (all position "
        "components equal) it is plain NEOX rope on the first rope.dimension_count = 4 of 16 head dims. "
        "Converted with --no-mtp because the tiny checkpoint has no MTP head; real Qwen3.5 checkpoints "
        "have one (mtp_num_hidden_layers 1) and, without --no-mtp, this converter appends it as an extra "
        "block (block_count = layers + 1, qwen35.nextn_predict_layers = 1) that the main forward must skip.",
    ),
    Spec(
        name="qwen35moe-tiny",
        arch="Qwen3_5MoeForCausalLM",
        seed=20240617,
        config={**{k: v for k, v in COMMON.items() if k != "intermediate_size"}, **QWEN35,
                "tie_word_embeddings": False, "num_experts": 8, "num_experts_per_tok": 2,
                "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32},
        norm_offset=1.0,
        plain_norms=("linear_attn.norm.weight",),
        converter_args=("--no-mtp",),
        tests="qwen35moe (Qwen3.5 MoE, text): qwen35-tiny's hybrid layers with a sparse MoE FFN on every "
        "layer: 8 experts of FFN 32, top-2 of the softmax over 8 renormalized to sum 1, plus a shared "
        "SwiGLU expert (FFN 32) scaled by sigmoid(shared_expert_gate . x); untied output",
        notes="As qwen35-tiny (value-head reordering, L2-norm epsilon, rope sections, --no-mtp). The top-k "
        "renormalization is not in the GGUF (HF's Qwen3.5 MoE router always renormalizes, as llama.cpp "
        "does for qwen35moe). No feed_forward_length key (there is no dense FFN).",
    ),
    Spec(
        name="granitehybrid-tiny",
        arch="GraniteMoeHybridForCausalLM",
        seed=20240618,
        config={**{k: v for k, v in COMMON.items() if k != "rope_parameters"}, "num_hidden_layers": 4,
                "layer_types": GRANITE_HYBRID_LAYERS, "tie_word_embeddings": False,
                # dense (Granite-4.0-H-Micro's kind): no experts, the FFN is shared_mlp (HF) of
                # shared_intermediate_size; the converter writes intermediate_size as feed_forward_length
                "num_local_experts": 0, "num_experts_per_tok": 0, "shared_intermediate_size": 128,
                "position_embedding_type": "nope",
                "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0625,
                "logits_scaling": 8.0,
                "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16,
                "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 16, "mamba_conv_bias": True,
                "mamba_proj_bias": False},
        config_json={"layer_types": GRANITE_HYBRID_LAYERS},
        out_norm_gain=24.0,
        tests="granitehybrid (Granite 4.0-H, dense): hybrid of Mamba-2 layers (0, 1, 3: in_proj -> z | xBC | dt, "
        "causal depthwise conv of kernel 4 with bias + SiLU on xBC, 8 heads of head_dim 16, 2 groups of B / C "
        "(d_state 16; head h uses group h / 4), dt = softplus(dt + dt_bias), A = -exp(A_log), D skip, gated "
        "RMSNorm of y * silu(z) per group of 64 channels, out_proj) and NoPE attention (layer 2: 4/2 heads, "
        "head_dim 16, no rope at all); Granite's scalars: embeddings x 12, residual branches x 0.22, attention "
        "scale 0.0625, logits / 8; SwiGLU FFN 128 (HF shared_mlp); untied; final-norm gain 24 = 3 x 8",
        notes="Which layers are Mamba-2 layers is said only by granitehybrid.attention.head_count_kv, an array "
        "with 0 for them (llama.cpp: recurrent iff n_head_kv(il) == 0). No rope: "
        "granitehybrid.rope.scaling.finetuned = false is llama.cpp's switch for it (the converter writes false "
        "for every GraniteMoeHybrid checkpoint with Mamba layers, whatever position_embedding_type says; "
        "rope.freq_base and rope.dimension_count are written but unused). The SSM head dim is "
        "ssm.inner_size / ssm.time_step_rank = 128 / 8; the SSM group of head h is h / (n_head / n_group) "
        "(HF's repeat_interleave, ggml_ssm_scan's g = h / (nh / ng)); the gated norm normalizes each group of "
        "inner_size / n_group = 64 channels separately (ssm_norm.weight has ne [64, 2]) with the rms eps. "
        "mamba_chunk_size (16) is HF's chunked-scan block, not in the GGUF (no effect on the math). HF clamps "
        "dt to time_step_limit (0, inf): a no-op after softplus. The saved config.json spells layer_types "
        "'mamba' / 'attention' (as real Granite 4.0-H checkpoints do): transformers 5.23 writes "
        "'linear_attention' / 'full_attention', which this converter does not recognize (it then makes every "
        "layer a Mamba layer).",
    ),
    Spec(
        name="gemma4-tiny",
        arch="Gemma4ForCausalLM",
        seed=20240621,
        config={**{k: v for k, v in COMMON.items() if k != "hidden_act"}, **GEMMA4},
        # final-norm gain 4 with E2B's soft cap 30: mean top-1 0.56 (with a cap of 15 the logits saturate at
        # +-15 and a larger gain flattens the distribution: 0.26 at gain 3, 0.16 at gain 5)
        out_norm_gain=4.0,
        vocab="gpt2",
        tests="gemma4 (Gemma 4 E2B / E4B, text): per-layer input embeddings (PLE: a second token table "
        "[512, 6 x 8] times sqrt(8), plus the main embedding projected to 6 x 8, times 1/sqrt(64), RMSNorm'd "
        "per layer slice; (sum) x 2^-0.5; each layer: gelu_tanh(gate(x)) * slice -> proj -> RMSNorm -> "
        "residual add), KV sharing (layers 3-5 compute no K/V: sliding layers 3, 4 reuse layer 1's, full "
        "layer 5 reuses layer 2's), sliding window 16 on layers 0, 1, 3, 4 (head_dim 16, NEOX rope theta "
        "1e4 on all 16 dims) and full attention on layers 2, 5 (head_dim 32, proportional rope theta 1e6 on "
        "the first 4 of 16 frequency pairs: pairs (j, j + 16), frequencies theta^(-2j/32)), per-head q/k "
        "RMSNorm and a weightless RMSNorm on v, attention scale 1 (no 1/sqrt(head_dim)), plain-w RMSNorms "
        "(Gemma4RMSNorm: no 1 + w), pre/post attention and FFN norms, GELU-tanh FFN 128 on layers 0-2 and "
        "double-wide 256 on the KV-shared layers 3-5 (use_double_wide_mlp), a per-layer output scalar "
        "(layer_scalar, multiplying the whole residual stream), embeddings x sqrt(64), final-logit "
        "soft-capping 30, 6 layers, GQA 4/2, tied output, final-norm gain 4",
        notes="Which layer each KV-shared layer reads is not in the GGUF as a list: the GGUF says "
        "attention.shared_kv_layers = 3 (the last 3 layers compute no K/V) and the sliding pattern; HF "
        "reuses the last non-shared layer of the same type (sliding -> layer 1, full -> layer 2), llama.cpp "
        "hard-codes n_layer_kv_from_start - 2 for sliding and - 1 for full layers (equal here and in "
        "E2B / E4B, whose last non-shared layer is full and the one before it sliding). Attention scale "
        "1.0 (HF self.scaling = 1.0; llama.cpp f_attention_scale = 1) is not in the GGUF. The v norm is a "
        "weightless RMSNorm (no tensor). The full layers' proportional rope is written as "
        "rope.dimension_count = 32 (the whole global head) with rope_freqs.weight = [1, 1, 1, 1, 1e30 x 12]: "
        "NEOX rope over the whole head whose frequencies 4-15 are divided by 1e30 (unrotated); the "
        "frequency exponent is over the full head_dim 32 (theta^(-2j/32)), not over the 8 rotated dims. "
        "The sliding layers' head_dim is attention.key_length_swa = 16 and their rope "
        "rope.dimension_count_swa = 16 with rope.freq_base_swa = 1e4; the full layers' key_length = 32, "
        "rope.freq_base = 1e6. The PLE scales (sqrt(8), 1/sqrt(64), 2^-0.5) and GELU-tanh on the PLE gate "
        "are hard-coded in both HF and llama.cpp. The converter's own Gemma 4 vocabulary writer wants a "
        "byte-fallback (SentencePiece-style) tokenizer.json, so the GPT-2 writer is used (convert.py "
        "--gpt2-vocab); real Gemma 4 GGUFs have tokenizer.ggml.model = gemma4.",
    ),
    Spec(
        name="gemma4moe-tiny",
        arch="Gemma4ForCausalLM",
        seed=20240623,
        config={**{k: v for k, v in COMMON.items() if k != "hidden_act"}, **GEMMA4,
                "hidden_size_per_layer_input": 0, "num_kv_shared_layers": 0, "use_double_wide_mlp": False,
                "attention_k_eq_v": True, "num_global_key_value_heads": 1, "enable_moe_block": True,
                "num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 32, "intermediate_size": 96},
        out_norm_gain=4.0,
        vocab="gpt2",
        tests="gemma4 with Gemma 4 26B-A4B's features: every layer's feed-forward a dense GELU MLP (96, its "
        "output RMSNorm'd by post_feedforward_layernorm_1) plus 2 of 8 routed GELU experts of 32 (their input "
        "pre_feedforward_layernorm_2, their output post_feedforward_layernorm_2; the router reads the residual "
        "stream itself: a weightless RMSNorm x router.scale x d^-0.5, softmax, top 2 renormalised, times "
        "per_expert_scale), the sum then post_feedforward_layernorm; keys equal to values on the global layers "
        "(attention_k_eq_v: no v_proj, V = the weightless-normed raw keys) with 1 KV head there against 2 on the "
        "sliding layers (num_global_key_value_heads); no per-layer inputs, no KV sharing; otherwise as "
        "gemma4-tiny (6 layers, sliding window 16, heads 16 / 32, proportional rope)",
        notes="The converter writes the experts' gate and up as one ffn_gate_up_exps tensor (gate rows first), "
        "router.scale as ffn_gate_inp.scale and per_expert_scale as ffn_down_exps.scale (llama.cpp scales each "
        "expert's output by it: the same as scaling its routing weight); head_count_kv as one count per layer "
        "(2 on sliding layers, 1 on global ones).",
    ),
    Spec(
        name="gemma4-q256",
        arch="Gemma4ForCausalLM",
        seed=20240622,
        config={**{k: v for k, v in COMMON.items() if k != "hidden_act"}, **GEMMA4, "hidden_size": 256,
                "num_hidden_layers": 4, "num_kv_shared_layers": 2,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                "intermediate_size": 256, "head_dim": 64, "global_head_dim": 128,
                "hidden_size_per_layer_input": 256, "initializer_range": 0.1},
        # d 256 with initializer 0.1: gain 4 saturates (mean top-1 0.9996); 0.5 keeps near-ties
        out_norm_gain=0.5,
        vocab="gpt2",
        tests="the base of the quantized gemma4 models (tools/models/quantize_tiny.py --spec gemma4-q256): "
        "gemma4-tiny's kinds of layer with every matrix's row length a multiple of 256: d 256, 4 layers "
        "(sliding, full, then the KV-shared sliding layer 2 reading layer 0 and full layer 3 reading layer 1), "
        "sliding heads of 64 and global heads of 128 (4/2 heads), per-layer inputs of 256 per layer (table "
        "[512, 4 x 256]), FFN 256 and double-wide 512 on the KV-shared layers, tied output",
        notes="As gemma4-tiny (KV sharing rule, proportional rope through rope_freqs, scale 1, v norm).",
    ),
    Spec(
        name="qwen35-q256",
        arch="Qwen3_5ForCausalLM",
        seed=20240619,
        config={**COMMON, **QWEN35, "hidden_size": 256, "intermediate_size": 512, "head_dim": 64,
                "linear_key_head_dim": 64, "linear_value_head_dim": 64, "initializer_range": 0.1},
        norm_offset=1.0,
        plain_norms=("linear_attn.norm.weight",),
        converter_args=("--no-mtp",),
        tests="the base of the quantized qwen35 models (tools/models/quantize_tiny.py --spec qwen35-q256): "
        "qwen35-tiny's hybrid (3 gated delta-net layers, full attention on layer 3) with every matrix's row "
        "length a multiple of 256 so that every quant type applies: d 256, linear attention 2 key heads / "
        "4 value heads of dim 64 (qkv 512 rows, value dim 256), conv kernel 4, gated attention 4/2 heads of "
        "head_dim 64 (q_proj 512 rows with the gate), partial NEOX rope on 16 of 64 dims, SwiGLU FFN 512, "
        "tied output",
        notes="As qwen35-tiny (value-head reordering, L2-norm epsilon, rope sections, --no-mtp).",
    ),
    Spec(
        name="lfm2-q256",
        arch="Lfm2ForCausalLM",
        seed=20240620,
        config={**{k: v for k, v in COMMON.items() if k not in ("rms_norm_eps", "hidden_act")},
                "norm_eps": 1e-6, "hidden_size": 256, "num_hidden_layers": 3,
                "layer_types": ["conv", "full_attention", "conv"], "conv_L_cache": 3, "conv_bias": False,
                # int(2 * 384 / 3) = 256, x 1.0, rounded up to a multiple of 256 = 256
                "intermediate_size": 384, "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0,
                "block_multiple_of": 256, "initializer_range": 0.1},
        tests="the base of the quantized lfm2 models (tools/models/quantize_tiny.py --spec lfm2-q256): "
        "lfm2-tiny's hybrid with every matrix's row length a multiple of 256: d 256, short-conv layers 0 "
        "and 2 (in_proj 768 rows, kernel 3), GQA attention on layer 1 (4/2 heads, head_dim 64, q/k "
        "RMSNorm), SwiGLU FFN 256 (from intermediate_size 384 by block_auto_adjust_ff_dim), tied output",
        notes="As lfm2-tiny (conv layers said by head_count_kv 0, feed_forward_length the adjusted 256, final "
        "norm token_embd_norm.weight).",
    ),
)


MODEL_TYPES = {
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "LlamaForCausalLM": "llama",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Olmo2ForCausalLM": "olmo2",
    "SmolLM3ForCausalLM": "smollm3",
    "GraniteForCausalLM": "granite",
    "Phi3ForCausalLM": "phi3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GptOssForCausalLM": "gpt_oss",
    "Lfm2ForCausalLM": "lfm2",
    "Lfm2MoeForCausalLM": "lfm2_moe",
    "Qwen3_5ForCausalLM": "qwen3_5_text",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
    "GraniteMoeHybridForCausalLM": "granitemoehybrid",
    "Gemma4ForCausalLM": "gemma4_text",
}


# the final norm, before the output head (LFM2 calls it embedding_norm)
FINAL_NORMS = ("model.norm.weight", "model.embedding_norm.weight")


def make_config(spec: Spec):
    from transformers import AutoConfig

    model_type = MODEL_TYPES[spec.arch]
    config = AutoConfig.for_model(model_type, **spec.config)
    config.architectures = [spec.arch]
    config.dtype = torch.float32
    return config


@torch.no_grad()
def randomize_extras(model, spec: Spec, gen: torch.Generator) -> None:
    """Biases ~ N(0, 0.1); every RMSNorm's gain ~ U(0.5, 1.5), the final one times out_norm_gain (the
    weight stored is the gain minus norm_offset: Gemma's and Qwen3.5's (1 + w), except `plain_norms`);
    attention sinks ~ N(0, 1); the linear attention's (Qwen3.5 gated delta net, Mamba-2) dt_bias ~ N(0, 0.5)
    and A_log ~ U(-1, 1) (HF starts them at 1 and log U(0.01, 16) / log(1..n_heads)); Mamba-2's D ~ N(0, 1)
    (HF: 1); Gemma 4's layer_scalar (a buffer, not a parameter) ~ U(0.5, 1.5) (HF: 1); LFM2-MoE's expert_bias
    (a buffer: the per-expert bias added to the sigmoid router scores to choose the experts) ~ N(0, 0.1) (HF: 0)."""
    for name, p in model.named_parameters():
        if spec.gate_up_scale != 1.0 and name.endswith("mlp.experts.gate_up_proj"):
            p.mul_(spec.gate_up_scale)
        if name.endswith(".dt_bias"):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        elif name.endswith(".A_log"):
            p.copy_(torch.rand(p.shape, generator=gen) * 2 - 1)
        elif name.endswith(".D"):  # Mamba-2's skip: HF starts it at 1
            p.copy_(torch.randn(p.shape, generator=gen))
        elif name.endswith((".bias", "_bias")):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        elif name.endswith(".sinks"):
            p.copy_(torch.randn(p.shape, generator=gen))
        elif name.endswith((".router.scale", ".router.per_expert_scale")):  # Gemma 4's router (HF: 1)
            p.copy_(0.5 + torch.rand(p.shape, generator=gen))
        elif "norm" in name:
            w = 0.5 + torch.rand(p.shape, generator=gen)
            if name in FINAL_NORMS:
                w = w * spec.out_norm_gain
            if spec.norm_offset and not name.endswith(spec.plain_norms):
                w = w - spec.norm_offset
            p.copy_(w)
    for name, b in model.named_buffers():
        if name.endswith(".layer_scalar"):  # Gemma 4's per-layer output scale (a saved buffer; HF: 1)
            b.copy_(0.5 + torch.rand(b.shape, generator=gen))
        elif name.endswith(".expert_bias"):  # LFM2-MoE's expert selection bias (a saved buffer; HF: 0)
            # std 0.1: against the sigmoid scores' spread it changes the chosen pair at a third to a half of the
            # positions while every expert stays in use (0.5 would send almost every token of a layer to one
            # expert and leave some experts unused)
            b.copy_(torch.randn(b.shape, generator=gen) * 0.1)


def build_model(spec: Spec):
    """The random model in float32 (eager attention), deterministic for the spec's seed."""
    import transformers

    torch.manual_seed(spec.seed)
    config = make_config(spec)
    config._attn_implementation = "eager"
    model = getattr(transformers, spec.arch)(config).to(torch.float32)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    randomize_extras(model, spec, gen)
    model.eval()
    return model
