//! Choosing the next token: greedy, or a draw at a temperature from a seeded generator.

use crate::{EngineError, Rng};

/// How to pick tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), EngineError> {
        // A temperature so small that 1/T overflows would turn probabilities into NaN.
        if !(self.temperature.is_finite()
            && self.temperature >= 0.0
            && (self.temperature == 0.0 || (1.0 / self.temperature).is_finite()))
        {
            return Err(EngineError::BadParameter(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            )));
        }
        Ok(())
    }
}

/// A sequence's sampler: its parameters, its own generator, and a reusable probability buffer.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    probs: Vec<f32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler, EngineError> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: Rng::new(params.seed),
            probs: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks a token from `logits`; returns it with the probability it was drawn with (1 for
    /// greedy).
    /// Empty `logits` (no vocabulary) give token 0 with probability 0.
    pub fn sample(&mut self, logits: &[f32]) -> (u32, f32) {
        if logits.is_empty() {
            return (0, 0.0);
        }
        if self.params.temperature == 0.0 {
            return (argmax(logits), 1.0);
        }
        let inv_t = 1.0 / self.params.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        self.probs.clear();
        let mut sum = 0.0f64;
        for &l in logits {
            let p = ((l - max) * inv_t).exp();
            sum += f64::from(p);
            self.probs.push(p);
        }
        let target = self.rng.next_f64() * sum;
        let mut acc = 0.0f64;
        let mut chosen = argmax(logits) as usize;
        for (i, &p) in self.probs.iter().enumerate() {
            acc += f64::from(p);
            if acc > target && p > 0.0 {
                chosen = i;
                break;
            }
        }
        (chosen as u32, (f64::from(self.probs[chosen]) / sum) as f32)
    }
}

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

/// The `k` most likely tokens with their natural-log probabilities, most likely first (ties:
/// lower id first).
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let norm = rill_kernels::ops::log_normalizer(logits);
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &l) in logits.iter().enumerate() {
        if best.len() == k && l <= best[k - 1].0 {
            continue;
        }
        let at = best.partition_point(|&(v, _)| v >= l);
        best.insert(at, (l, i as u32));
        best.truncate(k);
    }
    best.into_iter().map(|(l, i)| (i, l - norm)).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn top_logprobs_are_sorted_and_normalised() {
        let logits = [1.0f32, 4.0, 2.0, 4.0, -1.0];
        let top = top_logprobs(&logits, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        let total: f32 = top_logprobs(&logits, 10).iter().map(|t| t.1.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(top_logprobs(&logits, 0).is_empty());
    }

    use super::*;

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9]).0, 1);
    }

    #[test]
    fn seeded_draws_repeat_and_follow_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let params = SamplingParams {
            temperature: 1.0,
            seed: 7,
        };
        let draw = |n| {
            let mut s = Sampler::new(params).unwrap();
            (0..n).map(|_| s.sample(&logits).0).collect::<Vec<_>>()
        };
        let a = draw(4000);
        assert_eq!(a, draw(4000));
        assert!(!a.contains(&2));
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
    }

    #[test]
    fn bad_temperature_is_rejected() {
        for t in [-1.0, f32::NAN, f32::INFINITY, 1e-40] {
            assert!(Sampler::new(SamplingParams {
                temperature: t,
                seed: 0
            })
            .is_err());
        }
    }
}
