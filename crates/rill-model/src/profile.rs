//! Where a forward pass spends its time: wall time and arithmetic per stage, summed over the
//! passes run while profiling is on ([`crate::Model::set_profiling`]). Off by default; when off
//! the forward pass only tests a flag per stage.

use std::time::{Duration, Instant};

/// A stage of the forward pass, in the order a layer runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Token embeddings and rotary angles.
    Embed,
    /// RMS norms before attention and before the feed-forward block.
    Norm,
    /// Query, key and value projections (one grouped product).
    Qkv,
    /// Query/key norms, rotary embedding and the KV-cache write.
    RopeKv,
    /// Attention over the cache.
    Attention,
    /// Attention output projection.
    AttnOut,
    /// Residual adds (with the post-norms where the architecture has them).
    Residual,
    /// Feed-forward gate and up projections (one grouped product).
    GateUp,
    /// Gate activation times up.
    Activation,
    /// Feed-forward down projection.
    Down,
    /// Final norm and the output head, for the rows that want logits.
    Head,
}

impl Stage {
    pub const ALL: [Stage; 11] = [
        Stage::Embed,
        Stage::Norm,
        Stage::Qkv,
        Stage::RopeKv,
        Stage::Attention,
        Stage::AttnOut,
        Stage::Residual,
        Stage::GateUp,
        Stage::Activation,
        Stage::Down,
        Stage::Head,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Embed => "embed",
            Stage::Norm => "norm",
            Stage::Qkv => "qkv",
            Stage::RopeKv => "rope+kv",
            Stage::Attention => "attention",
            Stage::AttnOut => "attn_out",
            Stage::Residual => "residual",
            Stage::GateUp => "gate+up",
            Stage::Activation => "activation",
            Stage::Down => "down",
            Stage::Head => "head",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Time and floating-point operations (2 per multiply-add) per stage, the passes and rows
/// they cover, and the bytes of weights their products read.
#[derive(Debug, Clone, Default)]
pub struct StageTimes {
    time: [Duration; Stage::ALL.len()],
    flops: [u64; Stage::ALL.len()],
    pub passes: u64,
    pub rows: u64,
    /// Bytes of weight matrices the products of these passes read (each matrix once per pass;
    /// of a mixture of experts, the experts some row chose), and the embedding rows looked up.
    pub weight_bytes: u64,
    /// What the output head did: rows through one or two passes, tokens refined, bytes.
    pub head: crate::HeadStats,
}

impl StageTimes {
    pub fn time(&self, stage: Stage) -> Duration {
        self.time[stage.index()]
    }

    pub fn flops(&self, stage: Stage) -> u64 {
        self.flops[stage.index()]
    }

    pub fn total_time(&self) -> Duration {
        self.time.iter().sum()
    }

    pub(crate) fn add_flops(&mut self, stage: Stage, flops: u64) {
        self.flops[stage.index()] += flops;
    }

    pub fn reset(&mut self) {
        *self = StageTimes::default();
    }
}

/// Splits the wall time of one pass into stages: each [`Laps::lap`] charges the time since the
/// previous one to a stage. Does nothing without a profile.
pub(crate) struct Laps<'a> {
    times: Option<&'a mut StageTimes>,
    last: Option<Instant>,
}

impl<'a> Laps<'a> {
    pub(crate) fn start(times: Option<&'a mut StageTimes>) -> Laps<'a> {
        let last = times.as_ref().map(|_| Instant::now());
        Laps { times, last }
    }

    #[inline]
    pub(crate) fn lap(&mut self, stage: Stage) {
        if let (Some(times), Some(last)) = (self.times.as_deref_mut(), self.last.as_mut()) {
            let now = Instant::now();
            times.time[stage.index()] += now - *last;
            *last = now;
        }
    }

    /// The profile, to count arithmetic into (None when not profiling).
    pub(crate) fn times(&mut self) -> Option<&mut StageTimes> {
        self.times.as_deref_mut()
    }
}
