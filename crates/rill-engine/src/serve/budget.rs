//! How the KV budget is shared out between the global layers' arena and the sliding-window
//! layers', and what a budget holds.

use rill_model::{KvCache, KvTypes};

use super::ServeConfig;

/// How `kv_cache_bytes` is shared between the global layers' blocks and the sliding-window
/// layers' (0 without a window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvSplit {
    pub blocks: usize,
    pub window_blocks: usize,
}

/// Conversation length the automatic split of the KV budget is made for (or the served
/// context, when shorter).
pub const KV_SPLIT_CONVERSATION_TOKENS: usize = 4096;

/// The recurrent layers' share of the budget (hybrid models): state for `sequences`
/// sequences (each its state and a snapshot) and `snapshots` prefix-cache snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateBudget {
    pub sequences: usize,
    pub snapshots: usize,
    pub bytes: usize,
}

/// Sequences a hybrid model's state is sized for beyond `max_running`: beams, forks and the
/// loop's own reservations.
pub const STATE_HEADROOM_SEQUENCES: usize = 16;

/// The recurrent state's share of `kv_cache_bytes`, for a model with recurrent layers: room
/// for `max_running` sequences and some headroom (with a stored snapshot for every other
/// one), but never more than half the budget (then fewer sequences run at once: admission
/// waits for a free state).
pub fn state_budget(mc: &rill_model::ModelConfig, config: &ServeConfig) -> Option<StateBudget> {
    let shape = rill_model::RecurrentShape::of(mc)?;
    let state = shape.state_bytes().max(1);
    // A sequence's two slots and half a stored snapshot.
    let unit = 2 * state + state / 2;
    let wanted = config.max_running + STATE_HEADROOM_SEQUENCES;
    let sequences = wanted.min(config.kv_cache_bytes / 2 / unit).max(1);
    let snapshots = sequences / 2 + 1;
    Some(StateBudget {
        sequences,
        snapshots,
        bytes: sequences * 2 * state + snapshots * state,
    })
}

/// Shares the KV budget out between the global layers and the sliding-window layers.
///
/// `kv_window_cache_bytes`, when set, is the window layers' share. Otherwise the budget is
/// split so that both arenas fill together with conversations of
/// [`KV_SPLIT_CONVERSATION_TOKENS`] (a window and two blocks each in the window arena), for at
/// most twice `max_running` of them (the second half keeps finished conversations' last
/// windows for their next turns), plus one step's prompt rows. Longer conversations then fit
/// fewer at once, shorter ones as many as `max_running` allows.
pub fn split_kv_budget(
    mc: &rill_model::ModelConfig,
    kv_types: KvTypes,
    config: &ServeConfig,
) -> KvSplit {
    let block = KvCache::DEFAULT_BLOCK_SIZE;
    // Recurrent layers keep no keys or values (nor do layers reading another's); the
    // recurrent state comes out of the budget first.
    let layout = rill_model::KvLayout::of(mc);
    let all = layout.bytes_per_token(kv_types, |_| true) * block;
    let state = state_budget(mc, config).map_or(0, |s| s.bytes);
    let budget = config.kv_cache_bytes.saturating_sub(state);
    let Some(window) = rill_model::SlidingWindow::of(mc) else {
        return KvSplit {
            blocks: budget / all.max(1),
            window_blocks: 0,
        };
    };
    let in_window = |l: usize| window.layers.get(l) == Some(&true);
    let windowed = layout.bytes_per_token(kv_types, in_window) * block;
    let global = (all - windowed).max(1);
    let per_sequence = window.size.div_ceil(block) + 2;
    let one_step = config.max_batch_tokens.div_ceil(block);
    let window_blocks = match config.kv_window_cache_bytes {
        0 => {
            let context = match config.context {
                0 => mc.context_length,
                c => c.min(mc.context_length),
            };
            let conversation = context
                .clamp(1, KV_SPLIT_CONVERSATION_TOKENS)
                .div_ceil(block);
            let per_conversation =
                conversation * global + per_sequence.min(conversation) * windowed;
            let fit = budget.saturating_sub(one_step * windowed) / per_conversation;
            fit.clamp(1, 2 * config.max_running) * per_sequence.min(conversation) + one_step
        }
        bytes => bytes / windowed.max(1),
    };
    let blocks = budget.saturating_sub(window_blocks.saturating_mul(windowed)) / global;
    if blocks >= window_blocks || config.kv_window_cache_bytes > 0 {
        return KvSplit {
            blocks,
            window_blocks,
        };
    }
    // Too small a budget to split: every layer gets the same blocks.
    let both = budget / all.max(1);
    KvSplit {
        blocks: both,
        window_blocks: both,
    }
}

/// What a KV budget holds, split as [`split_kv_budget`] splits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCapacity {
    pub split: KvSplit,
    /// Positions of context the global layers hold (one long conversation).
    pub positions: usize,
    /// Conversations of [`KV_SPLIT_CONVERSATION_TOKENS`] held at once.
    pub conversations: usize,
}

/// What `config.kv_cache_bytes` holds for a model.
pub fn kv_capacity(
    mc: &rill_model::ModelConfig,
    kv_types: KvTypes,
    config: &ServeConfig,
) -> KvCapacity {
    let block = KvCache::DEFAULT_BLOCK_SIZE;
    let split = split_kv_budget(mc, kv_types, config);
    let conversation = KV_SPLIT_CONVERSATION_TOKENS.div_ceil(block);
    let mut conversations = split.blocks / conversation;
    if let Some(window) = rill_model::SlidingWindow::of(mc) {
        let per_sequence = (window.size.div_ceil(block) + 2).min(conversation);
        let room = split
            .window_blocks
            .saturating_sub(config.max_batch_tokens.div_ceil(block));
        conversations = conversations.min(room / per_sequence);
    }
    KvCapacity {
        split,
        positions: split.blocks * block,
        conversations,
    }
}
