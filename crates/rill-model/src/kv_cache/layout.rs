//! What each layer keeps in the KV cache: its heads' shape, or another layer's keys and values
//! it reads (Gemma 4's KV-shared layers), or nothing (a recurrent layer).

use super::{KvError, KvTypes, RecurrentShape};

/// One layer's part of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKv {
    /// KV heads (0: the layer keeps no keys or values).
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// The layer whose keys and values this one attends over: itself, or an earlier layer
    /// it shares them with (then it stores none of its own).
    pub source: usize,
}

impl LayerKv {
    /// Width of one position's keys (or values).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// Every layer's part of the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    layers: Vec<LayerKv>,
}

impl From<(usize, usize, usize)> for KvLayout {
    /// `(layers, KV heads, head size)`: every layer alike.
    fn from((n_layers, n_kv_heads, head_dim): (usize, usize, usize)) -> KvLayout {
        KvLayout::uniform(n_layers, n_kv_heads, head_dim)
    }
}

impl KvLayout {
    /// `n_layers` layers of `n_kv_heads` heads of `head_dim`, each storing its own.
    pub fn uniform(n_layers: usize, n_kv_heads: usize, head_dim: usize) -> KvLayout {
        KvLayout {
            layers: (0..n_layers)
                .map(|source| LayerKv {
                    n_kv_heads,
                    head_dim,
                    source,
                })
                .collect(),
        }
    }

    /// A model's layout: its attention layers' heads, KV sharing, and no keys or values for
    /// its recurrent layers.
    pub fn of(config: &crate::ModelConfig) -> KvLayout {
        let layers = (0..config.n_layers)
            .map(|il| {
                let shape = config.layer_attention[il];
                let attention = config.layer_kinds[il] == crate::LayerKind::Attention;
                LayerKv {
                    n_kv_heads: if attention { shape.n_kv_heads } else { 0 },
                    head_dim: shape.head_dim,
                    source: config.kv_source[il],
                }
            })
            .collect();
        KvLayout { layers }
    }

    /// Keeps no keys or values for `shape`'s recurrent layers.
    pub(super) fn drop_recurrent(&mut self, shape: &RecurrentShape) {
        for (il, layer) in self.layers.iter_mut().enumerate() {
            if shape.is_recurrent(il) {
                layer.n_kv_heads = 0;
            }
        }
    }

    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `il`'s part (as it reads it: a shared layer's heads are its source's).
    pub fn layer(&self, il: usize) -> Option<LayerKv> {
        self.layers.get(il).copied()
    }

    /// Whether layer `il` stores keys and values of its own.
    pub fn stores(&self, il: usize) -> bool {
        self.layers
            .get(il)
            .is_some_and(|l| l.n_kv_heads > 0 && l.source == il)
    }

    /// Width of the keys (or values) layer `il` stores per position (0 where it stores none).
    pub fn stored_dim(&self, il: usize) -> usize {
        if self.stores(il) {
            self.layers[il].kv_dim()
        } else {
            0
        }
    }

    /// Layers that store keys and values.
    pub fn n_storing(&self) -> usize {
        (0..self.layers.len()).filter(|&il| self.stores(il)).count()
    }

    /// Bytes one position takes in the storing layers `include` accepts.
    pub fn bytes_per_token(&self, types: KvTypes, include: impl Fn(usize) -> bool) -> usize {
        (0..self.layers.len())
            .filter(|&il| self.stores(il) && include(il))
            .map(|il| types.bytes_per_token(1, self.layers[il].kv_dim()))
            .sum()
    }

    /// The widest head (what KV element types must fit).
    pub fn max_head_dim(&self) -> usize {
        self.layers.iter().map(|l| l.head_dim).max().unwrap_or(0)
    }

    /// An error naming the type when some layer's heads do not fit keys or values of `types`.
    pub fn check_types(&self, types: KvTypes) -> Result<(), KvError> {
        for (il, l) in self.layers.iter().enumerate() {
            if self.stores(il) {
                types.check_head_dim(l.head_dim)?;
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for KvLayout {
    /// `6 layers: 2x16 (0-1, 3-4), 2x32 (2, 5); 3-5 read 1, 1, 2`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} layers", self.layers.len())?;
        let mut shapes: Vec<(usize, usize)> = Vec::new();
        for l in &self.layers {
            if !shapes.contains(&(l.n_kv_heads, l.head_dim)) {
                shapes.push((l.n_kv_heads, l.head_dim));
            }
        }
        let mut sep = ": ";
        for (heads, dim) in shapes {
            let n = (self.layers.iter())
                .filter(|l| (l.n_kv_heads, l.head_dim) == (heads, dim))
                .count();
            write!(f, "{sep}{n} of {heads} KV heads x {dim}")?;
            sep = ", ";
        }
        let shared: Vec<String> = (self.layers.iter().enumerate())
            .filter(|(il, l)| l.source != *il)
            .map(|(il, l)| format!("{il} reads {}", l.source))
            .collect();
        if !shared.is_empty() {
            write!(f, "; {}", shared.join(", "))?;
        }
        Ok(())
    }
}
