//! `GET /v1/rill/server`: the whole server at one moment, for the glass box's notepad (every KV
//! block: who holds it, shared prefix blocks with their reference counts, cached-free blocks)
//! and assembly line (the loop's newest steps, each request's rows in them, prompt chunks
//! against decode rows, and admissions, preemptions, cancellations and ends between them).
//! Answered by the engine loop between two steps, even while it is paused.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State as Extract};
use axum::response::Response;
use rill_engine::serve::timeline::{LoopEventKind, SeqState, TIMELINE_STEPS};
use serde_json::{json, Value};

use crate::error::job_dropped;
use crate::error::{json_body, ApiError};
use crate::state::State;

type AppState = Arc<State>;

pub(crate) async fn server(
    Extract(state): Extract<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let handle = state.handle()?;
    let steps = match query.get("steps") {
        None => 64,
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= TIMELINE_STEPS)
            .ok_or_else(|| {
                ApiError::param("steps", format!("'steps' must be 0 to {TIMELINE_STEPS}"))
            })?,
    };
    let view = handle
        .server_view(steps)
        .map_err(|_| job_dropped())?
        .await
        .map_err(|_| job_dropped())?;
    let tables: HashMap<u64, (usize, &Vec<u32>)> = view
        .kv
        .sequences
        .iter()
        .map(|(id, len, blocks)| (*id, (*len, blocks)))
        .collect();
    // The window layers' tables, in the same order as the global ones.
    let windows: HashMap<u64, (usize, Vec<Option<u32>>)> = view
        .kv
        .window
        .iter()
        .flat_map(|w| view.kv.sequences.iter().zip(&w.sequences))
        .map(|((id, _, _), (from, table))| {
            let table = table.iter().map(|&b| (b != u32::MAX).then_some(b));
            (*id, (*from, table.collect()))
        })
        .collect();
    let snapshots: HashMap<u64, (Option<usize>, Option<usize>)> = view
        .kv
        .recurrent
        .iter()
        .flat_map(|r| view.kv.sequences.iter().zip(&r.snapshots))
        .map(|((id, _, _), &p)| (*id, p))
        .collect();
    let sequences: Vec<Value> = view
        .sequences
        .iter()
        .map(|s| {
            let (positions, blocks) = tables
                .get(&s.seq)
                .map_or((0, Vec::new()), |&(len, b)| (len, b.clone()));
            json!({
                "seq": s.seq,
                "request": s.request,
                "choice": s.choice,
                "state": match s.state {
                    SeqState::Running => "running",
                    SeqState::Waiting => "waiting",
                    SeqState::Beam => "beam",
                    SeqState::Reserved => "reserved",
                    SeqState::Speculative => "speculative",
                },
                "tokens": s.tokens,
                "computed": s.computed,
                "prompt_tokens": s.prompt_tokens,
                "cached_prompt_tokens": s.cached_prompt,
                "positions": positions,
                "blocks": blocks,
                // With a sliding window: the first position whose window data the sequence
                // still holds, and its window blocks (null: let go, or not yet taken).
                "window_from": windows.get(&s.seq).map(|w| w.0),
                "window_blocks": windows.get(&s.seq).map(|w| &w.1),
                // With recurrent layers: where its state snapshot and checkpoint are.
                "state_snapshot": snapshots.get(&s.seq).and_then(|p| p.0),
                "state_checkpoint": snapshots.get(&s.seq).and_then(|p| p.1),
            })
        })
        .collect();
    let steps: Vec<Value> = view
        .steps
        .iter()
        .map(|st| {
            json!({
                "id": st.id,
                "at": st.at,
                "seconds": st.seconds,
                "parts": st.parts.iter().map(|p| json!({
                    "request": p.request, "seq": p.seq, "rows": p.rows, "decode": p.decode,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let events: Vec<Value> = view
        .events
        .iter()
        .map(|e| {
            let mut v = json!({ "at": e.at, "after_step": e.after_step, "request": e.request });
            match e.kind {
                LoopEventKind::Admitted {
                    queue_seconds,
                    cached_tokens,
                } => {
                    v["kind"] = json!("admitted");
                    v["queue_seconds"] = json!(queue_seconds);
                    v["cached_tokens"] = json!(cached_tokens);
                }
                LoopEventKind::Preempted { seq } => {
                    v["kind"] = json!("preempted");
                    v["seq"] = json!(seq);
                }
                LoopEventKind::Cancelled => v["kind"] = json!("cancelled"),
                LoopEventKind::Failed => v["kind"] = json!("failed"),
                LoopEventKind::Finished => v["kind"] = json!("finished"),
            }
            v
        })
        .collect();
    let kv = &view.kv;
    let summary = handle.model_summary();
    Ok(json_body(&json!({
        "now": view.now,
        "queued": view.queued,
        "kv": {
            "block_size": kv.block_size,
            "blocks": kv.refs.len(),
            // The layers without a window (every layer when the model has none).
            "bytes_per_block": summary.kv_context_bytes_per_token * kv.block_size,
            "refs": kv.refs,
            "published": kv.published.iter().map(|&p| u8::from(p)).collect::<Vec<_>>(),
            "evictions": kv.evictions,
            "window": kv.window.as_ref().map(|w| json!({
                "size": w.size,
                "layers": summary.config.layer_is_sliding.iter().filter(|&&s| s).count(),
                "global_layers": summary.config.layer_is_sliding.iter().filter(|&&s| !s).count(),
                "blocks": w.refs.len(),
                "bytes_per_block": (summary.kv_bytes_per_token - summary.kv_context_bytes_per_token) * kv.block_size,
                "refs": w.refs,
                "companions": w.companions.iter().map(|&c| u8::from(c)).collect::<Vec<_>>(),
                "reclaims": w.reclaims,
            })),
            "recurrent": kv.recurrent.as_ref().map(|r| {
                let kinds = &summary.config.layer_kinds;
                let count = |k: rill_model::LayerKind| kinds.iter().filter(|&&x| x == k).count();
                let attention = count(rill_model::LayerKind::Attention);
                json!({
                    "layers": kinds.len() - attention,
                    "attention_layers": attention,
                    "kinds": {
                        "gated_deltanet": count(rill_model::LayerKind::DeltaNet),
                        "short_conv": count(rill_model::LayerKind::ShortConv),
                        "mamba2": count(rill_model::LayerKind::Mamba2),
                    },
                    "state_bytes": r.state_bytes,
                    "states_per_sequence": r.states_per_sequence,
                    "max_sequences": r.max_sequences,
                    "free_sequences": r.free_sequences,
                    "stored_snapshots": r.stored_snapshots,
                    "store_capacity": r.store_capacity,
                    // What keys and values of these layers would take per position, were they
                    // attention layers like the others.
                    "kv_equivalent_bytes_per_token": summary.kv_bytes_per_token
                        / attention.max(1) * (kinds.len() - attention),
                })
            }),
        },
        "sequences": sequences,
        "steps": steps,
        "events": events,
    })))
}
