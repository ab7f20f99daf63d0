"""What the converter wrote: a GGUF's metadata and tensor table as JSON-able data, and the check that
every tensor holds exactly the HF checkpoint's values under the expected name, after exactly the
transformations the converter is known to apply (listed in `expected_tensors`, implemented here
independently of the converter), and nothing else. Reads with the `gguf` Python package."""

from __future__ import annotations

import re

import numpy as np

# HF parameter name (layer i) -> GGUF tensor name: the converter's TensorNameMap.
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.o_proj.bias": "attn_output.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    # gemma2 / olmo2 (post_attention_layernorm is then a post-norm: ARCH_LAYER_NAMES)
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    # phi3: fused, kept fused (q | k | v rows; gate | up rows)
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    # MoE routers
    "mlp.gate.weight": "ffn_gate_inp.weight",  # qwen3moe
    "mlp.router.weight": "ffn_gate_inp.weight",  # gpt-oss
    "mlp.router.bias": "ffn_gate_inp.bias",
    "self_attn.sinks": "attn_sinks.weight",  # gpt-oss
    # lfm2: the short-conv blocks (conv.conv: squeezed, see expected_tensors), attention with q/k
    # layernorms and out_proj, the w1 / w3 / w2 SwiGLU FFN, operator_norm = the pre-mixer norm
    "conv.conv.weight": "shortconv.conv.weight",
    "conv.in_proj.weight": "shortconv.in_proj.weight",
    "conv.out_proj.weight": "shortconv.out_proj.weight",
    "self_attn.q_layernorm.weight": "attn_q_norm.weight",
    "self_attn.k_layernorm.weight": "attn_k_norm.weight",
    "self_attn.out_proj.weight": "attn_output.weight",
    "operator_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "feed_forward.w1.weight": "ffn_gate.weight",
    "feed_forward.w3.weight": "ffn_up.weight",
    "feed_forward.w2.weight": "ffn_down.weight",
    # lfm2moe: the router of the MoE layers and its per-expert selection bias (a saved buffer, no suffix in
    # HF; the converter names it expert_bias.bias -> exp_probs_b.bias); the experts as qwen3moe's (fused
    # gate_up_proj in HF's model, per-expert w1 / w3 / w2 in the checkpoint)
    "feed_forward.gate.weight": "ffn_gate_inp.weight",
    "feed_forward.expert_bias": "exp_probs_b.bias",
    # qwen3.5 (qwen35, qwen35moe): the gated delta net (linear attention) and the shared expert
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.A_log": "ssm_a",  # no .weight suffix; stored as -exp(A_log)
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    # granitehybrid (GraniteMoeHybrid, Granite 4.0-H): the Mamba-2 mixer (A_log, D, norm reshaped, see
    # expected_tensors) and the dense FFN shared_mlp (input_linear split into gate / up)
    "mamba.in_proj.weight": "ssm_in.weight",
    "mamba.conv1d.weight": "ssm_conv1d.weight",
    "mamba.conv1d.bias": "ssm_conv1d.bias",
    "mamba.dt_bias": "ssm_dt.bias",
    "mamba.A_log": "ssm_a",  # no .weight suffix; stored as -exp(A_log), shape [n_head, 1]
    "mamba.D": "ssm_d",  # no .weight suffix; shape [n_head, 1]
    "mamba.norm.weight": "ssm_norm.weight",
    "mamba.out_proj.weight": "ssm_out.weight",
    "shared_mlp.output_linear.weight": "ffn_down.weight",
    # gemma4: the per-layer input (PLE) gate / projection / post norm of each layer, and its output scalar
    # (a saved buffer; the converter appends .weight)
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
    # gemma4's MoE (26B-A4B): the router (its input scale and per-expert output scale as the scales of
    # ffn_gate_inp and ffn_down_exps), the dense MLP's output norm and the experts' input / output norms
    "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale",
    "router.per_expert_scale": "ffn_down_exps.scale",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
}
# post_attention_layernorm: the pre-FFN norm (ffn_norm) in llama-style blocks; gemma2's and olmo2's
# post-attention norm, and gpt-oss's pre-FFN norm, are named post_attention_norm
ARCH_LAYER_NAMES = {
    "gemma2": {"post_attention_layernorm.weight": "post_attention_norm.weight"},
    "gemma3_text": {"post_attention_layernorm.weight": "post_attention_norm.weight"},
    "olmo2": {"post_attention_layernorm.weight": "post_attention_norm.weight"},
    "gpt_oss": {"post_attention_layernorm.weight": "post_attention_norm.weight"},
    # qwen3.5: the pre-FFN norm, named post_attention_norm as gpt-oss's
    "qwen3_5_text": {"post_attention_layernorm.weight": "post_attention_norm.weight"},
    "qwen3_5_moe_text": {"post_attention_layernorm.weight": "post_attention_norm.weight"},
    "gemma4_text": {"post_attention_layernorm.weight": "post_attention_norm.weight"},
}
GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.embedding_norm.weight": "token_embd_norm.weight",  # lfm2's final norm (after the last layer)
    # gemma4's per-layer input embeddings (PLE): the packed token table [vocab, n_layer x n_pl], the
    # projection of the main embedding [n_layer x n_pl, d] and its per-slice RMSNorm [n_pl]
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
# the converter permutes q/k rows for these (LlamaModel.undo_permute) so that llama.cpp's interleaved
# ("NORM") rope applies
PERMUTED_QK = {"llama", "smollm3", "granite", "granitemoehybrid"}
# Qwen3.5's RMSNorms multiply by (1 + w) (the converter stores w + 1), except the gated norm inside the
# linear attention (a plain w)
QWEN35 = {"qwen3_5_text", "qwen3_5_moe_text"}
# fused experts gate_up_proj [E, 2F, D] (rows :F gate, F: up) and down_proj [E, D, F]
QWEN_MOE = {"qwen3_moe", "qwen3_5_moe_text"}
GATE_UP_MOE = QWEN_MOE | {"lfm2_moe"}  # the same expert layout (lfm2moe's under feed_forward.experts)
# lfm2's short-conv layers (conv.conv.weight [D, 1, L] squeezed to [D, L])
LFM2 = {"lfm2", "lfm2_moe"}
LONG_ARRAY = 8  # arrays longer than this are summarized


def gguf_name(hf_name: str, model_type: str = "") -> str:
    if hf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[hf_name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
    names = {**LAYER_NAMES, **ARCH_LAYER_NAMES.get(model_type, {})}
    if not m or m.group(2) not in names:
        raise KeyError(hf_name)
    return f"blk.{m.group(1)}.{names[m.group(2)]}"


def rope_permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate_half layout -> llama.cpp's interleaved pairs: within each head of head_dim rows,
    row 2i becomes HF row i and row 2i+1 HF row i + head_dim/2 (the converter's LlamaModel.permute)."""
    hd = w.shape[0] // n_head
    idx = np.array([h * hd + s * (hd // 2) + i for h in range(n_head) for i in range(hd // 2)
                    for s in range(2)])
    return w[idx]


def tiled_v_heads(n_k: int, n_v: int) -> np.ndarray:
    """The converter's V-head reordering for linear attention with fewer key heads than value heads
    (_LinearAttentionVReorderBase): HF groups the value heads by key head (v-head i * r + j is the j-th
    of key head i, r = n_v / n_k); the GGUF tiles them (position j * n_k + i), so that GGUF v-head h
    uses key head h % n_k. Returns, for each GGUF position, the HF v-head index."""
    r = n_v // n_k
    return np.array([i * r + j for j in range(r) for i in range(n_k)])


def reorder_blocks(w: np.ndarray, order: np.ndarray, block: int, axis: int = 0) -> np.ndarray:
    """w with its blocks of `block` consecutive entries along `axis` put in `order`."""
    idx = (order[:, None] * block + np.arange(block)[None, :]).reshape(-1)
    return np.take(w, idx, axis=axis)


def expected_tensors(state_dict: dict, config) -> dict:
    """GGUF tensor name -> the F32 array the converter should have written, from the HF weights:
    - tied models: no output.weight (the head is token_embd.weight);
    - llama / smollm3 / granite: q and k rows permuted per head (rope_permute_rows);
    - gemma2, gemma3: every RMSNorm weight w stored as w + 1 (Gemma's (1 + w) gain);
    - qwen3moe: the experts' gate_up_proj [E, 2F, D] split into ffn_gate_exps (rows :F) and ffn_up_exps
      (rows F:), each [E, F, D]; down_proj [E, D, F] as ffn_down_exps;
    - gpt-oss: gate_up_proj [E, D, 2F] transposed to [E, 2F, D], even rows -> ffn_gate_exps, odd rows ->
      ffn_up_exps; gate_up_proj_bias [E, 2F] likewise (even / odd columns); down_proj [E, F, D]
      transposed to ffn_down_exps [E, D, F]; down_proj_bias as ffn_down_exps.bias;
    - lfm2: the short conv's depthwise kernel conv.conv.weight [D, 1, L] squeezed to [D, L]; the final
      norm model.embedding_norm as token_embd_norm (no other change);
    - lfm2moe: as lfm2; the experts as qwen3moe's (feed_forward.experts.gate_up_proj split into
      ffn_gate_exps / ffn_up_exps, down_proj as ffn_down_exps), the router feed_forward.gate as
      ffn_gate_inp, the selection bias buffer feed_forward.expert_bias [E] as exp_probs_b.bias;
    - qwen3.5 (qwen35, qwen35moe): every RMSNorm weight w stored as w + 1 except the linear attention's
      gated norm (linear_attn.norm: ssm_norm as is); A_log stored as ssm_a = -exp(A_log) (float32, torch's
      exp); dt_bias as ssm_dt.bias; conv1d.weight [C, 1, K] squeezed to [C, K]; q_proj kept fused (per
      head: head_dim query rows, then head_dim gate rows); the value heads of the linear attention
      reordered from grouped to tiled (tiled_v_heads) in the v rows of in_proj_qkv and conv1d (after the
      2 x n_k x head_k_dim q and k rows), the rows of in_proj_z (blocks of head_v_dim), in_proj_a /
      in_proj_b / A_log / dt_bias (one per head), and the columns of out_proj (blocks of head_v_dim);
      the MoE experts as qwen3moe's;
    - granitehybrid (GraniteMoeHybrid, dense): q/k rows permuted as llama's (the converter's LlamaModel
      permutation, although the model has no rope); the dense FFN shared_mlp.input_linear [2F, D] split
      into ffn_gate (rows :F) and ffn_up (rows F:), output_linear as ffn_down; the Mamba-2 mixer:
      in_proj as ssm_in (z | xBC | dt rows, unchanged), conv1d.weight [C, 1, K] squeezed to [C, K],
      conv1d.bias as ssm_conv1d.bias, dt_bias as ssm_dt.bias, A_log as ssm_a = -exp(A_log) reshaped to
      [n_head, 1] (float32, torch's exp), D as ssm_d reshaped to [n_head, 1], norm.weight [d_inner] as
      ssm_norm.weight reshaped to [n_group, d_inner / n_group], out_proj as ssm_out;
    - gemma4: nothing (its RMSNorms are plain w gains: no + 1; the KV-shared layers have no k_proj /
      v_proj / k_norm in the checkpoint, so none in the GGUF; the v norm has no weight); the PLE tensors
      as they are (per_layer_token_embd [vocab, n_layer x n_pl], per_layer_model_proj, per_layer_proj_norm,
      per layer inp_gate / proj / post_norm); layer_scalar [1] as layer_output_scale.weight.
    The rope factor tensors the converter computes (rope_freqs, rope_factors_*) are checked separately."""
    mt = config.model_type
    tied = bool(config.tie_word_embeddings)
    n_head = config.num_attention_heads
    # (only the permuted models' count is read: Gemma 4's may differ by layer)
    n_kv = config.num_key_value_heads if mt in PERMUTED_QK else None
    if mt in QWEN35:
        lin_nk, lin_nv = config.linear_num_key_heads, config.linear_num_value_heads
        lin_kd, lin_vd = config.linear_key_head_dim, config.linear_value_head_dim
        v_order = tiled_v_heads(lin_nk, lin_nv)
        qk_rows = 2 * lin_nk * lin_kd
    want = {}
    for hf_name, value in state_dict.items():
        w = value.detach().cpu().numpy().astype(np.float32)
        if hf_name == "lm_head.weight" and tied:
            continue
        m = re.fullmatch(r"model\.layers\.(\d+)\.(?:mlp\.|feed_forward\.|)experts\.(\w+)", hf_name)
        if m:
            blk, part = f"blk.{m.group(1)}.", m.group(2)
            if mt in GATE_UP_MOE and part == "gate_up_proj":
                f = w.shape[1] // 2
                want[blk + "ffn_gate_exps.weight"] = w[:, :f, :]
                want[blk + "ffn_up_exps.weight"] = w[:, f:, :]
            elif mt == "gemma4_text" and part == "gate_up_proj":  # kept fused (gate rows first)
                want[blk + "ffn_gate_up_exps.weight"] = w
            elif mt in GATE_UP_MOE | {"gemma4_text"} and part == "down_proj":
                want[blk + "ffn_down_exps.weight"] = w
            elif mt == "gpt_oss" and part == "gate_up_proj":
                t = w.transpose(0, 2, 1)
                want[blk + "ffn_gate_exps.weight"] = t[:, 0::2, :]
                want[blk + "ffn_up_exps.weight"] = t[:, 1::2, :]
            elif mt == "gpt_oss" and part == "gate_up_proj_bias":
                want[blk + "ffn_gate_exps.bias"] = w[:, 0::2]
                want[blk + "ffn_up_exps.bias"] = w[:, 1::2]
            elif mt == "gpt_oss" and part == "down_proj":
                want[blk + "ffn_down_exps.weight"] = w.transpose(0, 2, 1)
            elif mt == "gpt_oss" and part == "down_proj_bias":
                want[blk + "ffn_down_exps.bias"] = w
            else:
                raise KeyError(hf_name)
            continue
        if mt == "granitemoehybrid" and hf_name.endswith(".shared_mlp.input_linear.weight"):
            blk = "blk." + hf_name.split(".")[2] + "."
            f = w.shape[0] // 2
            assert f == config.shared_intermediate_size and not config.num_local_experts, (w.shape, config)
            want[blk + "ffn_gate.weight"], want[blk + "ffn_up.weight"] = w[:f], w[f:]
            continue
        name = gguf_name(hf_name, mt)
        if mt in PERMUTED_QK and name.endswith(("attn_q.weight", "attn_q.bias")):
            w = rope_permute_rows(w, n_head)
        elif mt in PERMUTED_QK and name.endswith(("attn_k.weight", "attn_k.bias")):
            w = rope_permute_rows(w, n_kv)
        if mt in ("gemma2", "gemma3_text") and "norm" in hf_name:
            w = w + np.float32(1)
        if mt in LFM2 and hf_name.endswith(".conv.conv.weight"):
            assert w.shape[1] == 1, w.shape
            w = w[:, 0, :]
        if mt == "granitemoehybrid" and ".mamba." in hf_name:
            part = hf_name.rsplit("mamba.", 1)[-1]
            if part == "conv1d.weight":
                assert w.shape[1] == 1, w.shape
                w = w[:, 0, :]
            elif part == "A_log":
                import torch  # the converter's (and HF's forward's) float32 torch.exp

                w = (-torch.exp(torch.from_numpy(w))).numpy().reshape(-1, 1)
            elif part == "D":
                w = w.reshape(-1, 1)
            elif part == "norm.weight":
                n_group = config.mamba_n_groups
                w = w.reshape(n_group, w.shape[0] // n_group)
        if mt in QWEN35:
            part = hf_name.rsplit("linear_attn.", 1)[-1] if ".linear_attn." in hf_name else None
            if "norm" in hf_name and part != "norm.weight":
                w = w + np.float32(1)
            if part == "A_log":
                import torch  # the stored value is torch's float32 exp, which HF's forward uses

                w = (-torch.exp(torch.from_numpy(w))).numpy()
            if part == "conv1d.weight":
                assert w.shape[1] == 1, w.shape
                w = w[:, 0, :]
            if lin_nv != lin_nk:
                if part in ("in_proj_qkv.weight", "conv1d.weight"):
                    w = np.concatenate([w[:qk_rows], reorder_blocks(w[qk_rows:], v_order, lin_vd)])
                elif part == "in_proj_z.weight":
                    w = reorder_blocks(w, v_order, lin_vd)
                elif part in ("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias"):
                    w = reorder_blocks(w, v_order, 1)
                elif part == "out_proj.weight":
                    w = reorder_blocks(w, v_order, lin_vd, axis=1)
        want[name] = w
    return want


def exact_log_neg(a: np.ndarray) -> np.ndarray:
    """A float32 x with -exp(x) == a bit for bit (torch's float32 exp over the whole array, as HF's
    forward and the converter compute it): log(-a), each entry whose exp rounds to a neighbour of -a
    moved by 1, -1, 2, -2, ... ulps until it does not."""
    import torch

    a = np.ascontiguousarray(a, dtype=np.float32)
    x0 = torch.log(-torch.from_numpy(a)).numpy().copy()
    x = x0.copy()

    def wrong():
        return (-torch.exp(torch.from_numpy(x))).numpy().view(np.uint32) != a.view(np.uint32)

    for k in range(1, 33):
        bad = wrong()
        if not bad.any():
            return x
        steps, direction = (k + 1) // 2, np.float32(np.inf if k % 2 else -np.inf)
        cand = x0[bad]
        for _ in range(steps):
            cand = np.nextafter(cand, direction)
        x[bad] = cand
    assert not wrong().any(), a
    return x


def hf_from_gguf(arrays: dict, config, hf_names) -> dict:
    """The inverse of `expected_tensors` for the architectures whose quantized files are made
    (tools/models/quantize_tiny.py): qwen35 (dense), lfm2 and gemma4 (every tensor as it is).
    `arrays`: GGUF tensor name -> float32
    array (row-major, ne reversed); `hf_names`: the HF model's parameter names. Returns HF name ->
    float32 array such that `expected_tensors` of it gives `arrays` back bit for bit (checked by the
    caller): the value heads back from tiled to grouped order, conv kernels unsqueezed, ssm_a back to
    A_log (`exact_log_neg`), Qwen3.5's (1 + w) norms minus 1 (exact: g - 1 is exact in float32 for the
    gains here, and 1 + (g - 1) == g is checked). A tied model's lm_head is the token embedding."""
    mt = config.model_type
    if mt not in QWEN35 | {"lfm2", "gemma4_text"} or mt in QWEN_MOE:
        raise NotImplementedError(mt)
    tied = bool(config.tie_word_embeddings)
    if mt in QWEN35:
        lin_nk, lin_nv = config.linear_num_key_heads, config.linear_num_value_heads
        lin_vd = config.linear_value_head_dim
        back = np.argsort(tiled_v_heads(lin_nk, lin_nv))  # GGUF order -> HF order
        qk_rows = 2 * lin_nk * config.linear_key_head_dim
    out = {}
    for hf_name in hf_names:
        if hf_name == "lm_head.weight" and tied:
            continue
        w = np.array(arrays[gguf_name(hf_name, mt)], dtype=np.float32)
        if mt == "lfm2" and hf_name.endswith(".conv.conv.weight"):
            w = w[:, None, :]
        if mt in QWEN35:
            part = hf_name.rsplit("linear_attn.", 1)[-1] if ".linear_attn." in hf_name else None
            if lin_nv != lin_nk:
                if part in ("in_proj_qkv.weight", "conv1d.weight"):
                    w = np.concatenate([w[:qk_rows], reorder_blocks(w[qk_rows:], back, lin_vd)])
                elif part == "in_proj_z.weight":
                    w = reorder_blocks(w, back, lin_vd)
                elif part in ("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias"):
                    w = reorder_blocks(w, back, 1)
                elif part == "out_proj.weight":
                    w = reorder_blocks(w, back, lin_vd, axis=1)
            if part == "conv1d.weight":
                w = w[:, None, :]
            if part == "A_log":
                w = exact_log_neg(w)
            if "norm" in hf_name and part != "norm.weight":
                w = w - np.float32(1)
        out[hf_name] = np.ascontiguousarray(w)
    if tied and "lm_head.weight" in hf_names:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


def expected_rope_tensors(config, inv_freq_default: np.ndarray) -> dict:
    """The rope factor tensors the converter computes from the config, as HF sees them:
    - llama3 rope: rope_freqs.weight[j] = default inv_freq[j] / HF's scaled inv_freq[j] (llama.cpp
      divides each rope frequency by it), compared to 1e-6 relative;
    - longrope: rope_factors_long / rope_factors_short.weight = the config's lists (exact, f32);
    - gemma4 (per layer type; `inv_freq_default` is HF's full_attention inv_freq): the full layers'
      proportional rope as rope_freqs.weight [global_head_dim / 2] = 1 for the first
      int(partial_rotary_factor x global_head_dim / 2) frequencies, 1e30 for the rest (unrotated: HF's
      inv_freq 0 there), checked against HF's inv_freq with the exponent over the whole global head."""
    rp = config.rope_parameters
    out = {}
    if config.model_type == "gemma4_text":
        full = rp["full_attention"]
        assert full["rope_type"] == "proportional", full
        half = len(inv_freq_default)
        n_rotated = int(full["partial_rotary_factor"] * 2 * half // 2)
        want = np.array([1.0] * n_rotated + [1e30] * (half - n_rotated), dtype=np.float32)
        out["rope_freqs.weight"] = ("gemma4_proportional", (want, inv_freq_default, float(full["rope_theta"])))
        return out
    if rp.get("rope_type") == "llama3":
        out["rope_freqs.weight"] = ("approx", inv_freq_default)
    if rp.get("rope_type") == "longrope":
        out["rope_factors_long.weight"] = ("exact", np.array(rp["long_factor"], dtype=np.float32))
        out["rope_factors_short.weight"] = ("exact", np.array(rp["short_factor"], dtype=np.float32))
    return out


def _plain(x):
    if isinstance(x, (np.floating, float)):
        return float(x)
    if isinstance(x, (np.integer, int)) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    return x


def metadata(reader) -> dict:
    """key -> {"type", "value"}; long arrays become {"type", "len", "first", "last"}."""
    from gguf import GGUFValueType

    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        types = [t.name for t in field.types]
        value = _plain(field.contents())
        if field.types[0] == GGUFValueType.ARRAY:
            type_name = f"ARRAY[{types[-1]}]"
            if len(value) > LONG_ARRAY:
                out[name] = {"type": type_name, "len": len(value), "first": value[:4], "last": value[-3:]}
                continue
        else:
            type_name = types[0]
        out[name] = {"type": type_name, "value": value}
    return out


def tensors(reader) -> list[dict]:
    """In file order: name, ggml type, `ne` (ggml order, fastest dimension first) and the row-major
    (numpy / PyTorch) shape, which is `ne` reversed."""
    return [
        {
            "name": t.name,
            "type": t.tensor_type.name,
            "ne": [int(x) for x in t.shape],
            "torch_shape": list(t.data.shape),
        }
        for t in reader.tensors
    ]


def check_against_hf(reader, state_dict: dict, config, hf_inv_freq=None) -> None:
    """Every HF parameter is in the GGUF under its mapped name with the expected shape and bits
    (`expected_tensors`), the rope factor tensors match (`expected_rope_tensors`; `hf_inv_freq`: HF's
    scaled inv_freq, for llama3), and the GGUF has nothing else. All tensors F32."""
    got = {t.name: t for t in reader.tensors}
    want = expected_tensors(state_dict, config)
    rope = {}
    if hf_inv_freq is not None:
        rope = expected_rope_tensors(config, hf_inv_freq)
    assert set(got) == set(want) | set(rope), (sorted(set(got) - set(want) - set(rope)),
                                               sorted((set(want) | set(rope)) - set(got)))
    for name, t in got.items():
        assert t.tensor_type.name == "F32", (name, t.tensor_type.name)
    for name, w in want.items():
        data = np.asarray(got[name].data)
        assert data.shape == w.shape, (name, data.shape, w.shape)
        assert np.array_equal(data.view(np.uint32), np.ascontiguousarray(w).view(np.uint32)), name
    if config.model_type == "lfm2_moe":
        check_lfm2moe_metadata(reader, state_dict, config)
    for name, (kind, w) in rope.items():
        data = np.asarray(got[name].data)
        if kind == "exact":
            assert np.array_equal(data, w), (name, data, w)
        elif kind == "gemma4_proportional":
            want, hf_inv, theta = w
            assert np.array_equal(data, want), (name, data, want)
            # llama.cpp: NEOX rope over the whole global head (n_rot = global_head_dim), frequency j =
            # theta^(-2j / n_rot) / rope_freqs[j]; HF: theta^(-2j / head_dim) for the rotated pairs, 0 after
            hd = 2 * len(hf_inv)
            freq = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd) / data.astype(np.float64)
            rotated = want == 1
            assert np.allclose(freq[rotated], hf_inv[rotated], rtol=1e-6, atol=0), (name, freq, hf_inv)
            assert np.all(hf_inv[~rotated] == 0) and np.all(freq[~rotated] < 1e-29), (name, freq, hf_inv)
        else:  # rope_freqs: default inv_freq / factor must give HF's inv_freq
            default = default_inv_freq(config)
            assert data.shape == w.shape, (name, data.shape, w.shape)
            assert np.allclose(default / data.astype(np.float64), w, rtol=1e-6, atol=0), (name, data)


def check_lfm2moe_metadata(reader, state_dict: dict, config) -> None:
    """lfm2moe: the FFN / MoE keys the converter writes agree with the HF model: feed_forward_length = the
    dense layers' width (HF's Lfm2MoeMLP is intermediate_size wide: Lfm2MoeConfig has no
    block_auto_adjust_ff_dim, unlike lfm2's), leading_dense_block_count = num_dense_layers (and exactly those
    layers have a dense FFN), expert counts and width, expert_gating_func = 2 (sigmoid), head_count_kv 0 on
    the conv layers. Neither norm_topk_prob nor routed_scaling_factor has a key: the spec keeps HF's (and
    the real model's) values True / 1.0, which are llama.cpp's fixed behaviour for lfm2moe."""
    meta = {k: f.contents() for k, f in reader.fields.items()}
    a = "lfm2moe"
    assert meta["general.architecture"] == a, meta["general.architecture"]
    n_dense = int(config.num_dense_layers)
    dense = sorted({int(k.split(".")[2]) for k in state_dict if k.endswith("feed_forward.w1.weight")})
    assert dense == list(range(n_dense)), (dense, n_dense)
    widths = {tuple(state_dict[f"model.layers.{il}.feed_forward.w1.weight"].shape)[0] for il in dense}
    assert widths == {int(meta[f"{a}.feed_forward_length"])}, (widths, meta[f"{a}.feed_forward_length"])
    assert int(meta[f"{a}.leading_dense_block_count"]) == n_dense
    assert int(meta[f"{a}.expert_count"]) == config.num_experts
    assert int(meta[f"{a}.expert_used_count"]) == config.num_experts_per_tok
    assert int(meta[f"{a}.expert_feed_forward_length"]) == config.moe_intermediate_size
    assert int(meta[f"{a}.expert_gating_func"]) == 2  # llama.cpp LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
    kv = [int(x) for x in meta[f"{a}.attention.head_count_kv"]]
    assert kv == [config.num_key_value_heads if t == "full_attention" else 0 for t in config.layer_types], kv
    assert config.use_expert_bias and config.norm_topk_prob and config.routed_scaling_factor == 1.0, config
    assert f"{a}.expert_weights_scale" not in meta and f"{a}.expert_weights_norm" not in meta


def default_inv_freq(config) -> np.ndarray:
    """theta^(-2j/d), j < d/2, d = the rotated dims (head_dim x partial_rotary_factor), in float64."""
    rp = config.rope_parameters
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    d = int(head_dim * rp.get("partial_rotary_factor", 1.0))
    return 1.0 / float(rp["rope_theta"]) ** (np.arange(0, d, 2, dtype=np.float64) / d)
