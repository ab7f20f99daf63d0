//! Choosing the next token: a configurable chain of stages (penalties, logit bias, top-k,
//! typical, top-p, min-p, temperature) over the logits, then a draw from the processed
//! distribution with the sequence's own seeded generator.

mod chain;
mod params;
mod select;

pub(crate) use chain::check_tokens;
pub use chain::{draw_from, Draw, Sampler, SamplerChain};
pub use params::{SamplingParams, Stage};

/// Index of the largest logit (the first one on ties); NaNs never win.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9], &[], 0), (1, 1.0));
        assert_eq!(s.distribution(), &[(1, 1.0)]);
    }

    #[test]
    fn bad_temperature_is_rejected() {
        for t in [-1.0, f32::NAN, f32::INFINITY, 1e-40] {
            assert!(Sampler::new(SamplingParams::with_temperature(t, 0)).is_err());
        }
    }
}
