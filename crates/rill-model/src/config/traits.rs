//! A configuration's traits in words (what `rill inspect` and the glass box show).

use rill_kernels::ops::{GateActivation, RopeStyle};

use super::{LayerKind, ModelConfig, MoeGating, QkNorm, RopeScaling};

impl ModelConfig {
    /// The traits the forward pass varies on, in words (what `rill inspect` shows).
    pub fn traits(&self) -> Vec<String> {
        let mut t = Vec::new();
        if self.bidirectional {
            t.push("bidirectional attention (an encoder)".into());
        }
        if !self.output_head {
            t.push("no output head (embeddings only)".into());
        }
        if self.learned_positions {
            t.push("learned absolute positions".into());
        }
        if self.post_layer_norms {
            t.push("LayerNorms after each residual add and of the embeddings (post-LN)".into());
        }
        t.push(match self.rope_style {
            _ if !self.layer_uses_rope.iter().any(|&r| r) => "no RoPE".to_string(),
            RopeStyle::Adjacent => "RoPE on adjacent pairs".to_string(),
            RopeStyle::NeoX => "RoPE on half-split pairs (NeoX)".to_string(),
        });
        if self.rope_dim < self.head_dim {
            t.push(format!(
                "rotary on {} of {} head dims",
                self.rope_dim, self.head_dim
            ));
        }
        match self.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => t.push(format!("linear RoPE scaling x{factor}")),
            RopeScaling::Yarn {
                factor,
                original_context,
                ..
            } => t.push(format!(
                "YaRN RoPE scaling x{factor} of {original_context} positions"
            )),
            RopeScaling::LongRope {
                original_context, ..
            } => t.push(format!(
                "LongRoPE (long factors past {original_context} positions of context)"
            )),
        }
        t.push(match self.activation {
            _ if self.ungated_ffn => "GELU (erf) feed-forward, ungated, biased".to_string(),
            GateActivation::Silu => "SwiGLU".to_string(),
            GateActivation::GeluTanh => "GeGLU (tanh)".to_string(),
            GateActivation::SwigluClamped => "clamped SwiGLU (gpt-oss)".to_string(),
        });
        if self.fused_qkv {
            t.push("fused q/k/v".into());
        }
        if self.fused_gate_up {
            t.push("fused gate/up".into());
        }
        if self.qkv_bias {
            t.push("q/k/v biases".into());
        }
        match self.qk_norm {
            QkNorm::None => {}
            QkNorm::PerHead => t.push("per-head q/k RMSNorm".into()),
            QkNorm::Whole => t.push("whole-vector q/k RMSNorm".into()),
        }
        if !self.pre_norms {
            t.push("no pre-norms".into());
        }
        if self.post_norms {
            t.push("post-attention and post-FFN norms".into());
        }
        let without_rope = self.layer_uses_rope.iter().filter(|r| !**r).count();
        if without_rope > 0 && without_rope < self.n_layers {
            t.push(format!(
                "{without_rope} of {} layers without RoPE",
                self.n_layers
            ));
        }
        if let Some(s) = self.residual_scale {
            t.push(format!("residual branches x{s}"));
        }
        if let Some(s) = self.logit_scale {
            t.push(format!("logits /{s}"));
        }
        if let Some(c) = self.attn_logit_softcap {
            t.push(format!("attention scores soft-capped at {c}"));
        }
        if self.attn_output_bias {
            t.push("attention output bias".into());
        }
        if self.attn_sinks {
            t.push("attention sinks".into());
        }
        if let Some(m) = self.moe {
            let gating = match m.gating {
                MoeGating::SoftmaxThenTop { renormalize: true } => "softmax, top-k renormalised",
                MoeGating::SoftmaxThenTop { renormalize: false } => "softmax, top-k",
                MoeGating::TopThenSoftmax => "top-k, softmax over them",
                MoeGating::SigmoidThenTop { .. } => {
                    "sigmoid, top-k by score plus bias, renormalised"
                }
            };
            t.push(format!(
                "{} of {} experts per token (FFN {} each; {gating}{})",
                m.n_used,
                m.n_experts,
                m.expert_ffn_dim,
                if m.biases { ", biased" } else { "" }
            ));
        }
        if self.dense_beside_experts {
            t.push(format!(
                "a dense feed-forward ({}) beside the experts, each branch normed; the router reads the residual stream",
                self.ffn_dim
            ));
        }
        if let Some(fs) = self.shared_expert_ffn_dim {
            t.push(format!("a sigmoid-gated shared expert (FFN {fs})"));
        }
        if self.attn_output_gate {
            t.push("sigmoid-gated attention output".into());
        }
        let count = |kind: LayerKind| self.layer_kinds.iter().filter(|&&k| k == kind).count();
        if let (Some(c), n) = (&self.delta_net, count(LayerKind::DeltaNet)) {
            t.push(format!(
                "{n} of {} layers Gated DeltaNet ({} value heads on {} key heads, state {}x{} per head, conv {})",
                self.n_layers, c.n_v_heads, c.n_k_heads, c.d_k, c.d_v, c.conv_kernel
            ));
        }
        if let (Some(k), n) = (self.short_conv_kernel, count(LayerKind::ShortConv)) {
            t.push(format!(
                "{n} of {} layers gated short convolutions (kernel {k})",
                self.n_layers
            ));
        }
        if let (Some(c), n) = (&self.mamba2, count(LayerKind::Mamba2)) {
            t.push(format!(
                "{n} of {} layers Mamba-2 ({} heads of {} in {} groups, state {}, conv {})",
                self.n_layers,
                c.n_heads,
                c.head_dim(),
                c.n_groups,
                c.d_state,
                c.conv_kernel
            ));
        }
        if self.mtp_layers > 0 {
            t.push(format!(
                "{} multi-token-prediction layer(s) (not run)",
                self.mtp_layers
            ));
        }
        let local_heads = (self.layer_attention.iter())
            .zip(&self.layer_is_sliding)
            .find(|(a, &sliding)| sliding && a.head_dim != self.head_dim);
        if let Some((a, _)) = local_heads {
            t.push(format!(
                "sliding layers' heads of {} (global layers' {})",
                a.head_dim, self.head_dim
            ));
        }
        let shared = (self.kv_source.iter().enumerate())
            .filter(|(il, &s)| s != *il)
            .count();
        if shared > 0 {
            t.push(format!(
                "{shared} of {} layers attend over an earlier layer's keys and values",
                self.n_layers
            ));
        }
        if self.v_norm {
            t.push("weightless value norm".into());
        }
        if let Some(n) = self.per_layer_input {
            t.push(format!("per-layer input embeddings ({n} per layer)"));
        }
        let widest = self.layer_ffn_dims.iter().max();
        if self.layer_ffn_dims.iter().min() != widest {
            t.push(format!(
                "feed-forward widths {} to {}",
                self.layer_ffn_dims.iter().min().unwrap_or(&0),
                widest.unwrap_or(&0)
            ));
        }
        if let Some(s) = self.embedding_scale {
            t.push(format!("embeddings x{s}"));
        }
        if let Some(c) = self.final_logit_softcap {
            t.push(format!("final logits soft-capped at {c}"));
        }
        t
    }
}
