//! How positions are scaled before the rotary embedding: linear, YaRN, LongRoPE.

/// Position scaling applied before the rotary embedding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (`rope.scaling.type = linear`).
    Linear {
        factor: f32,
    },
    /// YaRN (`rope.scaling.type = yarn`; Peng et al. 2023): frequencies that turn fewer than
    /// `beta_slow` times over the original context are interpolated (divided by `factor`), those
    /// that turn more than `beta_fast` times are kept, with a linear ramp between; cos and sin
    /// are scaled by `attn_factor · (1 + 0.1 ln factor)`.
    Yarn {
        factor: f32,
        original_context: usize,
        beta_fast: f32,
        beta_slow: f32,
        /// `rope.scaling.attn_factor` (1 when absent), on top of YaRN's own magnitude scale.
        attn_factor: f32,
        /// Round the ramp's ends out to whole dimensions (YaRN's default; gpt-oss does not).
        truncate: bool,
    },
    /// LongRoPE (Phi-3): per-frequency divisors from the file's `rope_factors_short` /
    /// `rope_factors_long`, the long ones when the KV cache holds more than `original_context`
    /// positions (as llama.cpp decides by its context size; HF decides per forward call), and cos
    /// and sin scaled by `attn_factor`.
    LongRope {
        original_context: usize,
        attn_factor: f32,
    },
}

impl RopeScaling {
    /// Per-frequency divisors of the rotary frequencies (`rope_dim / 2` of them), where the
    /// scaling has them (YaRN).
    pub fn freq_divisors(&self, rope_dim: usize, base: f64) -> Option<Vec<f32>> {
        let RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } = *self
        else {
            return None;
        };
        // The dimension whose frequency turns `rotations` times over the original context.
        let dim_turning = |rotations: f32| {
            let turns = original_context as f64 / (f64::from(rotations) * std::f64::consts::TAU);
            rope_dim as f64 * turns.ln() / (2.0 * base.ln())
        };
        let (low, high) = (dim_turning(beta_fast), dim_turning(beta_slow));
        let (low, high) = if truncate {
            (low.floor(), high.ceil())
        } else {
            (low, high)
        };
        let (low, mut high) = (low.max(0.0), high.min(rope_dim as f64 - 1.0));
        if high == low {
            high += 0.001;
        }
        let factor = f64::from(factor);
        let divisors = (0..rope_dim / 2)
            .map(|i| {
                // 1 keeps the frequency (extrapolation), 0 interpolates it fully.
                let keep = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                (1.0 / ((1.0 - keep) / factor + keep)) as f32
            })
            .collect();
        Some(divisors)
    }

    /// The factor cos and sin are multiplied by.
    pub fn magnitude(&self) -> f32 {
        match *self {
            RopeScaling::Yarn {
                factor,
                attn_factor,
                ..
            } => attn_factor * (1.0 + 0.1 * factor.ln()),
            RopeScaling::LongRope { attn_factor, .. } => attn_factor,
            _ => 1.0,
        }
    }

    /// What a position becomes before the rotation.
    pub fn position(&self, pos: usize) -> f64 {
        match *self {
            RopeScaling::Linear { factor } => pos as f64 / f64::from(factor),
            RopeScaling::None | RopeScaling::Yarn { .. } | RopeScaling::LongRope { .. } => {
                pos as f64
            }
        }
    }
}
