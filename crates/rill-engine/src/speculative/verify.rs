//! The acceptance rule of speculative sampling (Leviathan et al. 2022, Chen et al. 2023): a token
//! `x` drafted from `q` is kept with probability `min(1, p(x) / q(x))`; on rejection a token is
//! drawn from the residual `max(0, p - q)`, normalised. Whatever `q` is, the token that comes out
//! is distributed exactly as `p`.

use crate::{draw_from, Rng};

/// What became of a drafted token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// The drafted token is kept; `probability` is its probability under `p`.
    Accepted { probability: f32 },
    /// The drafted token is rejected and `token` drawn from the residual instead;
    /// `probability` is its probability under `p`.
    Rejected { token: u32, probability: f32 },
}

impl Verdict {
    pub fn is_accepted(&self) -> bool {
        matches!(self, Verdict::Accepted { .. })
    }
}

/// Probability of `token` in a distribution of `(token, probability)` pairs (0 if absent).
pub fn probability_of(dist: &[(u32, f32)], token: u32) -> f32 {
    dist.iter()
        .find(|&&(t, _)| t == token)
        .map_or(0.0, |&(_, p)| p)
}

/// Judges drafted tokens; keeps its buffers between calls.
#[derive(Debug, Clone, Default)]
pub struct Verifier {
    /// `q` by token id while a residual is computed; all zero otherwise.
    dense_q: Vec<f32>,
    residual: Vec<(u32, f32)>,
}

impl Verifier {
    pub fn new() -> Verifier {
        Verifier::default()
    }

    /// Judges `drafted`, drawn from the draft distribution `q`, against the target distribution
    /// `p` (both `(token, probability)` pairs summing to 1, as
    /// [`SamplerChain::probabilities`](crate::SamplerChain::probabilities) gives them). Takes at
    /// most two uniforms from `rng`: one to accept when `p(x) < q(x)`, one to draw from the
    /// residual. `greedy` (`p` keeps one token) takes none: the drafted token is kept if it is
    /// that token, else that token replaces it.
    pub fn verify(
        &mut self,
        p: &[(u32, f32)],
        q: &[(u32, f32)],
        drafted: u32,
        greedy: bool,
        rng: &mut Rng,
    ) -> Verdict {
        let px = probability_of(p, drafted);
        let qx = probability_of(q, drafted);
        if px > 0.0 {
            let keep = px >= qx || greedy || rng.next_f64() * f64::from(qx) < f64::from(px);
            if keep {
                return Verdict::Accepted { probability: px };
            }
        }
        self.residual_of(p, q);
        if self.residual.is_empty() {
            // Only when p and q agree up to rounding (a rejection means q(x) > p(x), so some
            // other token has p > q): p itself is then the residual.
            self.residual.extend_from_slice(p);
        }
        let picked = if greedy {
            self.residual
                .iter()
                .copied()
                .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
        } else {
            draw_from(rng, &self.residual)
        };
        let token = picked.map_or(drafted, |(t, _)| t);
        Verdict::Rejected {
            token,
            probability: probability_of(p, token),
        }
    }

    /// The residual `max(0, p - q)` (unnormalised: [`draw_from`] normalises).
    fn residual_of(&mut self, p: &[(u32, f32)], q: &[(u32, f32)]) {
        self.residual.clear();
        let top = q.iter().map(|&(t, _)| t as usize + 1).max().unwrap_or(0);
        if self.dense_q.len() < top {
            self.dense_q.resize(top, 0.0);
        }
        for &(t, pr) in q {
            self.dense_q[t as usize] += pr;
        }
        for &(t, pr) in p {
            let r = pr - self.dense_q.get(t as usize).copied().unwrap_or(0.0);
            if r > 0.0 {
                self.residual.push((t, r));
            }
        }
        for &(t, _) in q {
            self.dense_q[t as usize] = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The output token is distributed as p, for a q unlike p (exact frequencies over many
    /// draws, within a few standard errors).
    #[test]
    fn accepted_or_resampled_tokens_follow_p() {
        let p = [(0u32, 0.5f32), (1, 0.3), (2, 0.2)];
        let q = [(0u32, 0.1f32), (1, 0.2), (2, 0.3), (3, 0.4)];
        let mut rng = Rng::new(7);
        let mut v = Verifier::new();
        let n = 200_000;
        let mut counts = [0usize; 4];
        let mut accepted = 0;
        for _ in 0..n {
            let (x, _) = draw_from(&mut rng, &q).unwrap();
            let token = match v.verify(&p, &q, x, false, &mut rng) {
                Verdict::Accepted { .. } => {
                    accepted += 1;
                    x
                }
                Verdict::Rejected { token, .. } => token,
            };
            counts[token as usize] += 1;
        }
        for (t, &c) in counts.iter().enumerate() {
            let want = probability_of(&p, t as u32) as f64;
            let got = c as f64 / n as f64;
            let se = (want * (1.0 - want) / n as f64).sqrt().max(1e-9);
            assert!(
                (got - want).abs() < 5.0 * se + 1e-12,
                "token {t}: {got} vs {want}"
            );
        }
        // Acceptance rate = Σ min(p, q) = 0.1 + 0.2 + 0.2.
        let rate = accepted as f64 / n as f64;
        assert!((rate - 0.5).abs() < 0.01, "{rate}");
    }

    #[test]
    fn greedy_keeps_the_argmax_and_draws_nothing() {
        let mut v = Verifier::new();
        let mut rng = Rng::new(1);
        let before = rng.clone().next_u64();
        let p = [(4u32, 1.0f32)];
        assert_eq!(
            v.verify(&p, &[(4, 1.0)], 4, true, &mut rng),
            Verdict::Accepted { probability: 1.0 }
        );
        assert_eq!(
            v.verify(&p, &[(9, 1.0)], 9, true, &mut rng),
            Verdict::Rejected {
                token: 4,
                probability: 1.0
            }
        );
        assert_eq!(rng.next_u64(), before);
    }

    #[test]
    fn one_hot_draft_removes_the_rejected_token() {
        let p = [(0u32, 0.6f32), (1, 0.4)];
        let mut v = Verifier::new();
        let mut rng = Rng::new(3);
        for _ in 0..1000 {
            match v.verify(&p, &[(0, 1.0)], 0, false, &mut rng) {
                Verdict::Accepted { probability } => assert_eq!(probability, 0.6),
                Verdict::Rejected { token, probability } => {
                    assert_eq!((token, probability), (1, 0.4))
                }
            }
        }
    }
}
