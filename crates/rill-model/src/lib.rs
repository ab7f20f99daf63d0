//! The transformer: architectures described as data ([`ModelConfig`]), weights as views into the
//! mmapped GGUF file ([`Weights`]), a paged KV cache ([`KvCache`]), and one forward pass over a
//! [`Batch`] of rows that serves every architecture.
//!
//! A batch row is `(sequence, token, position)`: a prompt contributes many rows (prefill), a
//! decoding sequence one, and rows of several sequences may share a pass. Every row's arithmetic
//! is independent of the other rows in its batch (batch invariance).

mod attention;
mod attention_layer;
mod config;
mod encoder;
mod error;
mod feed_forward;
mod forward;
mod kv_cache;
mod large_buffer;
mod lens;
mod linear;
mod model;
mod moe;
pub mod mtp;
mod pass_cost;
mod per_layer_input;
mod profile;
mod readout;
mod recurrent;
mod two_pass_head;
mod weights;
mod workspace;

pub mod synthetic;

pub use config::{
    Architecture, AttentionShape, DeltaNetConfig, LayerKind, Mamba2Config, ModelConfig, MoeConfig,
    MoeGating, QkNorm, RopeScaling,
};
pub use encoder::{EncoderEmbeddings, LayerNorm};
pub use error::ModelError;
pub use forward::{Batch, BatchRow, Precision};
pub use kv_cache::{
    BlockMap, KvCache, KvDtype, KvError, KvEvent, KvLayout, KvTypes, LayerKv, LayerState,
    PrefixHit, RecurrentMap, RecurrentShape, SeqId, SlidingWindow, WindowMap,
    MAX_QUANTIZED_HEAD_DIM,
};
pub use lens::Capture;
pub use model::{HiddenLog, Model, ModelCost};
pub use per_layer_input::{LayerInputWeights, PerLayerInputs};
pub use profile::{Stage, StageTimes};
pub use readout::HeadReadout;
pub use recurrent::{DeltaNetWeights, Mamba2Weights, ShortConvWeights};
pub use two_pass_head::{HeadCut, HeadStats, TwoPassMode, MAX_TOP_K};
pub use weights::{
    AttentionWeights, Expert, FeedForward, LayerWeights, Mixer, PlainFfn, SharedExpert, Weight,
    Weights,
};

pub use rill_kernels::ops::{GateActivation, RopeStyle};
