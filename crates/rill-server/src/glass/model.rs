//! `GET /v1/rill/model`: the served model's shapes, sizes and costs.

use std::sync::Arc;

use axum::extract::State as Extract;
use axum::response::Response;
use serde_json::{json, Value};

use crate::error::{json_body, ApiError};
use crate::state::State;

type AppState = Arc<State>;

pub(crate) async fn model(Extract(state): Extract<AppState>) -> Result<Response, ApiError> {
    let handle = state.handle()?;
    let info = handle.model_info();
    let s = handle.model_summary();
    let c = &s.config;
    let capacity = rill_engine::kv_capacity(c, s.kv_types, handle.config());
    Ok(json_body(&json!({
        "name": info.name,
        "architecture": format!("{:?}", c.architecture).to_lowercase(),
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "head_dims": c.layer_attention.iter().map(|a| a.head_dim).collect::<Vec<_>>(),
        "kv_source": c.kv_source,
        "d_model": c.d_model,
        "d_ff": c.ffn_dim,
        "vocab_size": c.vocab_size,
        "context": info.context,
        "trained_context": c.context_length,
        "sliding_window": c.sliding_window,
        "sliding_layers": c.layer_is_sliding.iter().filter(|&&s| s).count(),
        "parameters": s.cost.parameters,
        "weight_bytes": s.cost.weight_bytes_per_token,
        "flops_per_token": s.cost.flops_per_token,
        "attention_flops_per_position": s.cost.attention_flops_per_position,
        "kv_bytes_per_token": s.kv_bytes_per_token,
        "kv_context_bytes_per_token": s.kv_context_bytes_per_token,
        "kv_block_size": s.kv_block_size,
        "kv_blocks_total": s.kv_blocks_total,
        "kv_window_blocks_total": s.kv_window_blocks_total,
        "layer_kinds": c.layer_kinds.iter().map(|k| match k {
            rill_model::LayerKind::Attention => "attention",
            rill_model::LayerKind::DeltaNet => "gated_deltanet",
            rill_model::LayerKind::ShortConv => "short_conv",
            rill_model::LayerKind::Mamba2 => "mamba2",
        }).collect::<Vec<_>>(),
        "state_bytes_per_sequence": s.state_bytes_per_sequence,
        "state_sequences": s.state_sequences,
        "state_arena_bytes": s.state_arena_bytes,
        "kv_capacity": {
            "positions": capacity.positions,
            "conversations": capacity.conversations,
            "conversation_tokens": rill_engine::KV_SPLIT_CONVERSATION_TOKENS,
        },
        "kv_dtype": s.kv_types.name(),
        "kv_types": {"keys": s.kv_types.keys.name(), "values": s.kv_types.values.name()},
        "kv_bytes_per_token_by_type": kv_bytes_by_type(c),
        "precision": format!("{:?}", s.precision).to_lowercase(),
        "threads": s.threads,
        "chat_template": handle.tokenizer().chat_template().is_some(),
    })))
}

/// KV bytes per token of context for every type the model's heads fit, keys and values alike:
/// what `--kv-type` would make of the same memory.
fn kv_bytes_by_type(c: &rill_model::ModelConfig) -> serde_json::Map<String, Value> {
    let layout = rill_model::KvLayout::of(c);
    rill_model::KvDtype::ALL
        .iter()
        .filter(|t| t.fits_head_dim(layout.max_head_dim()))
        .map(|&t| {
            let bytes = layout.bytes_per_token(rill_model::KvTypes::from(t), |_| true);
            (t.name().to_string(), Value::from(bytes))
        })
        .collect()
}
