//! Serving many requests at once: one engine loop on a dedicated OS thread owns the model and
//! one paged KV cache, and runs iteration-level continuous batching over every request in
//! flight; requests come in through [`ServeHandle::submit`] and their tokens stream out through
//! a [`ResponseStream`] each.
//!
//! **Scheduling.** Every step builds one batch: first one decode row for every running sequence
//! that has a next token to compute, then the next chunk of every sequence still in prefill (in
//! admission order), then new sequences from the front of the waiting queue, as long as the
//! step's token budget ([`ServeConfig::max_batch_tokens`]), [`ServeConfig::max_running`] and the
//! KV cache allow. A long prompt is so split over several steps (chunked prefill) and never
//! stalls the others' decoding. A sequence is admitted only when blocks for its whole prompt can
//! be reserved with a block to spare for each running sequence (blocks kept only for the prefix
//! cache count as free); decoding grows sequences block by block, and when no block is left the
//! most recently admitted running sequence is preempted: its blocks are freed, it goes back to
//! the front of the queue and is recomputed later (mostly from the prefix cache), with its
//! generated tokens and its sampler state (so its output does not change). Each sequence samples with its own seeded
//! [`crate::SamplerChain`]; the kernels are batch invariant, so a request gives the same tokens
//! alone or batched with others, however its prompt is chunked and whatever was preempted.
//!
//! **Prefix caching.** Full KV blocks are published under a hash of their tokens chained with
//! their prefix's hash ([`rill_model::KvCache::publish_prefix`]); a new sequence starts with the
//! longest run of cached full blocks of its prompt and computes only the rest. Cached blocks no
//! sequence uses stay until their room is needed (least recently used first) and count as free.
//! `n > 1` choices prefill the prompt once and fork it (copy on write).
//!
//! **Cancellation** is dropping the [`ResponseStream`]: the loop notices within one step and
//! frees the request's blocks. **Backpressure**: at most [`ServeConfig::max_queue`] requests
//! wait; `submit` refuses more at once with [`SubmitError::QueueFull`].
mod budget;
mod engine_loop;
mod handle;
mod metrics;
mod scheduler;
pub mod timeline;
mod types;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{mpsc, Arc, Mutex};

use rill_model::KvCache;

use crate::{Engine, EngineError};
use metrics::Metrics;

pub use budget::{
    kv_capacity, split_kv_budget, state_budget, KvCapacity, KvSplit, StateBudget,
    KV_SPLIT_CONVERSATION_TOKENS, STATE_HEADROOM_SEQUENCES,
};
use handle::Handle;
pub(crate) use handle::{BeamRequest, Command, Incoming, Shared, SpeculativeRequest};
pub use handle::{Job, ModelSummary, ServeHandle};
pub use types::*;

/// Starts the engine loop on a thread of its own, with a KV cache of
/// [`ServeConfig::kv_cache_bytes`] allocated now.
pub fn spawn(engine: Engine, config: ServeConfig) -> Result<ServeHandle, EngineError> {
    let bad = |m: String| Err(EngineError::BadConfig(m));
    config.validate()?;
    let precision = engine.precision;
    let model = &engine.model;
    let mc = model.config();
    let kv_types = model.kv_types(precision);
    let block = KvCache::DEFAULT_BLOCK_SIZE;
    let split = split_kv_budget(mc, kv_types, &config);
    if split.blocks == 0 {
        return bad(format!(
            "kv_cache_bytes ({}) holds no KV block: one block of {block} positions takes {} bytes",
            config.kv_cache_bytes,
            model.kv_layout().bytes_per_token(kv_types, |_| true) * block
        ));
    }
    let window = rill_model::SlidingWindow::of(mc).map(|w| (w, split.window_blocks * block));
    let layout = model.kv_layout().clone();
    let mut kv = KvCache::with_layout(layout, split.blocks * block, block, kv_types, window)?;
    // Sequences in the loop never roll back: their window layers keep only their window (and
    // their recurrent layers no checkpoint).
    kv.set_rollback_slack(0);
    if let (Some(shape), Some(b)) = (
        rill_model::RecurrentShape::of(mc),
        budget::state_budget(mc, &config),
    ) {
        kv = kv.with_recurrent_state(shape, b.sequences, b.snapshots)?;
    }
    let (event_tx, event_rx) = if config.kv_events {
        kv.record_events(true);
        let (tx, rx) = tokio::sync::mpsc::channel(KV_EVENT_BACKLOG);
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let trained = mc.context_length.max(1);
    let context = match config.context {
        0 => trained,
        c => c.min(trained),
    }
    .min(kv.capacity_tokens());
    let name = if config.model_name.is_empty() {
        model
            .file()
            .metadata()
            .get("general.name")
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or("model")
            .to_string()
    } else {
        config.model_name.clone()
    };
    let info = ModelInfo {
        name,
        context,
        vocab_size: mc.vocab_size,
    };
    let summary = ModelSummary {
        config: mc.clone(),
        cost: model.cost(),
        precision,
        threads: model.threads(),
        kv_types,
        kv_block_size: kv.block_size(),
        kv_blocks_total: kv.total_blocks(),
        kv_bytes_per_token: kv.bytes_per_token(),
        kv_context_bytes_per_token: kv.global_bytes_per_token(),
        kv_window_blocks_total: kv.total_window_blocks(),
        state_bytes_per_sequence: kv.state_bytes_per_sequence(),
        state_sequences: if kv.recurrent().is_some() {
            kv.free_states()
        } else {
            0
        },
        state_arena_bytes: kv.state_arena_bytes(),
    };
    let shared = Arc::new(Shared {
        metrics: Metrics::new(),
        queued: AtomicUsize::new(0),
        closed: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        kv_total: AtomicUsize::new(kv.total_blocks()),
        kv_used: AtomicUsize::new(0),
        kv_cached_free: AtomicUsize::new(0),
        kv_window_total: kv.total_window_blocks(),
        kv_window_used: AtomicUsize::new(0),
        block_size: kv.block_size(),
        iterations: AtomicU64::new(0),
    });
    Metrics::set(&shared.metrics.kv_blocks_total, kv.total_blocks() as u64);
    Metrics::set(
        &shared.metrics.kv_window_blocks_total,
        kv.total_window_blocks() as u64,
    );
    let tokenizer = engine.tokenizer.clone();
    let (tx, rx) = mpsc::channel();
    let parts = engine_loop::Parts {
        engine,
        kv,
        config: config.clone(),
        context,
        shared: shared.clone(),
        commands: rx,
        kv_events: event_tx,
    };
    let thread = std::thread::Builder::new()
        .name("rill-engine-loop".into())
        .spawn(move || engine_loop::run(parts))
        .map_err(|e| EngineError::BadParameter(format!("cannot start the engine thread: {e}")))?;
    Ok(ServeHandle {
        inner: Arc::new(Handle {
            shared,
            commands: tx,
            thread: Mutex::new(Some(thread)),
            tokenizer,
            info,
            summary,
            config,
            next_id: AtomicU64::new(0),
            kv_events: Mutex::new(event_rx),
        }),
    })
}
