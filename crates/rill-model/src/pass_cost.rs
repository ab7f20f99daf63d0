//! What a pass costs, for the profile: its arithmetic per stage and the weight bytes it reads.

use crate::forward::{Batch, Precision};
use crate::profile::{Stage, StageTimes};
use crate::ModelConfig;

/// Bytes of weights one pass reads besides the experts: every layer's attention matrices and
/// dense feed-forward or router, and the embedding
/// rows of the batch's tokens (the output head counts what it read when it ran).
pub(crate) fn dense_weight_bytes(
    w: &crate::Weights,
    batch: &Batch,
    n_layers: usize,
    precision: Precision,
) -> u64 {
    let read = |m: &crate::Weight| m.bytes_read(precision);
    let mut bytes = 0;
    for layer in w.layers.iter().take(n_layers) {
        bytes += layer.mixer.matrices().into_iter().map(read).sum::<usize>();
        if let Some(p) = &layer.per_layer_input {
            bytes += read(&p.gate) + read(&p.proj);
        }
        bytes += match &layer.ffn {
            crate::FeedForward::Dense(e) => read(&e.gate) + read(&e.up) + read(&e.down),
            crate::FeedForward::Plain(p) => read(&p.up) + read(&p.down),
            crate::FeedForward::Routed {
                router,
                shared,
                beside,
                ..
            } => {
                let expert = |e: &crate::Expert| read(&e.gate) + read(&e.up) + read(&e.down);
                read(router)
                    + shared.as_ref().map_or(0, |s| expert(&s.expert))
                    + beside.as_ref().map_or(0, |b| expert(&b.expert))
            }
        };
    }
    bytes += batch.len() * w.token_embd.row_bytes();
    if let Some(p) = &w.per_layer_inputs {
        bytes += read(&p.model_proj) + batch.len() * p.token_embd.row_bytes();
    }
    bytes as u64
}

/// Adds one pass's arithmetic per stage (2 FLOPs per multiply-add; attention over each row's
/// visible keys) and its rows to the profile.
pub(crate) fn count_flops(p: &mut StageTimes, cfg: &ModelConfig, batch: &Batch, n_layers: usize) {
    // A routed feed-forward computes its router and the used experts.
    let (moe_ffn, router) = match cfg.moe {
        Some(m) => (Some(m.n_used * m.expert_ffn_dim), m.n_experts),
        None => (None, 0),
    };
    let (d, router) = (cfg.d_model as u64, router as u64);
    let rows = batch.len() as u64;
    p.passes += 1;
    p.rows += rows;
    let mut attention = 0u64;
    let tail = cfg.kv_shared_tail().unwrap_or(usize::MAX);
    for il in 0..n_layers.min(cfg.n_layers) {
        // Past the layers that store keys and values only the rows with logits go on.
        let rows = if il >= tail {
            batch.n_logits() as u64
        } else {
            rows
        };
        let shape = cfg.layer_attention[il];
        let q_dim = (cfg.n_heads * shape.head_dim) as u64;
        let kv_dim = if cfg.kv_source[il] == il {
            shape.kv_dim() as u64
        } else {
            0
        };
        let ffn = moe_ffn.unwrap_or(cfg.layer_ffn_dims[il]) as u64;
        p.add_flops(Stage::Qkv, 2 * rows * d * (q_dim + 2 * kv_dim));
        p.add_flops(Stage::AttnOut, 2 * rows * q_dim * d);
        p.add_flops(Stage::GateUp, 2 * rows * d * (2 * ffn + router));
        p.add_flops(Stage::Down, 2 * rows * ffn * d);
        if cfg.layer_kinds[il] != crate::LayerKind::Attention {
            continue;
        }
        // Scores and weighted values: 2 multiply-adds per query dimension per visible key.
        let window = cfg.sliding_window.filter(|_| cfg.layer_is_sliding[il]);
        for row in batch.rows.iter().filter(|r| il < tail || r.logits) {
            let last = row.pos + 1;
            let first = window.map_or(0, |w| last.saturating_sub(w));
            attention += 4 * q_dim * (last - first) as u64;
        }
    }
    p.add_flops(
        Stage::Head,
        2 * batch.n_logits() as u64 * d * cfg.vocab_size as u64,
    );
    p.add_flops(Stage::Attention, attention);
}
