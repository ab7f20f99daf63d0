//! A loaded model: the mapped file, its configuration and weights, a thread pool, and the
//! buffers the forward pass reuses.

use std::path::Path;

use rill_gguf::GgufFile;
use rill_kernels::ThreadPool;

use crate::forward::Workspace;
use crate::{KvCache, KvTypes, ModelConfig, ModelError, Precision, StageTimes, Weights};

/// More compute threads than this is a mistake, not a configuration.
pub const MAX_THREADS: usize = 512;

pub struct Model {
    pub(crate) file: GgufFile,
    pub(crate) config: ModelConfig,
    pub(crate) weights: Weights,
    pub(crate) pool: ThreadPool,
    pub(crate) workspace: Workspace,
    /// Time per stage of the forward pass, while profiling is on.
    pub(crate) profile: Option<StageTimes>,
    /// The residual stream of the last pass, while capturing is on ([`Model::set_capture`]).
    pub(crate) capture: Option<crate::Capture>,
    /// The KV element types every cache made for this model uses, when set
    /// ([`Model::set_kv_types`]); else each precision's default.
    pub(crate) kv_types: Option<KvTypes>,
    /// Per block, its heads' value Gram matrices for the glass box's value-weighted attention,
    /// computed on first use ([`Model::head_readout`]).
    pub(crate) value_grams: Vec<std::sync::OnceLock<Vec<Vec<f32>>>>,
    /// The recurrent layers' state a cache must hold for this model (hybrids only).
    pub(crate) recurrent_shape: Option<crate::RecurrentShape>,
    /// What a cache for this model keeps per layer (computed once: the pass checks it).
    pub(crate) kv_layout: crate::KvLayout,
    /// While on, every pass appends its rows' last hidden states here ([`Model::set_hidden_log`]).
    pub(crate) hidden_log: Option<HiddenLog>,
    /// The output head's 4-bit copy for two-pass logits, once made ([`Model::set_two_pass_head`]).
    pub(crate) two_pass: crate::two_pass_head::TwoPassState,
}

/// Rows' last hidden states (after the final norm: what the output head reads), in the order
/// their passes ran: the input of Qwen3.5's MTP draft.
#[derive(Debug, Clone, Default)]
pub struct HiddenLog {
    /// Each row's sequence and position.
    pub rows: Vec<(crate::SeqId, usize)>,
    /// `rows.len() × d_model` values.
    pub data: Vec<f32>,
}

/// What one token costs, from the model's shapes.
#[derive(Debug, Clone, Copy)]
pub struct ModelCost {
    /// Parameters in the weight matrices and vectors (the tied head counted once).
    pub parameters: u64,
    /// Floating-point operations of one token's forward pass at context length 0 (2 per
    /// multiply-add), output head included.
    pub flops_per_token: u64,
    /// Extra attention FLOPs per token per cached position.
    pub attention_flops_per_position: u64,
    /// Weight bytes read to produce one token's logits (every matrix once, the head included).
    pub weight_bytes_per_token: u64,
}

impl Model {
    /// Opens a GGUF file and prepares the model, with `threads` compute threads (0: all cores).
    pub fn load(path: impl AsRef<Path>, threads: usize) -> Result<Model, ModelError> {
        let file = GgufFile::open(path)?;
        Model::from_file(file, threads)
    }

    pub fn from_file(file: GgufFile, threads: usize) -> Result<Model, ModelError> {
        let config = ModelConfig::from_file(&file)?;
        let weights = Weights::load(&file, &config)?;
        let threads = if threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            threads
        };
        let value_grams = (0..config.n_layers)
            .map(|_| std::sync::OnceLock::new())
            .collect();
        Ok(Model {
            recurrent_shape: crate::RecurrentShape::of(&config),
            kv_layout: crate::KvLayout::of(&config),
            hidden_log: None,
            two_pass: Default::default(),
            value_grams,
            file,
            config,
            weights,
            pool: ThreadPool::new(threads),
            workspace: Workspace::default(),
            profile: None,
            capture: None,
            kv_types: None,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Starts (empty) or stops keeping every pass's rows' last hidden states (after the final
    /// norm); [`Model::take_hidden_log`] hands them over.
    pub fn set_hidden_log(&mut self, on: bool) {
        self.hidden_log = on.then(HiddenLog::default);
    }

    /// The hidden states kept since the log started or was last taken (empty when off).
    pub fn take_hidden_log(&mut self) -> HiddenLog {
        match &mut self.hidden_log {
            Some(log) => std::mem::take(log),
            None => HiddenLog::default(),
        }
    }

    /// When the output head may take two passes ([`crate::TwoPassMode`]; `Auto` by default):
    /// where this model's head qualifies, its 4-bit copy is made now (else on first use), and
    /// dropped when the mode leaves no use for it. Rows whose [`crate::HeadCut`] is not `Full`
    /// then get two-pass logits on the fast path.
    pub fn set_two_pass_head(&mut self, mode: crate::TwoPassMode) -> Result<(), ModelError> {
        self.two_pass.mode = mode;
        if !self.has_two_pass_head() {
            self.two_pass.sketch = None;
            return Ok(());
        }
        self.ensure_sketch()
    }

    /// Whether the output head may take two passes under the current mode.
    pub fn has_two_pass_head(&self) -> bool {
        use crate::two_pass_head::sketch::{sketchable, worth_by_default};
        let head = &self.weights.output;
        match self.two_pass.mode {
            crate::TwoPassMode::Auto => worth_by_default(head),
            crate::TwoPassMode::On => sketchable(head),
            crate::TwoPassMode::Off => false,
        }
    }

    /// Bytes the two-pass head's copy takes in memory (0 before it is made).
    pub fn two_pass_head_bytes(&self) -> usize {
        self.two_pass.sketch.as_ref().map_or(0, |s| s.bytes())
    }

    /// What the output head did since the model loaded or [`Model::reset_head_stats`].
    pub fn head_stats(&self) -> crate::HeadStats {
        self.two_pass.stats
    }

    pub fn reset_head_stats(&mut self) {
        self.two_pass.stats = Default::default();
    }

    pub(crate) fn ensure_sketch(&mut self) -> Result<(), ModelError> {
        if self.two_pass.sketch.is_some() || !self.has_two_pass_head() {
            return Ok(());
        }
        let head = &self.weights.output;
        let (_, layout) = head.fast_data(&self.file);
        let sketch = crate::two_pass_head::sketch::HeadSketch::build(
            head,
            head.data(&self.file),
            layout,
            &self.pool,
            crate::two_pass_head::sketch::SKETCH_TYPE,
        )?;
        self.two_pass.sketch = Some(sketch);
        Ok(())
    }

    /// What a KV cache for this model keeps per layer.
    pub fn kv_layout(&self) -> &crate::KvLayout {
        &self.kv_layout
    }

    /// Starts (with empty totals) or stops timing each stage of the forward pass; see
    /// [`Model::stage_times`]. The timing is a clock read per stage per layer: negligible next
    /// to the stages themselves.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(StageTimes::default);
    }

    /// Time and arithmetic per stage summed over the passes since profiling started or was
    /// last reset (None when profiling is off).
    pub fn stage_times(&self) -> Option<&StageTimes> {
        self.profile.as_ref()
    }

    /// Empties the totals of [`Model::stage_times`], keeping profiling on.
    pub fn reset_stage_times(&mut self) {
        if let Some(p) = self.profile.as_mut() {
            p.reset();
        }
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// The model's compute threads, for work beside the forward pass (the lens's per-layer
    /// readings) that should use every core as the pass does.
    pub fn pool(&self) -> &rill_kernels::pool::ThreadPool {
        &self.pool
    }

    /// A KV cache for this model with room for `capacity_tokens` positions, of
    /// [`Model::kv_types`].
    pub fn new_kv_cache(
        &self,
        capacity_tokens: usize,
        precision: Precision,
    ) -> Result<KvCache, crate::KvError> {
        KvCache::for_model(&self.config, capacity_tokens, self.kv_types(precision))
    }

    /// [`Model::new_kv_cache`] with room for only `window_capacity_tokens` positions in the
    /// sliding-window layers (which let go of what their window no longer reads).
    pub fn new_windowed_kv_cache(
        &self,
        capacity_tokens: usize,
        window_capacity_tokens: usize,
        precision: Precision,
    ) -> Result<KvCache, crate::KvError> {
        let types = self.kv_types(precision);
        KvCache::for_model_windowed(&self.config, capacity_tokens, window_capacity_tokens, types)
    }

    /// Makes every KV cache made for this model from now on store keys and values as `types`
    /// (`None`: the precision's default); an error if the model's head size does not fit them.
    pub fn set_kv_types(&mut self, types: Option<KvTypes>) -> Result<(), crate::KvError> {
        if let Some(t) = types {
            self.kv_layout.check_types(t)?;
        }
        self.kv_types = types;
        Ok(())
    }

    /// The KV element types caches of `precision` get: those set by [`Model::set_kv_types`],
    /// else f32 for the exact path and f16 for the fast one (as llama.cpp).
    pub fn kv_types(&self, precision: Precision) -> KvTypes {
        self.kv_types
            .unwrap_or_else(|| KvTypes::for_precision(precision))
    }

    /// Costs per token, from the shapes alone.
    /// Layers that attend over cached keys and values (all but the recurrent ones).
    pub fn n_attention_layers(&self) -> usize {
        self.weights
            .layers
            .iter()
            .filter(|l| l.mixer.attention().is_some())
            .count()
    }

    pub fn cost(&self) -> ModelCost {
        let c = &self.config;
        let mut matmul_macs: u64 = 0;
        let mut weight_bytes: u64 = 0;
        let mut parameters: u64 = 0;
        for (w, share) in self.weights.matrices() {
            let n = (w.rows * w.cols) as u64;
            parameters += n;
            // The embeddings are lookups, unless the first doubles as the head.
            let per_layer_table = (self.weights.per_layer_inputs.as_ref())
                .is_some_and(|p| std::ptr::eq(w, &p.token_embd));
            let lookup = std::ptr::eq(w, &self.weights.token_embd) && !self.weights.tied_output;
            if !lookup && !per_layer_table {
                matmul_macs += (n as f64 * share) as u64;
                weight_bytes += (w.bytes() as f64 * share) as u64;
            }
        }
        let vectors: usize = self.weights.layers.iter().map(|l| l.vector_len()).sum();
        parameters += (vectors + self.weights.output_norm.len()) as u64;
        ModelCost {
            parameters,
            flops_per_token: 2 * matmul_macs,
            // Only attention layers read every cached position (recurrent ones: a fixed state).
            attention_flops_per_position: (0..c.n_layers)
                .filter(|&il| c.layer_kinds[il] == crate::LayerKind::Attention)
                .map(|il| (c.n_heads * c.layer_attention[il].head_dim * 2 * 2) as u64)
                .sum(),
            weight_bytes_per_token: weight_bytes,
        }
    }
}
