//! The sampler chain: logits in, a processed distribution out, a token drawn from it with the
//! chain's own generator.

use super::params::{check_token, SamplingParams, Stage};
use super::select::{self, by_logit_desc, tame, Cand};
use crate::{EngineError, Rng};

const NEG_INF: f32 = f32::NEG_INFINITY;

/// A sequence's sampler: its parameters, its own seeded generator, and buffers reused from one
/// step to the next (a step allocates nothing once they have grown to the vocabulary).
///
/// Each step masks banned tokens (and, before `min_tokens` tokens have been generated, the
/// tokens set with [`SamplerChain::set_min_tokens`]), then runs the stages in the configured
/// order, then normalises what is left: that is the distribution [`SamplerChain::draw`] draws
/// from. Stages that change nothing with the given parameters are skipped.
#[derive(Debug, Clone)]
pub struct SamplerChain {
    params: SamplingParams,
    rng: Rng,
    /// The stages that run, in order.
    stages: Vec<Stage>,
    /// Logit bias by token id, ascending, one entry per token.
    bias: Vec<(u32, f32)>,
    /// Ascending, deduplicated.
    banned: Vec<u32>,
    /// Masked while fewer than `min_tokens` tokens have been generated (ascending).
    suppressed: Vec<u32>,
    min_tokens: usize,
    /// The logits while every token is still a candidate (`dense`), once a stage wrote to them.
    work: Vec<f32>,
    /// `work` holds the dense logits (else the caller's logits are read as they are).
    owned: bool,
    /// Dense logits are `scale` times their values (temperature, applied lazily).
    scale: f32,
    /// The candidates once a stage has cut the vocabulary (`!dense`).
    cand: Vec<Cand>,
    dense: bool,
    /// Shifted exponentials of the dense logits.
    exps: Vec<f32>,
    /// Occurrences of each token in the penalty window; all zero between steps.
    counts: Vec<u32>,
    /// Tokens whose count is not zero.
    touched: Vec<u32>,
    /// The processed distribution of the last step.
    dist: Vec<(u32, f32)>,
    /// Tokens allowed at the next step (a bit per token), set by [`SamplerChain::mask_next`].
    allowed: Vec<u32>,
    masked: bool,
    last_draw: Option<Draw>,
}

/// The chain under its historical name.
pub type Sampler = SamplerChain;

impl SamplerChain {
    /// A chain for `params` (validated, token ids excepted: ids outside the logits a step is
    /// given are ignored; see [`SamplerChain::for_vocab`]).
    pub fn new(params: SamplingParams) -> Result<SamplerChain, EngineError> {
        params.validate()?;
        let mut stages: Vec<Stage> = params
            .order
            .iter()
            .copied()
            .filter(|&s| params.is_active(s))
            .collect();
        if params.is_greedy() {
            // Top-k, top-p and min-p always keep the most likely token: right before the
            // greedy temperature stage they change nothing (earlier, a stage between them and it
            // could depend on what they removed).
            if let Some(t) = stages.iter().position(|&s| s == Stage::Temperature) {
                let mut from = t;
                while from > 0
                    && matches!(stages[from - 1], Stage::TopK | Stage::TopP | Stage::MinP)
                {
                    from -= 1;
                }
                stages.drain(from..t);
            }
        }
        let mut bias: Vec<(u32, f32)> = params.logit_bias.clone();
        bias.sort_by_key(|&(id, _)| id);
        bias.dedup_by(|later, kept| {
            if later.0 == kept.0 {
                kept.1 = tame(kept.1 + later.1);
                true
            } else {
                false
            }
        });
        let mut banned = params.banned_tokens.clone();
        banned.sort_unstable();
        banned.dedup();
        Ok(SamplerChain {
            rng: Rng::new(params.seed),
            params,
            stages,
            bias,
            banned,
            suppressed: Vec::new(),
            min_tokens: 0,
            work: Vec::new(),
            owned: false,
            scale: 1.0,
            cand: Vec::new(),
            dense: true,
            exps: Vec::new(),
            counts: Vec::new(),
            touched: Vec::new(),
            dist: Vec::new(),
            allowed: Vec::new(),
            masked: false,
            last_draw: None,
        })
    }

    /// [`SamplerChain::new`] with every token id checked against a vocabulary of `vocab_size`.
    pub fn for_vocab(
        params: SamplingParams,
        vocab_size: usize,
    ) -> Result<SamplerChain, EngineError> {
        params.validate_for_vocab(vocab_size)?;
        SamplerChain::new(params)
    }

    /// Masks `tokens` (typically the end-of-generation and stop tokens) while fewer than
    /// `min_tokens` tokens have been generated (the `n_generated` of each step).
    pub fn set_min_tokens(&mut self, min_tokens: usize, tokens: &[u32]) {
        self.min_tokens = min_tokens;
        self.suppressed.clear();
        self.suppressed.extend_from_slice(tokens);
        self.suppressed.sort_unstable();
        self.suppressed.dedup();
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether the chain keeps only the most likely token (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.params.is_greedy()
    }

    /// What the next step reads of its logits ([`rill_model::HeadCut`]): only what its first
    /// cut keeps (greedy's token, top-k's set, min-p's band), when nothing before that cut
    /// moves or removes a token (penalties, bias, bans, a mask, the `min_tokens` suppression)
    /// and nothing reads the whole vocabulary (typical, top-p, or no cut at all): then the
    /// output head may take two passes and the chain's draw is the same. Every logit otherwise.
    pub fn head_cut(&self, n_generated: usize) -> rill_model::HeadCut {
        use rill_model::HeadCut;
        let suppressing = n_generated < self.min_tokens && !self.suppressed.is_empty();
        if self.masked || !self.banned.is_empty() || !self.bias.is_empty() || suppressing {
            return HeadCut::Full;
        }
        // Temperature applied before the cut: min-p's band is in scaled logits.
        let mut scale = 1.0f32;
        for stage in &self.stages {
            match stage {
                Stage::TopK => {
                    return HeadCut::TopK(self.params.top_k.min(u32::MAX as usize) as u32)
                }
                Stage::MinP => {
                    let band = -self.params.min_p.ln() / scale;
                    // Wider by a hair than the chain's own float threshold can round to.
                    return HeadCut::Within(band * 1.001 + 1e-3);
                }
                Stage::Temperature if self.params.temperature == 0.0 => return HeadCut::TopK(1),
                Stage::Temperature => scale /= self.params.temperature,
                Stage::Penalties | Stage::LogitBias | Stage::Typical | Stage::TopP => {
                    return HeadCut::Full
                }
            }
        }
        HeadCut::Full
    }

    /// The chain's generator: [`SamplerChain::draw`] takes one uniform from it per draw (none
    /// when greedy), so a verifier can interleave its own draws with the chain's.
    pub fn rng_mut(&mut self) -> &mut Rng {
        &mut self.rng
    }

    pub fn rng(&self) -> &Rng {
        &self.rng
    }

    /// Restricts the next [`SamplerChain::probabilities`] to the tokens whose bit is set in
    /// `allowed` (token `t` is bit `t % 32` of word `t / 32`; a structured-output constraint's
    /// mask): the others are removed before every stage, as banned tokens are. Applies to that
    /// one step only.
    pub fn mask_next(&mut self, allowed: &[u32]) {
        self.allowed.clear();
        self.allowed.extend_from_slice(allowed);
        self.masked = true;
    }

    /// Whether token `t` is allowed by the pending mask (every token when none is set).
    fn is_allowed(&self, t: usize) -> bool {
        !self.masked
            || self
                .allowed
                .get(t / 32)
                .is_some_and(|w| w >> (t % 32) & 1 == 1)
    }

    /// The distribution computed by the last [`SamplerChain::probabilities`].
    pub fn distribution(&self) -> &[(u32, f32)] {
        &self.dist
    }

    /// The processed distribution after `logits`: (token, probability) pairs, in no particular
    /// order, with probabilities above 0 summing to 1; tokens the chain removed are absent.
    /// Greedy gives one pair with probability 1. `history` is the sequence so far (prompt and
    /// generated tokens), for the penalties; `n_generated` counts generated tokens, for
    /// `min_tokens`. NaN logits count as `-inf`.
    ///
    /// Empty `logits` give an empty distribution. If the chain removes every token (every one
    /// banned or biased to `-inf`), the largest raw logit is taken with probability 1 (the
    /// largest among the tokens a [`SamplerChain::mask_next`] mask allows, if one is set).
    pub fn probabilities(
        &mut self,
        logits: &[f32],
        history: &[u32],
        n_generated: usize,
    ) -> &[(u32, f32)] {
        self.dist.clear();
        if logits.is_empty() {
            self.masked = false;
            return &self.dist;
        }
        self.dense = true;
        self.owned = false;
        self.scale = 1.0;
        self.cand.clear();
        if self.masked {
            self.own(logits);
            for (word, chunk) in self.work.chunks_mut(32).enumerate() {
                let bits = self.allowed.get(word).copied().unwrap_or(0);
                if bits == u32::MAX {
                    continue;
                }
                for (b, w) in chunk.iter_mut().enumerate() {
                    if bits >> b & 1 == 0 {
                        *w = NEG_INF;
                    }
                }
            }
        }
        let suppress = n_generated < self.min_tokens && !self.suppressed.is_empty();
        if !self.banned.is_empty() || suppress {
            self.own(logits);
            let masked = self.banned.iter().chain(if suppress {
                self.suppressed.iter()
            } else {
                [].iter()
            });
            for &t in masked {
                if let Some(w) = self.work.get_mut(t as usize) {
                    *w = NEG_INF;
                }
            }
        }
        for i in 0..self.stages.len() {
            match self.stages[i] {
                Stage::Penalties => self.penalties(logits, history),
                Stage::LogitBias => self.logit_bias(logits),
                Stage::TopK => self.top_k(logits),
                Stage::Typical => self.typical(logits),
                Stage::TopP => self.top_p(logits),
                Stage::MinP => self.min_p(logits),
                Stage::Temperature => self.temperature(logits),
            }
        }
        if self.dense {
            self.dense_distribution(logits);
        } else {
            select::softmax(&mut self.cand);
            self.dist
                .extend(self.cand.iter().filter(|c| c.p > 0.0).map(|c| (c.id, c.p)));
        }
        if self.dist.is_empty() {
            let best = if self.masked {
                let mut best: Option<usize> = None;
                for (i, &l) in logits.iter().enumerate() {
                    if self.is_allowed(i) && best.is_none_or(|b| tame(l) > tame(logits[b])) {
                        best = Some(i);
                    }
                }
                best.map_or_else(|| super::argmax(logits), |b| b as u32)
            } else {
                super::argmax(logits)
            };
            self.dist.push((best, 1.0));
        }
        self.masked = false;
        &self.dist
    }

    /// Draws a token from the last computed distribution; returns it with its probability.
    /// Takes exactly one uniform from the generator, none when greedy. Before any
    /// distribution, or after empty logits, gives token 0 with probability 0.
    pub fn draw(&mut self) -> (u32, f32) {
        self.last_draw = None;
        if self.params.is_greedy() {
            return self.dist.first().copied().unwrap_or((0, 0.0));
        }
        let u = self.rng.next_f64();
        match draw_at(u, &self.dist) {
            Some((token, p, from, to)) => {
                self.last_draw = Some(Draw {
                    uniform: u,
                    from,
                    to,
                });
                (token, p)
            }
            None => (0, 0.0),
        }
    }

    /// How the last [`SamplerChain::draw`] picked its token (None when greedy).
    pub fn last_draw(&self) -> Option<Draw> {
        self.last_draw
    }

    /// [`SamplerChain::probabilities`] then [`SamplerChain::draw`].
    pub fn sample(&mut self, logits: &[f32], history: &[u32], n_generated: usize) -> (u32, f32) {
        self.probabilities(logits, history, n_generated);
        self.draw()
    }

    // ----- the dense state: every token a candidate -----
    //
    // A token's logit is `scale * v`, with `v` from `work` once a stage has written to it
    // (`owned`), else straight from the caller's logits: stages that only read (top-k, min-p,
    // greedy, temperature) copy nothing.

    /// Makes `work` hold the dense logits (scale applied).
    fn own(&mut self, logits: &[f32]) {
        if !self.owned {
            self.work.clear();
            self.work.extend(logits.iter().map(|&l| tame(l)));
            self.owned = true;
        }
        if self.scale != 1.0 {
            let s = self.scale;
            self.work.iter_mut().for_each(|w| *w = tame(*w * s));
            self.scale = 1.0;
        }
    }

    /// The final softmax straight from the dense logits.
    fn dense_distribution(&mut self, logits: &[f32]) {
        let view = if self.owned { &self.work[..] } else { logits };
        let max = select::max_of(view);
        if max == NEG_INF {
            return;
        }
        let s = self.scale;
        let total = select::exps_into(view, s, scaled(max, s), &mut self.exps);
        let inv = 1.0 / total;
        self.dist.extend(
            self.exps
                .iter()
                .enumerate()
                .filter(|&(_, &e)| e > 0.0)
                .map(|(i, &e)| (i as u32, (f64::from(e) * inv) as f32)),
        );
    }

    /// Top-p (`TYPICAL` false) or typical sampling straight from the dense logits: the
    /// exponentials in one vectorised pass, the mass histogrammed by key, and only the tokens
    /// of the buckets that hold the prefix become candidates (and are sorted).
    fn dense_mass_prefix<const TYPICAL: bool>(&mut self, logits: &[f32], mass: f64) {
        const BUCKETS: usize = 512;
        let view = if self.owned { &self.work[..] } else { logits };
        let s = self.scale;
        let max = select::max_of(view);
        self.cand.clear();
        self.dense = false;
        if max == NEG_INF {
            return;
        }
        let top = scaled(max, s);
        let total = select::exps_into(view, s, top, &mut self.exps);
        let inv = 1.0 / total;
        let exps = &self.exps;
        // With d = logit - max (in (-87, 0] where e > 0) and p = e^d / total: the entropy is
        // ln(total) - Σ p d, and a token's surprisal is that far from it by |Σ p d - d|.
        let mean = if TYPICAL {
            (select::weighted_shift_sum(view, exps, s, top) * inv) as f32
        } else {
            0.0
        };
        let key = |v: f32| -> f32 {
            let d = v * s - top;
            if TYPICAL {
                (mean - d).abs()
            } else {
                -d
            }
        };
        // The largest key among tokens with e > 0: d is at least max(s * min - top, -87.4).
        let d_min = (scaled(select::min_of(view), s) - top).max(-87.4);
        let max_key = if TYPICAL {
            mean.abs().max((mean - d_min).abs())
        } else {
            -d_min
        };
        let inv_width = if max_key > 0.0 && max_key.is_finite() {
            (BUCKETS - 1) as f32 / max_key
        } else {
            0.0
        };
        // Saturating: +inf lands in the last bucket, NaN (never with e > 0) in the first.
        let bucket = |k: f32| -> usize { ((k * inv_width) as usize).min(BUCKETS - 1) };
        // Four interleaved histograms: consecutive tokens in one bucket do not wait on each
        // other's additions.
        let mut hists = [[0.0f64; BUCKETS]; 4];
        for (j, (&v, &e)) in view.iter().zip(exps).enumerate() {
            if e > 0.0 {
                hists[j & 3][bucket(key(v))] += f64::from(e);
            }
        }
        let mut hist = [0.0f64; BUCKETS];
        for (b, h) in hist.iter_mut().enumerate() {
            *h = hists[0][b] + hists[1][b] + hists[2][b] + hists[3][b];
        }
        let target = mass * total;
        let mut last = BUCKETS - 1;
        let mut acc = 0.0;
        for (b, &m) in hist.iter().enumerate() {
            acc += m;
            if acc >= target {
                last = b;
                break;
            }
        }
        loop {
            self.cand.clear();
            for (i, (&v, &e)) in view.iter().zip(exps).enumerate() {
                if e > 0.0 {
                    let k = key(v);
                    if bucket(k) <= last {
                        self.cand.push(Cand {
                            id: i as u32,
                            logit: scaled(v, s),
                            p: (f64::from(e) * inv) as f32,
                            key: k,
                        });
                    }
                }
            }
            if TYPICAL {
                self.cand
                    .sort_unstable_by(|a, b| a.key.total_cmp(&b.key).then(a.id.cmp(&b.id)));
            } else {
                self.cand.sort_unstable_by(by_logit_desc);
            }
            let mut acc = 0.0f64;
            let reached = self.cand.iter().position(|c| {
                acc += f64::from(c.p);
                acc >= mass
            });
            match reached {
                Some(i) => {
                    self.cand.truncate(i + 1);
                    return;
                }
                // Rounding: the histogram reached the mass, the sorted prefix not quite.
                None if last < BUCKETS - 1 => last += 1,
                None => return,
            }
        }
    }

    // ----- stages -----

    fn penalties(&mut self, logits: &[f32], history: &[u32]) {
        let n_vocab = logits.len();
        let window = &history[history.len().saturating_sub(self.params.repeat_last_n)..];
        if window.is_empty() {
            return;
        }
        if self.counts.len() < n_vocab {
            self.counts.resize(n_vocab, 0);
        }
        for &t in window {
            let i = t as usize;
            if i < n_vocab {
                if self.counts[i] == 0 {
                    self.touched.push(t);
                }
                self.counts[i] += 1;
            }
        }
        let rp = self.params.repeat_penalty;
        let presence = self.params.presence_penalty;
        let frequency = self.params.frequency_penalty;
        let penalise = |l: f32, count: u32| -> f32 {
            if l == NEG_INF {
                return l;
            }
            let l = if l > 0.0 { l / rp } else { l * rp };
            tame(l - count as f32 * frequency - presence)
        };
        if self.dense {
            self.own(logits);
            for &t in &self.touched {
                let i = t as usize;
                self.work[i] = penalise(self.work[i], self.counts[i]);
            }
        } else {
            for c in &mut self.cand {
                let count = self.counts[c.id as usize];
                if count > 0 {
                    c.logit = penalise(c.logit, count);
                }
            }
            self.cand.retain(|c| c.logit > NEG_INF);
        }
        for &t in &self.touched {
            self.counts[t as usize] = 0;
        }
        self.touched.clear();
    }

    fn logit_bias(&mut self, logits: &[f32]) {
        if self.dense {
            self.own(logits);
            for &(id, b) in &self.bias {
                if let Some(w) = self.work.get_mut(id as usize) {
                    *w = tame(*w + b);
                }
            }
        } else {
            for c in &mut self.cand {
                if let Ok(i) = self.bias.binary_search_by_key(&c.id, |&(id, _)| id) {
                    c.logit = tame(c.logit + self.bias[i].1);
                }
            }
            self.cand.retain(|c| c.logit > NEG_INF);
        }
    }

    fn top_k(&mut self, logits: &[f32]) {
        let k = self.params.top_k;
        if self.dense {
            if k < logits.len() {
                // A positive scale keeps the order: select on the unscaled values.
                let view = if self.owned { &self.work[..] } else { logits };
                select::top_k_of(view, k, &mut self.cand);
                let s = self.scale;
                for c in &mut self.cand {
                    c.logit = scaled(c.logit, s);
                }
                self.dense = false;
            }
        } else {
            select::keep_top_k(&mut self.cand, k);
        }
    }

    fn typical(&mut self, logits: &[f32]) {
        if self.dense {
            return self.dense_mass_prefix::<true>(logits, f64::from(self.params.typical_p));
        }
        let (max, _) = select::softmax(&mut self.cand);
        // With ln p = (logit - max) - ln z: the entropy is ln z - Σ p (logit - max), and the
        // surprisal's distance to it |Σ p (logit - max) - (logit - max)|: no logarithm per token.
        let mean: f64 = self
            .cand
            .iter()
            .map(|c| f64::from(c.p) * f64::from(c.logit - max))
            .sum();
        for c in &mut self.cand {
            c.key = if c.p > 0.0 {
                (mean - f64::from(c.logit - max)).abs() as f32
            } else {
                f32::INFINITY
            };
        }
        let len = select::mass_prefix(
            &mut self.cand,
            f64::from(self.params.typical_p),
            |c| c.key,
            |a, b| a.key.total_cmp(&b.key).then(a.id.cmp(&b.id)),
        );
        self.cand.truncate(len);
    }

    fn top_p(&mut self, logits: &[f32]) {
        if self.dense {
            return self.dense_mass_prefix::<false>(logits, f64::from(self.params.top_p));
        }
        let (max, _) = select::softmax(&mut self.cand);
        let len = select::mass_prefix(
            &mut self.cand,
            f64::from(self.params.top_p),
            |c| max - c.logit,
            by_logit_desc,
        );
        self.cand.truncate(len);
    }

    fn min_p(&mut self, logits: &[f32]) {
        // p / p_max >= min_p  <=>  logit >= max logit + ln(min_p).
        let ln_min_p = self.params.min_p.ln();
        if self.dense {
            let view = if self.owned { &self.work[..] } else { logits };
            let s = self.scale;
            // In unscaled values: v >= max + ln(min_p) / scale.
            let max = select::max_of(view);
            let threshold = max + ln_min_p / s;
            self.cand.clear();
            self.cand.extend(
                view.iter()
                    .enumerate()
                    .filter(|&(_, &v)| v > NEG_INF && v >= threshold)
                    .map(|(i, &v)| Cand::new(i as u32, scaled(v, s))),
            );
            self.dense = false;
        } else {
            let max = self.cand.iter().map(|c| c.logit).fold(NEG_INF, f32::max);
            let threshold = max + ln_min_p;
            self.cand.retain(|c| c.logit >= threshold);
        }
    }

    fn temperature(&mut self, logits: &[f32]) {
        let t = self.params.temperature;
        if t == 0.0 {
            // Greedy: the most likely token alone (the lowest id on ties).
            let best = if self.dense {
                let view = if self.owned { &self.work[..] } else { logits };
                select::first_max(view).map(|i| Cand::new(i as u32, tame(view[i])))
            } else {
                self.cand.iter().copied().min_by(by_logit_desc)
            };
            self.cand.clear();
            self.cand.extend(best);
            self.dense = false;
            return;
        }
        let inv_t = 1.0 / t;
        if self.dense {
            self.scale *= inv_t;
        } else {
            for c in &mut self.cand {
                c.logit = tame(c.logit * inv_t);
            }
        }
    }
}

/// A dense value `v` at scale `s` as a finite (or -inf) candidate logit.
#[inline(always)]
fn scaled(v: f32, s: f32) -> f32 {
    tame(tame(v) * s)
}

/// Draws from `dist` (weights need not be normalised; non-positive ones are never drawn) with
/// one uniform from `rng` (inverse CDF, accumulated in f64). Returns the token with its
/// normalised probability, or `None` when no weight is positive.
pub fn draw_from(rng: &mut Rng, dist: &[(u32, f32)]) -> Option<(u32, f32)> {
    draw_at(rng.next_f64(), dist).map(|(t, p, _, _)| (t, p))
}

/// A draw: the uniform the generator gave, and the interval of the cumulative distribution (the
/// tokens in the order the chain lists them, normalised) that the drawn token covers; the
/// uniform falls in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub uniform: f64,
    pub from: f64,
    pub to: f64,
}

/// [`draw_from`] with the uniform `u` given; also returns the token's cumulative interval.
fn draw_at(u: f64, dist: &[(u32, f32)]) -> Option<(u32, f32, f64, f64)> {
    let total: f64 = dist
        .iter()
        .filter(|&&(_, p)| p > 0.0)
        .map(|&(_, p)| f64::from(p))
        .sum();
    if !(total > 0.0 && total.is_finite()) {
        return None;
    }
    let target = u * total;
    let mut acc = 0.0f64;
    let mut last = None;
    for &(id, p) in dist {
        if p > 0.0 {
            let before = acc;
            acc += f64::from(p);
            last = Some((id, p, before));
            if acc > target {
                break;
            }
        }
    }
    last.map(|(id, p, before)| {
        (
            id,
            (f64::from(p) / total) as f32,
            before / total,
            (before + f64::from(p)) / total,
        )
    })
}

/// `Ok` when every id is a token of a vocabulary of `vocab_size` tokens.
pub(crate) fn check_tokens(
    what: &'static str,
    ids: &[u32],
    vocab_size: usize,
) -> Result<(), EngineError> {
    ids.iter()
        .try_for_each(|&id| check_token(what, id, vocab_size))
}
