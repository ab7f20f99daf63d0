//! Making a cache: its arenas and block pools, for given shapes or for a model.

use super::*;

impl KvCache {
    /// A cache holding `capacity_tokens` positions (rounded up to whole blocks) for every layer,
    /// allocated now; an error if the arena cannot be allocated.
    pub fn new(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        capacity_tokens: usize,
        block_size: usize,
        types: impl Into<KvTypes>,
    ) -> Result<KvCache, KvError> {
        let layout = KvLayout::uniform(n_layers, n_kv_heads, head_dim);
        KvCache::build(layout, capacity_tokens, block_size, types.into(), None)
    }

    /// A cache whose `window.layers` keep their positions in an arena of their own, of
    /// `window_capacity_tokens` positions (rounded up to whole blocks, and at most the global
    /// layers' `capacity_tokens`), letting go of what their window no longer reads.
    pub fn with_window(
        layout: impl Into<KvLayout>,
        capacity_tokens: usize,
        block_size: usize,
        types: impl Into<KvTypes>,
        window: SlidingWindow,
        window_capacity_tokens: usize,
    ) -> Result<KvCache, KvError> {
        let window = Some((window, window_capacity_tokens));
        KvCache::build(
            layout.into(),
            capacity_tokens,
            block_size,
            types.into(),
            window,
        )
    }

    /// A cache of `layout` (see [`KvLayout::of`]) holding `capacity_tokens` positions, with
    /// a sliding window's arena of its own where `window` says so (as [`KvCache::with_window`]).
    pub fn with_layout(
        layout: KvLayout,
        capacity_tokens: usize,
        block_size: usize,
        types: impl Into<KvTypes>,
        window: Option<(SlidingWindow, usize)>,
    ) -> Result<KvCache, KvError> {
        KvCache::build(layout, capacity_tokens, block_size, types.into(), window)
    }

    fn build(
        layout: KvLayout,
        capacity_tokens: usize,
        block_size: usize,
        types: KvTypes,
        window: Option<(SlidingWindow, usize)>,
    ) -> Result<KvCache, KvError> {
        layout.check_types(types)?;
        let n_layers = layout.n_layers();
        let block_size = block_size.max(1);
        let n_blocks = capacity_tokens.div_ceil(block_size).max(1);
        let window = window.filter(|(w, _)| w.size > 0 && w.layers.iter().any(|&s| s));
        let n_window_blocks = window
            .as_ref()
            .map_or(0, |(_, cap)| cap.div_ceil(block_size).clamp(1, n_blocks));
        let sliding = |layer: usize| {
            window
                .as_ref()
                .is_some_and(|(w, _)| w.layers.get(layer) == Some(&true))
        };
        let global_row = layout.bytes_per_token(types, |l| !sliding(l)) as u128;
        let window_row = layout.bytes_per_token(types, sliding) as u128;
        let too_large = || KvError::TooLarge {
            capacity_tokens,
            bytes: (global_row * n_blocks as u128 + window_row * n_window_blocks as u128)
                * block_size as u128,
        };
        let elements = |blocks: usize, dim: usize| {
            blocks
                .checked_mul(block_size)
                .and_then(|n| n.checked_mul(dim))
                .filter(|_| u32::try_from(blocks).is_ok())
                .ok_or_else(too_large)
        };
        let mut keys = Vec::with_capacity(n_layers);
        let mut values = Vec::with_capacity(n_layers);
        for layer in 0..n_layers {
            let blocks = if sliding(layer) {
                n_window_blocks
            } else {
                n_blocks
            };
            let n = elements(blocks, layout.stored_dim(layer))?;
            keys.push(Arena::new(types.keys, n).ok_or_else(too_large)?);
            values.push(Arena::new(types.values, n).ok_or_else(too_large)?);
        }
        let pool = BlockPool::new(n_blocks, block_size, n_window_blocks).ok_or_else(too_large)?;
        Ok(KvCache {
            types,
            block_size,
            n_blocks,
            window: window.map(|(w, _)| w),
            rollback_slack: SlidingWindow::DEFAULT_ROLLBACK_SLACK,
            layout,
            keys,
            values,
            pool,
            sequences: HashMap::new(),
            states: None,
        })
    }

    /// A cache sized for `capacity_tokens` positions of a model, in every layer (the window
    /// layers, if any, still let go of what they no longer read).
    pub fn for_model(
        config: &crate::ModelConfig,
        capacity_tokens: usize,
        types: impl Into<KvTypes>,
    ) -> Result<KvCache, KvError> {
        KvCache::for_model_windowed(config, capacity_tokens, capacity_tokens, types)
    }

    /// A cache sized for `capacity_tokens` positions of a model in its global layers and
    /// `window_capacity_tokens` in its sliding-window layers (ignored for a model without).
    pub fn for_model_windowed(
        config: &crate::ModelConfig,
        capacity_tokens: usize,
        window_capacity_tokens: usize,
        types: impl Into<KvTypes>,
    ) -> Result<KvCache, KvError> {
        let layout = KvLayout::of(config);
        let window = SlidingWindow::of(config).map(|w| (w, window_capacity_tokens));
        let bs = Self::DEFAULT_BLOCK_SIZE;
        let cache = KvCache::build(layout, capacity_tokens, bs, types.into(), window)?;
        match RecurrentShape::of(config) {
            Some(shape) => cache.with_recurrent_state(
                shape,
                Self::DEFAULT_STATE_SEQUENCES,
                Self::DEFAULT_PREFIX_SNAPSHOTS,
            ),
            None => Ok(cache),
        }
    }
}
