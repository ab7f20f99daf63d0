//! Log-probabilities of tokens: raw (the log-softmax of the model's logits) and processed (the
//! distribution the sampler chain actually drew from), their top alternatives and entropies.
//! Nothing here runs unless asked for.

use rill_kernels::ops::log_normalizer;

use crate::EngineError;

/// The most alternatives a token can report.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `Ok` when `n` alternatives can be reported (at most [`MAX_TOP_LOGPROBS`]).
pub fn check_top_logprobs(n: usize) -> Result<(), EngineError> {
    if n > MAX_TOP_LOGPROBS {
        return Err(EngineError::BadParameter(format!(
            "top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {n}"
        )));
    }
    Ok(())
}

/// The raw distribution of a row of logits, from one exponentiation pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogSoftmaxStats {
    /// `ln Σ exp(logits)`: a logit minus this is its log-probability.
    pub log_normalizer: f32,
    /// Entropy in nats.
    pub entropy: f32,
}

/// Normaliser and entropy of `softmax(logits)` (shifted by the maximum, summed in f64, like
/// [`log_normalizer`]). NaN logits are ignored; with no finite logit the normaliser is `-inf`
/// and the entropy 0.
pub fn log_softmax_stats(logits: &[f32]) -> LogSoftmaxStats {
    let max = logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return LogSoftmaxStats {
            log_normalizer: max,
            entropy: 0.0,
        };
    }
    let (mut s, mut t) = (0.0f64, 0.0f64);
    for &l in logits {
        let d = f64::from(l - max);
        // -inf and NaN contribute nothing.
        if d > f64::NEG_INFINITY {
            let e = d.exp();
            s += e;
            t += e * d;
        }
    }
    // H = -Σ p ln p with p = e / s and ln p = d - ln s: H = ln s - t / s.
    let ln_s = s.ln();
    LogSoftmaxStats {
        log_normalizer: max + ln_s as f32,
        entropy: (ln_s - t / s).max(0.0) as f32,
    }
}

/// Keeps `out` as the best `k` of the `(id, value)` pairs offered, highest value first, lower
/// id first on ties.
#[inline]
fn offer(out: &mut Vec<(u32, f32)>, k: usize, id: u32, v: f32) {
    let better = |a: (u32, f32), b: (u32, f32)| a.1 > b.1 || (a.1 == b.1 && a.0 < b.0);
    if out.len() == k && !better((id, v), out[k - 1]) {
        return;
    }
    let at = out.partition_point(|&e| better(e, (id, v)));
    if out.len() == k {
        out.pop();
    }
    out.insert(at, (id, v));
}

/// The `k` most likely tokens of the raw distribution with their log-probabilities, into `out`
/// (cleared; no allocation once it has room for `k + 1`). `log_normalizer` comes from
/// [`log_softmax_stats`] or [`log_normalizer`].
pub fn top_logprobs_into(logits: &[f32], k: usize, log_normalizer: f32, out: &mut Vec<(u32, f32)>) {
    out.clear();
    let k = k.min(logits.len());
    if k == 0 {
        return;
    }
    for (i, &l) in logits.iter().enumerate() {
        if !l.is_nan() {
            offer(out, k, i as u32, l);
        }
    }
    for e in out.iter_mut() {
        e.1 -= log_normalizer;
    }
}

/// `token`'s rank in `logits` (0: the most likely; ties go to the lower id).
pub fn rank_of(logits: &[f32], token: u32) -> usize {
    let l = logits[token as usize];
    // Counted as 0/1 sums, which vectorise: the higher logits, then the equal ones before it.
    let above: usize = logits.iter().map(|&x| usize::from(x > l)).sum();
    let tied_before: usize = logits[..token as usize]
        .iter()
        .map(|&x| usize::from(x == l))
        .sum();
    above + tied_before
}

/// KL(softmax(`p`) ‖ softmax(`q`)) in nats, summed in f64: how far the distribution of `q`'s
/// logits is from `p`'s, weighted by `p`. Tokens `p` gives no probability add nothing.
pub fn kl_divergence(p: &[f32], q: &[f32]) -> f64 {
    let (lp, lq) = (
        log_softmax_stats(p).log_normalizer,
        log_softmax_stats(q).log_normalizer,
    );
    let kl: f64 = p
        .iter()
        .zip(q)
        .map(|(&a, &b)| {
            let la = f64::from(a - lp);
            let pa = la.exp();
            if pa > 0.0 {
                pa * (la - f64::from(b - lq))
            } else {
                0.0
            }
        })
        .sum();
    kl.max(0.0)
}

/// The `k` most likely tokens with their natural-log probabilities, most likely first (ties:
/// lower id first).
pub fn top_logprobs(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut out = Vec::with_capacity(k.min(logits.len()) + 1);
    top_logprobs_into(logits, k, log_normalizer(logits), &mut out);
    out
}

/// A generated token's log-probabilities.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    /// Log-probability in the processed distribution (the one the token was drawn from).
    pub logprob: f32,
    /// Log-probability in the raw distribution (log-softmax of the logits).
    pub raw_logprob: f32,
    /// The most likely tokens of the processed distribution, most likely first; tokens the
    /// chain removed never appear (so there may be fewer than asked).
    pub top: Vec<(u32, f32)>,
    /// The most likely tokens of the raw distribution, most likely first.
    pub raw_top: Vec<(u32, f32)>,
    /// Entropy of the processed distribution, in nats (0 when greedy).
    pub entropy: f32,
    /// Entropy of the raw distribution, in nats.
    pub raw_entropy: f32,
}

impl TokenLogprobs {
    /// Fills `self` (reusing its buffers) for `token`, drawn with `probability` from the
    /// processed distribution `dist` computed from `logits`, with `top_n` alternatives.
    pub fn compute(
        &mut self,
        logits: &[f32],
        dist: &[(u32, f32)],
        token: u32,
        probability: f32,
        top_n: usize,
    ) {
        let raw = log_softmax_stats(logits);
        self.token = token;
        self.raw_logprob = logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&l| l - raw.log_normalizer);
        self.raw_entropy = raw.entropy;
        top_logprobs_into(logits, top_n, raw.log_normalizer, &mut self.raw_top);

        self.logprob = probability.ln();
        self.entropy = (-dist
            .iter()
            .filter(|&&(_, p)| p > 0.0)
            .map(|&(_, p)| f64::from(p) * f64::from(p).ln())
            .sum::<f64>())
        .max(0.0) as f32;
        self.top.clear();
        let k = top_n.min(dist.len());
        if k > 0 {
            for &(id, p) in dist {
                offer(&mut self.top, k, id, p);
            }
            for e in &mut self.top {
                e.1 = e.1.ln();
            }
        }
    }
}

/// A prompt token's log-probability given the tokens before it.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptTokenLogprobs {
    /// Position in the prompt (from 1: the first token has no prefix to be predicted from).
    pub position: usize,
    pub token: u32,
    /// Log-probability of `token` after the prefix (raw: log-softmax of the logits).
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first.
    pub top: Vec<(u32, f32)>,
    /// Entropy of the distribution at this position, in nats.
    pub entropy: f32,
}

impl PromptTokenLogprobs {
    /// From the logits of the row before `position` (which predict `token`).
    pub fn from_logits(
        logits: &[f32],
        position: usize,
        token: u32,
        top_n: usize,
    ) -> PromptTokenLogprobs {
        let raw = log_softmax_stats(logits);
        let mut top = Vec::new();
        top_logprobs_into(logits, top_n, raw.log_normalizer, &mut top);
        PromptTokenLogprobs {
            position,
            token,
            logprob: logits
                .get(token as usize)
                .map_or(f32::NEG_INFINITY, |&l| l - raw.log_normalizer),
            top,
            entropy: raw.entropy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_logprobs_are_sorted_and_normalised() {
        let logits = [1.0f32, 4.0, 2.0, 4.0, -1.0];
        let top = top_logprobs(&logits, 3);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
        let total: f32 = top_logprobs(&logits, 10).iter().map(|t| t.1.exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(top_logprobs(&logits, 0).is_empty());
    }

    #[test]
    fn stats_match_the_definitions() {
        let logits = [0.5f32, -1.0, 2.0, f32::NEG_INFINITY, 0.0];
        let s = log_softmax_stats(&logits);
        assert!((s.log_normalizer - log_normalizer(&logits)).abs() < 1e-6);
        let h: f64 = logits
            .iter()
            .map(|&l| f64::from(l - s.log_normalizer).exp())
            .filter(|&p| p > 0.0)
            .map(|p| -p * p.ln())
            .sum();
        assert!(
            (f64::from(s.entropy) - h).abs() < 1e-6,
            "{} vs {h}",
            s.entropy
        );
        // Uniform over 4 tokens: ln 4.
        let u = log_softmax_stats(&[3.0; 4]);
        assert!((u.entropy - 4f32.ln()).abs() < 1e-6);
        let none = log_softmax_stats(&[f32::NEG_INFINITY, f32::NAN]);
        assert_eq!(none.log_normalizer, f32::NEG_INFINITY);
        assert_eq!(none.entropy, 0.0);
    }

    #[test]
    fn processed_alternatives_come_from_the_distribution() {
        let logits = [1.0f32, 3.0, 2.0, 0.0];
        let dist = [(2u32, 0.25f32), (1, 0.75)];
        let mut lp = TokenLogprobs::default();
        lp.compute(&logits, &dist, 2, 0.25, 5);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((lp.logprob - 0.25f32.ln()).abs() < 1e-7);
        let h = -(0.25f32 * 0.25f32.ln() + 0.75 * 0.75f32.ln());
        assert!((lp.entropy - h).abs() < 1e-6);
        assert_eq!(lp.raw_top.len(), 4);
        assert_eq!(lp.raw_top[0].0, 1);
        assert!((lp.raw_logprob - (2.0 - log_normalizer(&logits))).abs() < 1e-6);
    }
}
