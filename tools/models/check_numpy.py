"""A second, independent check of `tests/data/tiny/`: a plain numpy (float64) forward pass that reads
nothing but each `model.gguf` (its metadata and tensors, as a GGUF engine would) and compares its
prompt logits with the references transformers wrote (every position's top-1 token, and the full last
logits). It pins down the semantics an engine needs, per architecture (see README.md): the rope style
(NEOX on the converter's unpermuted q/k for qwen2/qwen3/qwen3moe/olmo2/gemma2/phi3/gpt-oss,
interleaved pairs on the permuted q/k of llama/smollm3/granite), where the norms go, q/k norms,
rope scaling (YaRN, llama3 rope_freqs, LongRoPE factors), soft-capping, sliding windows, sinks, MoE
routing (lfm2moe's sigmoid router with a selection bias), and the scalars of granite; gemma4's per-layer input embeddings, KV sharing, per-type head
dims and rope (proportional rope through rope_freqs), v norm and layer output scale; and the hybrid
models: lfm2's gated short convolutions (and lfm2moe's, with its leading dense layer and MoE layers), qwen35 / qwen35moe's gated delta-net linear attention (with the converter's tiled value-head order), gated full
attention and shared expert, granitehybrid's Mamba-2 layers (grouped B / C, grouped gated RMSNorm) and
NoPE attention with granite's scalars. A few things the GGUF does not say are taken from llama.cpp's
per-architecture rules, as an engine would hard-code them (marked "not in the GGUF").

    /root/refvenv/bin/python tools/models/check_numpy.py [--ablations] [--only NAME,...] [tests/data/tiny]

`--ablations` also reruns each model with one feature deliberately wrong (the mistakes an engine
could make) and prints how far the logits then are from the reference, to show the references catch
it. Prompt logits only (no KV cache): LongRoPE picks its factors per call, as HF does on a prompt.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader

REPO = Path(__file__).resolve().parents[2]
NORM_ROPE = {"llama", "smollm3", "granite", "granitehybrid"}  # llama.cpp LLAMA_ROPE_TYPE_NORM: interleaved pairs
QWEN35 = {"qwen35", "qwen35moe"}  # llama.cpp IMROPE: = NEOX on the rotated dims for text positions
GRANITE = {"granite", "granitehybrid"}  # embedding / residual / attention / logit scales


def load(path: Path):
    r = GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in r.tensors}
    return meta, tensors


class Model:
    def __init__(self, meta, t, ablate: str = ""):
        self.meta, self.t, self.ablate = meta, t, ablate
        a = self.arch = meta["general.architecture"]
        self.n_layer = int(meta[f"{a}.block_count"])
        self.d = int(meta[f"{a}.embedding_length"])
        self.n_head = int(meta[f"{a}.attention.head_count"])
        kv = meta[f"{a}.attention.head_count_kv"]
        # lfm2: one entry per layer, 0 for the conv layers
        self.n_kv_per_layer = [int(x) for x in kv] if isinstance(kv, list) else None
        self.n_kv = max(self.n_kv_per_layer) if self.n_kv_per_layer else int(kv)
        # qwen35 / qwen35moe: which layers are linear attention (gated delta net)
        self.recurrent = [bool(x) for x in meta.get(f"{a}.attention.recurrent_layers", [])]
        self.hd = int(meta.get(f"{a}.attention.key_length", self.d // self.n_head))
        self.n_rot = int(meta.get(f"{a}.rope.dimension_count", self.hd))
        if ablate == "rope_all_head_dims":
            self.n_rot = self.hd
        self.eps = float(meta[f"{a}.attention.layer_norm_rms_epsilon"])
        self.n_swa = int(meta.get(f"{a}.attention.sliding_window", 0))
        # gemma4: which layers are sliding-window layers (the rest full attention)
        self.gemma4_swa = [bool(x) for x in meta.get(f"{a}.attention.sliding_window_pattern", [])]

    def key(self, name, default=None):
        return self.meta.get(f"{self.arch}.{name}", default)

    # --- rope ---------------------------------------------------------------------------------
    def inv_freq(self, n: int):
        """Per rotated pair j < n_rot/2: frequency and the cos/sin scale, for a prompt of n tokens."""
        theta = float(self.key("rope.freq_base", 10_000.0))  # gemma2 writes none: llama.cpp's default
        d = self.n_rot
        inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
        scale = 1.0
        t = self.t
        if "rope_freqs.weight" in t and self.ablate != "no_rope_freqs":  # llama3: divide by factor
            inv = inv / t["rope_freqs.weight"]
        if "rope_factors_long.weight" in t:  # phi3 LongRoPE: HF's rule, per call (not in the GGUF)
            orig = int(self.key("rope.scaling.original_context_length"))
            use_long = n > orig
            if self.ablate == "longrope_other_factors":
                use_long = not use_long
            inv = inv / t["rope_factors_long.weight" if use_long else "rope_factors_short.weight"]
            scale = float(self.key("rope.scaling.attn_factor", 1.0))
        if self.key("rope.scaling.type") == "yarn" and self.ablate != "no_yarn":
            factor = float(self.key("rope.scaling.factor"))
            orig = int(self.key("rope.scaling.original_context_length"))
            beta_fast = float(self.key("rope.scaling.yarn_beta_fast", 32.0))
            beta_slow = float(self.key("rope.scaling.yarn_beta_slow", 1.0))
            # gpt-oss: HF's truncate=False (not in the GGUF); everything else truncates
            truncate = self.arch != "gpt-oss" or self.ablate == "yarn_truncate"

            def corr_dim(n_rot):
                return d * math.log(orig / (n_rot * 2 * math.pi)) / (2 * math.log(theta))

            low, high = corr_dim(beta_fast), corr_dim(beta_slow)
            if truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, d - 1)
            ramp = np.clip((np.arange(d // 2) - low) / max(high - low, 0.001), 0.0, 1.0)
            inv = inv / factor * ramp + inv * (1.0 - ramp)
            scale = 0.1 * math.log(factor) + 1.0
        return inv, scale

    def rope(self, x, cos, sin, scale):  # x [n, heads, hd]; rotates the first n_rot dims
        r, half = self.n_rot, self.n_rot // 2
        c, s = cos[:, None, :] * scale, sin[:, None, :] * scale
        y = x.copy()
        interleaved = self.arch in NORM_ROPE
        if self.ablate == "rope_style_swapped":
            interleaved = not interleaved
        if interleaved:  # pairs (2j, 2j+1)
            a, b = x[..., 0:r:2], x[..., 1:r:2]
            y[..., 0:r:2], y[..., 1:r:2] = a * c - b * s, b * c + a * s
        else:  # NEOX: pairs (j, j + n_rot/2)
            a, b = x[..., :half], x[..., half:r]
            y[..., :half], y[..., half:r] = a * c - b * s, b * c + a * s
        return y

    # --- layer semantics --------------------------------------------------------------------------
    def uses_rope(self, il):
        # granitehybrid: rope.scaling.finetuned is llama.cpp's rope switch (false: NoPE, every layer)
        if self.arch == "granitehybrid":
            return bool(self.key("rope.scaling.finetuned", True)) or self.ablate == "rope_all_layers"
        # smollm3: every 4th layer has no rope (llama.cpp n_no_rope_layer_step = 4, not in the GGUF)
        return not (self.arch == "smollm3" and (il + 1) % 4 == 0 and self.ablate != "rope_all_layers")

    def is_swa(self, il):
        # gemma2 / gpt-oss: sliding window on even layers (llama.cpp's pattern 2, not in the GGUF)
        return (self.arch in ("gemma2", "gpt-oss") and il % 2 == 0 and self.ablate != "no_swa"
                and self.n_swa > 0)

    def attn_scale(self):
        if self.arch in GRANITE and self.ablate != "granite_attention_scale_1/sqrt(hd)":
            return float(self.key("attention.scale"))
        if self.ablate == "scale_d_over_heads":
            return 1.0 / math.sqrt(self.d // self.n_head)
        return 1.0 / math.sqrt(self.hd)

    def attention(self, il, h, cos, sin, scale):
        t, p, n = self.t, f"blk.{il}.", h.shape[0]
        nh, nkv, hd = self.n_head, self.n_kv, self.hd
        gate = None
        if p + "attn_qkv.weight" in t:  # phi3: fused q | k | v rows
            qkv = h @ t[p + "attn_qkv.weight"].T
            q, k, v = np.split(qkv, [nh * hd, nh * hd + nkv * hd], axis=-1)
        elif self.arch in QWEN35:  # q_proj rows per head: head_dim query rows, then head_dim gate rows
            qg = h @ t[p + "attn_q.weight"].T
            if self.ablate == "q_gate_split_in_halves":  # the wrong split: all queries, then all gates
                q, gate = qg[:, :nh * hd], qg[:, nh * hd:]
            else:
                qg = qg.reshape(n, nh, 2 * hd)
                q, gate = qg[..., :hd].reshape(n, nh * hd), qg[..., hd:].reshape(n, nh * hd)
            k, v = (h @ t[p + f"attn_{w}.weight"].T for w in "kv")
        else:
            q, k, v = (h @ t[p + f"attn_{w}.weight"].T + t.get(p + f"attn_{w}.bias", 0.0) for w in "qkv")
        if p + "attn_q_norm.weight" in t and t[p + "attn_q_norm.weight"].size == nh * hd and nh * hd != hd:
            q = rms(q, t[p + "attn_q_norm.weight"], self.eps)  # olmo2: over the whole projection
            k = rms(k, t[p + "attn_k_norm.weight"], self.eps)
        q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
        if p + "attn_q_norm.weight" in t and t[p + "attn_q_norm.weight"].size == hd:
            q = rms(q, t[p + "attn_q_norm.weight"], self.eps)  # qwen3 / qwen3moe: per head
            k = rms(k, t[p + "attn_k_norm.weight"], self.eps)
        if self.uses_rope(il):
            q, k = self.rope(q, cos, sin, scale), self.rope(k, cos, sin, scale)
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        masked = j > i
        if self.is_swa(il):
            masked |= i - j >= self.n_swa
        cap = float(self.key("attn_logit_softcapping", 0.0))
        sinks = t.get(p + "attn_sinks.weight") if self.ablate != "no_sinks" else None
        group = nh // nkv
        out = np.empty((n, nh, hd))
        for hh in range(nh):
            s = q[:, hh] @ k[:, hh // group].T * self.attn_scale()
            if cap and self.ablate != "no_attn_softcap":
                s = cap * np.tanh(s / cap)
            s = np.where(masked, -np.inf, s)
            m = s.max(axis=-1, keepdims=True)
            if sinks is not None:
                m = np.maximum(m, sinks[hh])
            e = np.exp(s - m)
            den = e.sum(axis=-1, keepdims=True) + (np.exp(sinks[hh] - m) if sinks is not None else 0.0)
            out[:, hh] = (e / den) @ v[:, hh // group]
        out = out.reshape(n, nh * hd)
        if gate is not None and self.ablate != "no_attn_gate":  # qwen35: output gate per head and dim
            out = out * sigmoid(gate)
        return out @ t[p + "attn_output.weight"].T + t.get(p + "attn_output.bias", 0.0)

    def shortconv(self, il, h):
        """lfm2: in_proj -> B, C, x (rows 0:d, d:2d, 2d:3d); y = C * causal_depthwise_conv(B * x);
        out_proj. The kernel [d, L] (ggml ne [L, d]): tap L-1 multiplies the current token."""
        t, p, n, d = self.t, f"blk.{il}.", h.shape[0], self.d
        b, c, xx = np.split(h @ t[p + "shortconv.in_proj.weight"].T, 3, axis=-1)
        w = t[p + "shortconv.conv.weight"]  # [d, L]
        if self.ablate == "conv_taps_reversed":
            w = w[:, ::-1]
        bx = b * xx
        y = causal_conv(bx, w)
        return (c * y) @ t[p + "shortconv.out_proj.weight"].T

    def delta_net(self, il, h):
        """qwen35 linear attention (gated delta rule), token by token (HF's recurrent form)."""
        t, p, n = self.t, f"blk.{il}.", h.shape[0]
        nk, dk = int(self.key("ssm.group_count")), int(self.key("ssm.state_size"))
        nv = int(self.key("ssm.time_step_rank"))
        dv = int(self.key("ssm.inner_size")) // nv
        w_conv = t[p + "ssm_conv1d.weight"]  # [channels, kernel]
        qkv = silu(causal_conv(h @ t[p + "attn_qkv.weight"].T, w_conv))
        q = qkv[:, :nk * dk].reshape(n, nk, dk)
        k = qkv[:, nk * dk:2 * nk * dk].reshape(n, nk, dk)
        v = qkv[:, 2 * nk * dk:].reshape(n, nv, dv)
        z = (h @ t[p + "attn_gate.weight"].T).reshape(n, nv, dv)
        beta = sigmoid(h @ t[p + "ssm_beta.weight"].T)  # [n, nv]
        dt_bias = t[p + "ssm_dt.bias"] if self.ablate != "no_dt_bias" else 0.0
        a = t[p + "ssm_a"]  # -exp(A_log), stored
        if self.ablate == "ssm_a_read_as_A_log":
            a = -np.exp(a)
        g = a * softplus(h @ t[p + "ssm_alpha.weight"].T + dt_bias)  # [n, nv], log of the decay
        eps = self.eps  # llama.cpp: the rms eps (HF: 1e-6, the same here)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps) / math.sqrt(dk)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
        out = np.zeros((n, nv, dv))
        for hv in range(nv):
            # the converter tiles the value heads: GGUF v-head hv belongs to key head hv % nk
            hk = hv // (nv // nk) if self.ablate == "v_heads_grouped" else hv % nk
            state = np.zeros((dk, dv))
            for i in range(n):
                state = state * math.exp(g[i, hv])
                delta = (v[i, hv] - k[i, hk] @ state) * beta[i, hv]
                state = state + np.outer(k[i, hk], delta)
                out[i, hv] = q[i, hk] @ state
        norm_w = t[p + "ssm_norm.weight"]
        o = rms(out, norm_w, self.eps) * silu(z)
        return o.reshape(n, nv * dv) @ t[p + "ssm_out.weight"].T

    def mamba2(self, il, h):
        """granitehybrid's Mamba-2 mixer, token by token (the recurrent form; HF's references come from
        its chunked form). ssm_in rows: z (d_inner) | xBC (d_inner + 2 n_group d_state) | dt (n_head)."""
        t, p, n = self.t, f"blk.{il}.", h.shape[0]
        d_inner, ds = int(self.key("ssm.inner_size")), int(self.key("ssm.state_size"))
        nh, ng = int(self.key("ssm.time_step_rank")), int(self.key("ssm.group_count"))
        hd = d_inner // nh
        zxbcdt = h @ t[p + "ssm_in.weight"].T
        z, xbc, dt = np.split(zxbcdt, [d_inner, 2 * d_inner + 2 * ng * ds], axis=-1)
        w_conv = t[p + "ssm_conv1d.weight"]  # [channels, kernel]: tap K-1 = the current token
        if self.ablate == "conv_taps_reversed":
            w_conv = w_conv[:, ::-1]
        conv_b = t[p + "ssm_conv1d.bias"] if self.ablate != "no_conv_bias" else 0.0
        xbc = silu(causal_conv(xbc, w_conv) + conv_b)
        x = xbc[:, :d_inner].reshape(n, nh, hd)
        b = xbc[:, d_inner:d_inner + ng * ds].reshape(n, ng, ds)
        c = xbc[:, d_inner + ng * ds:].reshape(n, ng, ds)
        if self.ablate == "b_c_swapped":
            b, c = c, b
        dt_bias = t[p + "ssm_dt.bias"] if self.ablate != "no_dt_bias" else 0.0
        dt = softplus(dt + dt_bias)  # [n, nh]
        a = t[p + "ssm_a"][:, 0]  # -exp(A_log), stored; ne [1, nh]
        if self.ablate == "ssm_a_read_as_A_log":
            a = -np.exp(a)
        d_skip = t[p + "ssm_d"][:, 0] if self.ablate != "no_D" else np.zeros(nh)
        y = np.zeros((n, nh, hd))
        for hh in range(nh):
            # HF's repeat_interleave / ggml_ssm_scan: head h uses group h / (nh / ng)
            g = hh % ng if self.ablate == "groups_tiled" else hh // (nh // ng)
            state = np.zeros((hd, ds))
            for i in range(n):
                state = state * math.exp(dt[i, hh] * a[hh]) + dt[i, hh] * np.outer(x[i, hh], b[i, g])
                y[i, hh] = state @ c[i, g] + d_skip[hh] * x[i, hh]
        y = y.reshape(n, d_inner)
        norm_w = t[p + "ssm_norm.weight"]  # [ng, d_inner / ng] (ne [d_inner / ng, ng])
        if self.ablate == "gated_norm_before_gate":
            y = rms(y.reshape(n, ng, -1), norm_w, self.eps).reshape(n, d_inner) * silu(z)
        elif self.ablate == "gated_norm_not_grouped":
            y = rms(y * silu(z), norm_w.reshape(-1), self.eps)
        else:  # RMSNorm of y * silu(z) over each group's d_inner / ng channels, with the rms eps
            y = rms((y * silu(z)).reshape(n, ng, -1), norm_w, self.eps).reshape(n, d_inner)
        return y @ t[p + "ssm_out.weight"].T

    def ffn(self, il, h):
        t, p = self.t, f"blk.{il}."
        if p + "ffn_gate_exps.weight" in t:
            return self.moe(il, h)
        if p + "ffn_gate.weight" in t:
            g, u = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
        else:  # phi3: fused gate | up rows in ffn_up
            g, u = np.split(h @ t[p + "ffn_up.weight"].T, 2, axis=-1)
        act = gelu_tanh(g) if self.arch == "gemma2" else silu(g)
        return (act * u) @ t[p + "ffn_down.weight"].T

    def moe(self, il, h):
        t, p, ab = self.t, f"blk.{il}.", self.ablate
        n_used = int(self.key("expert_used_count"))
        logits = h @ t[p + "ffn_gate_inp.weight"].T + t.get(p + "ffn_gate_inp.bias", 0.0)
        # llama.cpp's expert_gating_func: 1 softmax, 2 sigmoid (lfm2moe); absent: softmax
        sigmoid_gating = int(self.key("expert_gating_func", 1)) == 2
        probs_b = t.get(p + "exp_probs_b.bias")  # lfm2moe: the selection bias, per expert
        out = np.zeros_like(h)
        for r in range(h.shape[0]):
            top = np.argsort(-logits[r], kind="stable")[:n_used]
            if sigmoid_gating:
                # lfm2moe: scores s = sigmoid(logits); the experts chosen by s + exp_probs_b; their weights the
                # unbiased s, renormalized (not in the GGUF: HF's norm_topk_prob, llama.cpp always for lfm2moe)
                # over sum + 1e-6 (HF's; llama.cpp: the sum clamped to >= 6.1e-5), times the routed scaling
                # factor (no key: 1, llama.cpp applies none for lfm2moe)
                if ab == "softmax_gating":
                    s = np.exp(logits[r] - logits[r].max())
                    s /= s.sum()
                else:
                    s = sigmoid(logits[r])
                sel = s + probs_b if probs_b is not None and ab != "no_expert_bias" else s
                top = np.argsort(-sel, kind="stable")[:n_used]
                w = sel[top] if ab == "expert_weights_with_bias" else s[top]
                if ab == "topk_renorm_without_1e-6":  # llama.cpp's form: not a mistake, shows the eps is moot
                    w = w / max(w.sum(), 6.103515625e-5)
                elif ab != "no_topk_renorm":
                    w = w / (w.sum() + 1e-6)
                w = w * float(self.key("expert_weights_scale", 0.0) or 1.0)
            elif self.arch == "gpt-oss":  # softmax over the chosen logits
                w = np.exp(logits[r, top] - logits[r, top].max())
                w /= w.sum()
            else:  # qwen3moe, qwen35moe: softmax over all, then renormalized (not in the GGUF)
                pr = np.exp(logits[r] - logits[r].max())
                pr /= pr.sum()
                w = pr[top]
                if self.ablate != "no_topk_renorm":
                    w = w / w.sum()
            def bias(name, e):
                return t[p + name][e] if p + name in t else 0.0

            for e, we in zip(top, w):
                g = t[p + "ffn_gate_exps.weight"][e] @ h[r] + bias("ffn_gate_exps.bias", e)
                u = t[p + "ffn_up_exps.weight"][e] @ h[r] + bias("ffn_up_exps.bias", e)
                if self.arch == "gpt-oss":  # clamped SwiGLU (llama.cpp LLM_FFN_SWIGLU_OAI_MOE)
                    if self.ablate != "no_swiglu_clamp":
                        g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
                    a = (u + 1.0) * g / (1.0 + np.exp(-1.702 * g))
                else:
                    a = silu(g) * u
                y = t[p + "ffn_down_exps.weight"][e] @ a + bias("ffn_down_exps.bias", e)
                out[r] += we * y
        if p + "ffn_gate_shexp.weight" in t:  # qwen35moe: shared expert, times sigmoid(gate . x)
            sh = (silu(h @ t[p + "ffn_gate_shexp.weight"].T) * (h @ t[p + "ffn_up_shexp.weight"].T)) \
                @ t[p + "ffn_down_shexp.weight"].T
            if self.ablate != "no_shared_expert_gate":
                sh = sh * sigmoid(h @ t[p + "ffn_gate_inp_shexp.weight"].T)  # [n, 1]
            out = out + sh
        return out

    # --- gemma4 ------------------------------------------------------------------------------------
    def gemma4_rope(self, il, n):
        """(cos, sin, n_rot) of layer il. Sliding layers: NEOX rope over rope.dimension_count_swa dims with
        rope.freq_base_swa; full layers: NEOX rope over rope.dimension_count (the whole global head) with
        rope.freq_base, each frequency divided by rope_freqs.weight (1e30 = unrotated: proportional rope)."""
        ab = self.ablate
        if self.gemma4_swa[il]:
            n_rot = int(self.key("rope.dimension_count_swa"))
            theta = float(self.key("rope.freq_base_swa" if ab != "rope_theta_swapped" else "rope.freq_base"))
            inv = 1.0 / theta ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
        else:
            n_rot = int(self.key("rope.dimension_count"))
            theta = float(self.key("rope.freq_base" if ab != "rope_theta_swapped" else "rope.freq_base_swa"))
            inv = 1.0 / theta ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
            factors = self.t["rope_freqs.weight"]
            if ab == "rope_full_as_partial":  # phi3-style partial rope: the first 2 x n_rotated dims only
                n_rot = 2 * int((factors == 1).sum())
                inv = 1.0 / theta ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
            elif ab != "rope_full_no_freq_factors":
                inv = inv / factors
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        return np.cos(ang), np.sin(ang), n_rot

    def gemma4_forward(self, ids: list[int]) -> np.ndarray:
        """Gemma 4 (text): per-layer input embeddings, KV sharing, per-type head dims and rope, q/k/v
        norms, attention scale 1, plain-w RMSNorms, layer output scale, final soft cap."""
        t, n, eps, d, ab = self.t, len(ids), self.eps, self.d, self.ablate
        n_layer, nh = self.n_layer, self.n_head
        n_pl = int(self.key("embedding_length_per_layer_input"))
        n_kv_start = n_layer - int(self.key("attention.shared_kv_layers", 0))
        n_swa = self.n_swa

        def nrm(x, w):  # every Gemma 4 RMSNorm multiplies by the stored w (no 1 + w)
            return rms(x, w + 1.0 if ab == "norms_one_plus_w" else w, eps)

        x = t["token_embd.weight"][ids] * math.sqrt(d)
        pl = None
        if n_pl and ab != "no_per_layer_input":
            # token part: the packed table row [n_layer x n_pl] times sqrt(n_pl); layer il = slice il
            tok = t["per_layer_token_embd.weight"][ids].reshape(n, n_layer, n_pl) * math.sqrt(n_pl)
            # context part: the scaled embedding projected, times 1/sqrt(d), RMSNorm'd per slice
            proj = (x @ t["per_layer_model_proj.weight"].T / math.sqrt(d)).reshape(n, n_layer, n_pl)
            proj = nrm(proj, t["per_layer_proj_norm.weight"])
            if ab == "per_layer_input_token_part_only":
                proj = 0.0
            pl = (proj + tok) * (2.0 ** -0.5 if ab != "per_layer_input_no_scale" else 1.0)
        i, j = np.arange(n)[:, None], np.arange(n)[None, :]
        kv = {}
        for il in range(n_layer):
            p = f"blk.{il}."
            swa = self.gemma4_swa[il]
            # head dims per layer type (sliding: key_length_swa, full: key_length)
            hd = int(self.key("attention.key_length_swa" if swa else "attention.key_length"))
            nkv = int(self.key("attention.head_count_kv"))
            cos, sin, n_rot = self.gemma4_rope(il, n)
            half = n_rot // 2

            def rope(z):  # NEOX pairs (k, k + n_rot / 2) over the first n_rot dims of each head
                y = z.copy()
                c, s_ = cos[:, None, :], sin[:, None, :]
                if ab == "rope_style_swapped":  # interleaved pairs (2k, 2k + 1)
                    a_, b_ = z[..., 0:n_rot:2], z[..., 1:n_rot:2]
                    y[..., 0:n_rot:2], y[..., 1:n_rot:2] = a_ * c - b_ * s_, b_ * c + a_ * s_
                    return y
                a_, b_ = z[..., :half], z[..., half:n_rot]
                y[..., :half], y[..., half:n_rot] = a_ * c - b_ * s_, b_ * c + a_ * s_
                return y

            h = nrm(x, t[p + "attn_norm.weight"])
            q = rope(nrm((h @ t[p + "attn_q.weight"].T).reshape(n, nh, hd), t[p + "attn_q_norm.weight"]))
            if il < n_kv_start:
                k_raw = (h @ t[p + "attn_k.weight"].T).reshape(n, nkv, hd)
                # attention_k_eq_v models (no attn_v): v is the raw k projection
                v = (h @ t[p + "attn_v.weight"].T).reshape(n, nkv, hd) if p + "attn_v.weight" in t else k_raw
                k = rope(nrm(k_raw, t[p + "attn_k_norm.weight"]))
                if ab != "no_v_norm":
                    v = rms(v, 1.0, eps)  # weightless RMSNorm on v
                kv[il] = k, v
            else:
                # llama.cpp's rule (not in the GGUF): the last non-shared layer (full) or the one before it
                # (sliding); = HF's "last non-shared layer of the same type" for this layer pattern
                src = n_kv_start - (2 if swa else 1)
                if ab == "kv_share_same_offset":  # the mistake: shared layer il reads layer il - n_shared
                    src = il - (n_layer - n_kv_start)
                k, v = kv[src]
            masked = j > i
            if swa and ab != "no_swa":
                masked |= i - j >= n_swa
            scale = 1.0 if ab != "attn_scale_1/sqrt(hd)" else 1.0 / math.sqrt(hd)
            group = nh // nkv
            out = np.empty((n, nh, hd))
            for hh in range(nh):
                sc = np.where(masked, -np.inf, q[:, hh] @ k[:, hh // group].T * scale)
                e = np.exp(sc - sc.max(axis=-1, keepdims=True))
                out[:, hh] = (e / e.sum(axis=-1, keepdims=True)) @ v[:, hh // group]
            o = out.reshape(n, nh * hd) @ t[p + "attn_output.weight"].T
            x = x + nrm(o, t[p + "post_attention_norm.weight"])
            h = nrm(x, t[p + "ffn_norm.weight"])
            f = (gelu_tanh(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
            x = x + nrm(f, t[p + "post_ffw_norm.weight"])
            if pl is not None:
                g = gelu_tanh(x @ t[p + "inp_gate.weight"].T) * pl[:, il, :]
                x = x + nrm(g @ t[p + "proj.weight"].T, t[p + "post_norm.weight"])
            if p + "layer_output_scale.weight" in t and ab != "no_layer_output_scale":
                x = x * t[p + "layer_output_scale.weight"][0]
        logits = nrm(x, t["output_norm.weight"]) @ t.get("output.weight", t["token_embd.weight"]).T
        cap = float(self.key("final_logit_softcapping", 0.0))
        if cap and ab != "no_final_softcap":
            logits = cap * np.tanh(logits / cap)
        return logits

    def forward(self, ids: list[int]) -> np.ndarray:
        t, n, eps, a = self.t, len(ids), self.eps, self.arch
        if a == "gemma4":
            return self.gemma4_forward(ids)
        inv, scale = self.inv_freq(n)
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        cos, sin = np.cos(ang), np.sin(ang)
        x = t["token_embd.weight"][ids]
        if a == "gemma2":
            x = x * math.sqrt(self.d)
        granite = a in GRANITE
        if granite and self.ablate != "no_embedding_scale":
            x = x * float(self.key("embedding_scale"))
        res = float(self.key("residual_scale")) if granite and self.ablate != "no_residual_scale" else 1.0
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = rms(x, t[p + "attn_norm.weight"], eps) if p + "attn_norm.weight" in t else x  # olmo2: none
            if self.n_kv_per_layer is not None and self.n_kv_per_layer[il] == 0:  # recurrent layer
                # lfm2: short conv; granitehybrid: Mamba-2
                o = self.mamba2(il, h) if a == "granitehybrid" else self.shortconv(il, h)
            elif self.recurrent and self.recurrent[il]:  # qwen35 linear attention
                o = self.delta_net(il, h)
            else:
                o = self.attention(il, h, cos, sin, scale)
            if a in ("gemma2", "olmo2"):
                o = rms(o, t[p + "post_attention_norm.weight"], eps)
            x = x + o * res
            if a in ("gpt-oss", "qwen35", "qwen35moe"):  # their pre-FFN norm is named post_attention_norm
                h = rms(x, t[p + "post_attention_norm.weight"], eps)
            elif p + "ffn_norm.weight" in t:
                h = rms(x, t[p + "ffn_norm.weight"], eps)
            else:  # olmo2
                h = x
            f = self.ffn(il, h)
            if p + "post_ffw_norm.weight" in t:
                f = rms(f, t[p + "post_ffw_norm.weight"], eps)
            x = x + f * res
        head = t.get("output.weight", t["token_embd.weight"])
        # lfm2: the final norm is named token_embd_norm (HF embedding_norm, applied after the last layer)
        out_norm = t["output_norm.weight"] if "output_norm.weight" in t else t["token_embd_norm.weight"]
        logits = rms(x, out_norm, eps) @ head.T
        if granite and self.ablate != "no_logit_scale":
            logits = logits / float(self.key("logit_scale"))
        cap = float(self.key("final_logit_softcapping", 0.0))
        if cap and self.ablate != "no_final_softcap":
            logits = cap * np.tanh(logits / cap)
        return logits


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def causal_conv(x, w):
    """Depthwise causal convolution: x [n, channels], w [channels, K]; out[i] = sum_j w[:, j] x[i - K + 1 + j]
    (zeros before the first token)."""
    n, kk = x.shape[0], w.shape[1]
    xp = np.concatenate([np.zeros((kk - 1, x.shape[1])), x])
    return sum(w[:, j] * xp[j:j + n] for j in range(kk))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# the deliberate mistakes of --ablations, per architecture
ABLATIONS = {
    "qwen2": ["rope_style_swapped", "no_yarn"],
    "qwen3": ["rope_style_swapped"],
    "llama": ["rope_style_swapped", "no_rope_freqs"],
    "gemma2": ["no_attn_softcap", "no_final_softcap", "no_swa", "scale_d_over_heads", "rope_style_swapped"],
    "olmo2": ["rope_style_swapped"],
    "smollm3": ["rope_all_layers", "rope_style_swapped"],
    "granite": ["no_embedding_scale", "no_residual_scale", "granite_attention_scale_1/sqrt(hd)", "no_logit_scale",
                "rope_style_swapped"],
    "phi3": ["longrope_other_factors", "rope_style_swapped"],
    "qwen3moe": ["no_topk_renorm", "rope_style_swapped"],
    "gpt-oss": ["no_sinks", "no_swa", "no_yarn", "yarn_truncate", "no_swiglu_clamp", "rope_style_swapped"],
    "lfm2": ["conv_taps_reversed", "rope_style_swapped"],
    "lfm2moe": ["no_expert_bias", "expert_weights_with_bias", "no_topk_renorm", "softmax_gating",
                "conv_taps_reversed", "rope_style_swapped", "topk_renorm_without_1e-6"],
    "qwen35": ["v_heads_grouped", "no_dt_bias", "ssm_a_read_as_A_log", "no_attn_gate", "q_gate_split_in_halves",
               "rope_all_head_dims", "rope_style_swapped"],
    "granitehybrid": ["groups_tiled", "no_D", "no_conv_bias", "no_dt_bias", "ssm_a_read_as_A_log",
                      "gated_norm_not_grouped", "gated_norm_before_gate", "conv_taps_reversed", "b_c_swapped",
                      "no_embedding_scale", "no_residual_scale", "granite_attention_scale_1/sqrt(hd)",
                      "no_logit_scale", "rope_all_layers"],
    "gemma4": ["no_per_layer_input", "per_layer_input_token_part_only", "per_layer_input_no_scale",
               "kv_share_same_offset", "no_v_norm", "attn_scale_1/sqrt(hd)", "rope_full_as_partial",
               "rope_full_no_freq_factors", "rope_theta_swapped", "no_swa", "no_layer_output_scale",
               "norms_one_plus_w", "no_final_softcap", "rope_style_swapped"],
    "qwen35moe": ["v_heads_grouped", "no_dt_bias", "ssm_a_read_as_A_log", "no_attn_gate", "no_shared_expert_gate",
                  "no_topk_renorm", "rope_all_head_dims"],
}


def compare(meta, t, folder: Path, ref: dict, ablate: str = ""):
    model = Model(meta, t, ablate)
    worst, top1_miss = 0.0, 0
    for case in ref["cases"]:
        logits = model.forward(case["token_ids"])
        want = np.fromfile(folder / f"{case['id']}.last_logits.f32", dtype="<f4")
        worst = max(worst, float(np.abs(logits[-1] - want).max()))
        top1_miss += sum(int(np.argmax(row) != pos["top_ids"][0]) for row, pos in zip(logits, case["positions"]))
    return worst, top1_miss


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--ablations"]
    ablations = "--ablations" in sys.argv[1:]
    only = None
    if "--only" in args:  # --only NAME[,NAME...]: just these folders
        k = args.index("--only")
        only = set(args[k + 1].split(","))
        del args[k:k + 2]
    root = Path(args[0]) if args else REPO / "tests/data/tiny"
    ok = True
    for folder in sorted(p for p in root.iterdir() if (p / "model.gguf").is_file()):
        if only is not None and folder.name not in only:
            continue
        meta, t = load(folder / "model.gguf")
        ref = json.loads((folder / "reference.json").read_text())
        worst, top1_miss = compare(meta, t, folder, ref)
        good = worst < 1e-3 and top1_miss == 0
        ok &= good
        print(f"{folder.name}: max |logit - reference| {worst:.2e}, top-1 mismatches {top1_miss}"
              f"{'' if good else '  FAIL'}", flush=True)
        if ablations:
            for ab in ABLATIONS.get(meta["general.architecture"], []):
                if ab == "no_yarn" and meta.get(f"{meta['general.architecture']}.rope.scaling.type") != "yarn":
                    continue
                w, m = compare(meta, t, folder, ref, ab)
                print(f"    {ab}: max |logit - reference| {w:.3g}, top-1 mismatches {m}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
