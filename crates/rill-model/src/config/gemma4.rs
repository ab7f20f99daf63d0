//! Gemma 4's configuration: what its GGUF says per layer, and what it leaves to the engine
//! (the KV-sharing rule, unit attention scale, the value norm). The forward math is written
//! out term by term in `docs/models/gemma4-notes.md`.

use rill_gguf::Metadata;
use rill_kernels::ops::{GateActivation, RopeStyle};
use rill_kernels::Activations;

use super::per_layer::{positive, sliding_layers};
use super::{AttentionShape, ModelConfig, MoeConfig, MoeGating, QkNorm, RopeScaling};
use crate::ModelError;

/// Sets Gemma 4's traits on `config` (read as far as the shared keys go). `kv_heads` is the
/// per-layer KV head count where the file gives one (the 31B: its global layers have fewer).
pub(super) fn configure(
    config: &mut ModelConfig,
    meta: &Metadata,
    key: &dyn Fn(&str) -> String,
    kv_heads: Option<&[usize]>,
) -> Result<(), ModelError> {
    let n_layers = config.n_layers;
    let bad = |k: &str, reason: String| ModelError::BadMetadata {
        key: key(k),
        reason,
    };
    let opt = |k: &str| -> Result<Option<usize>, ModelError> {
        let full = key(k);
        meta.get_u64(&full)?.map(|v| positive(&full, v)).transpose()
    };
    // The 26B-A4B: routed experts beside every layer's dense feed-forward.
    if let Some(n_experts) = opt("expert_count")? {
        let n_used = opt("expert_used_count")?
            .ok_or_else(|| ModelError::MissingMetadata(key("expert_used_count")))?;
        if n_used > n_experts {
            return Err(bad(
                "expert_used_count",
                format!("{n_used} of only {n_experts} experts"),
            ));
        }
        config.moe = Some(MoeConfig {
            n_experts,
            n_used,
            expert_ffn_dim: opt("expert_feed_forward_length")?
                .ok_or_else(|| ModelError::MissingMetadata(key("expert_feed_forward_length")))?,
            gating: MoeGating::SoftmaxThenTop { renormalize: true },
            biases: false,
        });
        config.dense_beside_experts = true;
    }
    config.rope_style = RopeStyle::NeoX;
    config.activation = GateActivation::GeluTanh;
    config.embedding_scale = Some((config.d_model as f32).sqrt());
    config.qk_norm = QkNorm::PerHead;
    config.v_norm = true;
    config.post_norms = true;
    // As Gemma 3's GeGLU (see there): the down projection's input goes in unquantized.
    config.ffn_down_activations = Activations::Float;
    // Queries and keys are RMS-normed per head and meet unscaled (HF's `scaling = 1.0`,
    // llama.cpp's `f_attention_scale = 1`); not in the file.
    config.attention_scale = 1.0;
    config.rope_base_local = meta
        .get_f64(&key("rope.freq_base_swa"))?
        .unwrap_or(10_000.0);
    config.rope_scaling_local = RopeScaling::None;
    // The file's rope_freqs make the global layers' rotation "proportional" (most frequencies
    // divided by 1e30); the sliding layers rotate every dimension.
    config.rope_freqs_local = false;
    // 0 means no sliding window, as in llama.cpp.
    let window = match meta.get_u64(&key("attention.sliding_window"))? {
        Some(0) | None => None,
        Some(w) => Some(positive(&key("attention.sliding_window"), w)?),
    };
    config.sliding_window = window;
    config.layer_is_sliding = match window {
        Some(_) => sliding_layers(meta, &key("attention.sliding_window_pattern"), n_layers, 6)?,
        None => vec![false; n_layers],
    };

    // Heads: the global layers' from `key_length`, the sliding layers' from `key_length_swa`.
    let global_head = config.head_dim;
    let local_head = opt("attention.key_length_swa")?.unwrap_or(global_head);
    if let Some(v) = opt("attention.value_length_swa")? {
        if v != local_head {
            return Err(bad(
                "attention.value_length_swa",
                format!("value length {v} differs from key length {local_head}"),
            ));
        }
    }
    let local_rope = opt("rope.dimension_count_swa")?.unwrap_or(local_head);
    if local_rope > local_head || local_rope % 2 != 0 {
        return Err(bad(
            "rope.dimension_count_swa",
            format!("{local_rope} must be even and at most the head size {local_head}"),
        ));
    }
    config.rope_dim_local = local_rope;
    let n_heads = config.n_heads;
    let mut global_kv_heads = None;
    for il in 0..n_layers {
        let sliding = config.layer_is_sliding[il];
        let n_kv_heads = kv_heads.map_or(config.n_kv_heads, |c| c[il]);
        if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(bad(
                "attention.head_count_kv",
                format!("layer {il}: {n_kv_heads} KV heads for {n_heads} query heads"),
            ));
        }
        if !sliding {
            global_kv_heads.get_or_insert(n_kv_heads);
        }
        config.layer_attention[il] = if sliding {
            AttentionShape {
                n_kv_heads,
                head_dim: local_head,
                rope_dim: local_rope,
            }
        } else {
            AttentionShape {
                n_kv_heads,
                head_dim: global_head,
                rope_dim: config.rope_dim,
            }
        };
    }
    if let Some(n) = global_kv_heads {
        config.n_kv_heads = n;
    }
    if config
        .layer_attention
        .iter()
        .zip(&config.layer_is_sliding)
        .any(|(s, &sliding)| !sliding && s.n_kv_heads != config.n_kv_heads)
    {
        return Err(bad(
            "attention.head_count_kv",
            "global layers with different KV head counts".into(),
        ));
    }

    // The last `shared_kv_layers` layers compute no keys or values: each attends over those of
    // the last earlier layer of its own kind (HF's rule). llama.cpp hard-codes the last
    // computing layer for global layers and the one before it for sliding ones; the two agree
    // on every released Gemma 4, and a file where they would not is refused (which one its
    // author meant is unknowable).
    let shared = meta
        .get_u64(&key("attention.shared_kv_layers"))?
        .unwrap_or(0) as usize;
    if shared >= n_layers {
        return Err(bad(
            "attention.shared_kv_layers",
            format!("{shared} of only {n_layers} layers"),
        ));
    }
    let first_shared = n_layers - shared;
    for il in first_shared..n_layers {
        let sliding = config.layer_is_sliding[il];
        let source = (0..first_shared)
            .rev()
            .find(|&s| config.layer_is_sliding[s] == sliding)
            .ok_or_else(|| {
                bad(
                    "attention.shared_kv_layers",
                    format!("layer {il} shares keys and values, but no earlier layer is its kind"),
                )
            })?;
        let llama_cpp = first_shared.checked_sub(if sliding { 2 } else { 1 });
        if llama_cpp != Some(source) {
            return Err(bad(
                "attention.shared_kv_layers",
                format!(
                    "layer {il} would read layer {source}'s keys and values in transformers but \
                     layer {llama_cpp:?}'s in llama.cpp: the layer pattern is ambiguous"
                ),
            ));
        }
        if config.layer_attention[source] != config.layer_attention[il] {
            return Err(bad(
                "attention.head_count_kv",
                format!("layer {il} shares layer {source}'s keys and values but not its heads"),
            ));
        }
        config.kv_source[il] = source;
    }
    config.per_layer_input = meta
        .get_u64(&key("embedding_length_per_layer_input"))?
        .filter(|&n| n > 0)
        .map(|n| positive(&key("embedding_length_per_layer_input"), n))
        .transpose()?;
    Ok(())
}
