//! Beam search: the `width` most likely continuations of a prompt, explored breadth-first.
//!
//! **Scoring.** A hypothesis of `n` generated tokens with cumulative log-probability `c` (the sum
//! of its tokens' natural-log probabilities, each `logit - logsumexp(logits)` in f32, summed in
//! f64) scores `c / n^α` ([`beam_score`]), `α` being the length penalty (Hugging Face
//! transformers' `length_penalty`: 1 by default; above 0 favours longer sequences, below 0 shorter
//! ones). An end-of-generation token ([`Tokenizer::is_end_of_generation`]) finishes its beam and
//! counts in its length.
//!
//! **A step.** Every running beam proposes its `2·width` most likely next tokens (fewer when the
//! vocabulary is smaller). All proposals are ranked by cumulative log-probability (ties: lower
//! token id, then lower beam index; within a beam, proposals are taken by log-probability, ties by
//! lower token id). Walking down that ranking, as transformers' `BeamSearchScorer` does: an
//! end-of-generation proposal ranked within the first `width` is offered to the finished set
//! (which keeps the `width` best by score; on equal scores the earlier node wins), one ranked
//! lower is pruned; any other proposal becomes a running beam of the next step until `width` of
//! them are taken; the rest are pruned.
//!
//! **Stopping** ([`EarlyStopping`]): once `width` hypotheses are finished, the search ends at
//! once (`Finished`), or when the worst finished score is at least the best running beam's current
//! score, its cumulative log-probability over its current length^α (`Heuristic`, the default:
//! transformers' `early_stopping=False` rule. It is a heuristic: with α > 0 a running beam's
//! score can still rise as it grows, so a better hypothesis may be cut off), or when no running
//! beam can beat it even in the best case, its current log-probability over the longest possible
//! length^α when α > 0 (`Never`, transformers' `early_stopping="never"`: exact for the beam).
//! At `max_tokens` (or when the model's context is full) the search also ends, and the running
//! beams then compete with the finished ones for the `width` places (finish reason `length`).
//!
//! **The KV cache.** The prompt is computed once. Every beam is a sequence of one [`KvCache`]:
//! a beam with several surviving continuations is [`fork`](KvCache::fork)ed (every block shared;
//! only a partly filled last block is copied, when a continuation writes into it), its first
//! continuation keeps its sequence, and beams without a continuation are removed. All running
//! beams of a step are computed in one batched forward pass, one row per beam; rows are
//! independent of each other (batch invariance), so scores equal those of each sequence computed
//! alone, bit for bit. Every sequence the search adds to the cache is removed before it returns,
//! error or not.
//!
//! **The trace.** Every proposal becomes a [`BeamNode`] (parent, token, log-probabilities, score,
//! step, rank and what became of it): the whole tree, pruned branches included, serializable for
//! a viewer. A callback sees each step as it completes and may cancel the search.

use rill_model::{KvCache, KvError, Model, ModelError, SeqId};
use serde::Serialize;

use rill_constrain::Grammar;

use crate::{Engine, EngineError};

mod run;

use run::search;
pub use run::BeamRun;

/// Widest beam accepted: each step ranks up to `2·width²` proposals and keeps `width` sequences.
pub const MAX_BEAM_WIDTH: usize = 512;

/// First sequence id tried for the search's beams (ids the cache already holds are skipped).
const FIRST_SEQ: SeqId = 0xbea3_0000_0000_0000;

/// `cumulative_logprob / generated_len^length_penalty`: the score of a hypothesis.
pub fn beam_score(cumulative_logprob: f64, generated_len: usize, length_penalty: f64) -> f64 {
    cumulative_logprob / (generated_len as f64).powf(length_penalty)
}

/// When the search may end before `max_tokens`. See the [module documentation](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EarlyStopping {
    /// As soon as `width` hypotheses are finished (transformers' `early_stopping=True`).
    Finished,
    /// When `width` are finished and the worst of them scores at least the best running beam's
    /// current score (transformers' `early_stopping=False`).
    #[default]
    Heuristic,
    /// When `width` are finished and no running beam can beat the worst of them at any length
    /// up to the limit (transformers' `early_stopping="never"`).
    Never,
}

/// Parameters of a beam search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BeamParams {
    /// Beams kept per step and hypotheses returned: 1..=[`MAX_BEAM_WIDTH`].
    pub width: usize,
    /// Most tokens a hypothesis generates (its end-of-generation token included); at least 1.
    pub max_tokens: usize,
    /// `α` of the score `logprob / length^α`; any finite number.
    pub length_penalty: f64,
    pub early_stopping: EarlyStopping,
    /// Treat end-of-generation tokens as ordinary tokens.
    pub ignore_eos: bool,
    /// Keep every node in [`BeamOutput::trace`] (the callback sees each step's nodes either way).
    pub trace: bool,
}

impl Default for BeamParams {
    fn default() -> Self {
        BeamParams {
            width: 4,
            max_tokens: 256,
            length_penalty: 1.0,
            early_stopping: EarlyStopping::default(),
            ignore_eos: false,
            trace: true,
        }
    }
}

impl BeamParams {
    pub fn validate(&self) -> Result<(), BeamError> {
        if !(1..=MAX_BEAM_WIDTH).contains(&self.width) {
            return Err(BeamError::BadWidth {
                width: self.width,
                max: MAX_BEAM_WIDTH,
            });
        }
        if !self.length_penalty.is_finite() {
            return Err(BeamError::BadLengthPenalty(self.length_penalty));
        }
        if self.max_tokens == 0 {
            return Err(BeamError::NoTokens);
        }
        Ok(())
    }

    /// Tokens a hypothesis can generate after a prompt of `prompt_len` tokens in a context of
    /// `context` positions: `max_tokens`, or fewer when the context fills first (as in
    /// [`Session::generate`](crate::Session::generate), the last token is generated from the
    /// last cached position and is not cached itself). 0 when the prompt does not fit.
    pub fn token_limit(&self, prompt_len: usize, context: usize) -> usize {
        if prompt_len == 0 || prompt_len > context {
            return 0;
        }
        self.max_tokens.min(context - prompt_len + 1)
    }

    /// Free KV blocks of `block_size` positions the search may need at most after a prompt of
    /// `prompt_len` tokens: the prompt's full blocks once, plus, for every beam, the blocks of
    /// the positions it may write (all beams diverging at once is the worst case).
    pub fn kv_blocks_needed(&self, prompt_len: usize, context: usize, block_size: usize) -> usize {
        let bs = block_size.max(1);
        let n = self.token_limit(prompt_len, context);
        if n <= 1 {
            return prompt_len.div_ceil(bs);
        }
        let last_fed = prompt_len + n - 2;
        let per_beam = last_fed / bs - prompt_len / bs + 1;
        (prompt_len / bs).saturating_add(self.width.saturating_mul(per_beam))
    }
}

/// Errors of a beam search.
#[derive(Debug, thiserror::Error)]
pub enum BeamError {
    #[error("beam width {width} is outside 1..={max}")]
    BadWidth { width: usize, max: usize },
    #[error("the length penalty must be a finite number, got {0}")]
    BadLengthPenalty(f64),
    #[error("max_tokens must be at least 1 for a beam search")]
    NoTokens,
    #[error("the prompt is empty: a model needs at least one token to predict from")]
    EmptyPrompt,
    #[error("prompt token {token} (at {index}) is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange {
        token: u32,
        index: usize,
        vocab_size: usize,
    },
    #[error("the prompt has {prompt} tokens but the context holds {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("a beam search of width {width} may need {needed} free KV-cache blocks; the cache has {free} free of {total}")]
    CacheTooSmall {
        width: usize,
        needed: usize,
        free: usize,
        total: usize,
    },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Constraint(#[from] rill_constrain::ConstraintError),
}

impl From<BeamError> for EngineError {
    fn from(e: BeamError) -> EngineError {
        match e {
            BeamError::Model(e) => EngineError::Model(e),
            BeamError::Kv(e) => EngineError::Kv(e),
            BeamError::Constraint(e) => EngineError::Constraint(e),
            BeamError::EmptyPrompt => EngineError::EmptyPrompt,
            BeamError::PromptTooLong { prompt, context } => {
                EngineError::PromptTooLong { prompt, context }
            }
            other => EngineError::BadParameter(other.to_string()),
        }
    }
}

/// What became of a proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// Became a running beam of the next step.
    Kept,
    /// Not taken: ranked below the kept ones, or an end-of-generation token ranked below
    /// `width`, or one that did not score above the finished set's worst.
    Pruned,
    /// An end-of-generation token that entered the finished set (better ones found later may
    /// displace it; [`BeamHypothesis::node`] names the nodes returned).
    Finished,
}

/// One proposal of the search tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BeamNode {
    /// Index in [`BeamTrace::nodes`] (when traced); nodes are numbered in step order, then rank.
    pub id: usize,
    /// The node this one extends; `None` for the first step (it extends the prompt).
    pub parent: Option<usize>,
    pub token: u32,
    /// The token as text, control tokens rendered (a lone byte of a multi-byte character shows
    /// as U+FFFD).
    pub text: String,
    pub token_logprob: f32,
    pub cumulative_logprob: f64,
    pub score: f64,
    /// 0 for the first generated token.
    pub step: usize,
    /// Place among the step's proposals (0 is the most likely).
    pub rank: usize,
    pub status: NodeStatus,
}

/// The whole search tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BeamTrace {
    pub prompt_tokens: usize,
    pub width: usize,
    pub length_penalty: f64,
    /// Every node, in id order (empty unless [`BeamParams::trace`]).
    pub nodes: Vec<BeamNode>,
}

/// Why a hypothesis ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BeamFinish {
    /// An end-of-generation token (the last of its tokens).
    Stop,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// Still running when the callback cancelled the search.
    Cancelled,
}

impl BeamFinish {
    pub fn as_str(self) -> &'static str {
        match self {
            BeamFinish::Stop => "stop",
            BeamFinish::Length => "length",
            BeamFinish::Cancelled => "cancelled",
        }
    }
}

/// Why the search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BeamStop {
    /// The early-stopping rule ended it: `width` hypotheses finished, none left to improve on.
    Done,
    /// `max_tokens` reached, or the context is full.
    Length,
    /// No running beam was left (every proposal finished or was impossible).
    Exhausted,
    /// The callback asked to stop.
    Cancelled,
}

/// A returned sequence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BeamHypothesis {
    /// Generated tokens, the end-of-generation token included when it has one.
    pub tokens: Vec<u32>,
    /// Decoded text (control tokens, such as the end-of-generation token, omitted).
    pub text: String,
    pub cumulative_logprob: f64,
    pub score: f64,
    pub finish_reason: BeamFinish,
    /// The trace node of its last token.
    pub node: usize,
}

/// A beam still running after a step.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningBeam {
    /// The trace node of its last token.
    pub node: usize,
    pub tokens: Vec<u32>,
    pub cumulative_logprob: f64,
    /// Its score at its current length.
    pub score: f64,
    seq: SeqId,
}

/// One completed step, as the callback sees it.
#[derive(Debug)]
pub struct BeamStep<'a> {
    pub step: usize,
    /// This step's proposals in rank order, with their fate.
    pub nodes: &'a [BeamNode],
    /// The beams going on (best first); what the next step will expand unless the search ends.
    pub running: &'a [RunningBeam],
    /// Hypotheses in the finished set (at most `width`).
    pub finished: usize,
    /// KV blocks the search holds now (the prompt's shared ones included).
    pub kv_blocks: usize,
}

/// The result of a beam search.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BeamOutput {
    /// At most `width` hypotheses, best score first (ties: the earlier node first).
    pub hypotheses: Vec<BeamHypothesis>,
    pub stop: BeamStop,
    /// Steps expanded (tokens generated by the longest hypothesis explored).
    pub steps: usize,
    pub prompt_tokens: usize,
    /// Forward passes, the prompt's included (one per step but the last).
    pub forward_passes: usize,
    /// Most KV blocks the search held at once.
    pub peak_kv_blocks: usize,
    pub prefill_seconds: f64,
    pub search_seconds: f64,
    pub trace: BeamTrace,
}

impl Engine {
    /// [`beam_search`] in a KV cache of its own, sized for the worst case of these parameters
    /// ([`BeamParams::kv_blocks_needed`]).
    pub fn beam_search(
        &mut self,
        prompt: &[u32],
        params: &BeamParams,
        on_step: impl FnMut(&BeamStep<'_>) -> bool,
    ) -> Result<BeamOutput, BeamError> {
        self.beam_search_constrained(prompt, params, None, on_step)
    }

    /// [`Engine::beam_search`] under a structured-output constraint: each beam keeps its own
    /// state in it, proposes only the tokens it allows, and a beam whose text is complete
    /// (nothing may follow) finishes like one that ends with an end-of-generation token.
    pub fn beam_search_constrained(
        &mut self,
        prompt: &[u32],
        params: &BeamParams,
        constraint: Option<&Grammar>,
        on_step: impl FnMut(&BeamStep<'_>) -> bool,
    ) -> Result<BeamOutput, BeamError> {
        params.validate()?;
        let context = check_prompt(&self.model, prompt)?;
        let bs = KvCache::DEFAULT_BLOCK_SIZE;
        let blocks = params.kv_blocks_needed(prompt.len(), context, bs);
        let mut kv = self
            .model
            .new_kv_cache(blocks.saturating_mul(bs), self.precision)?;
        search(self, &mut kv, prompt, params, constraint, on_step)
    }
}

/// Beam search after `prompt` with `engine`'s model, tokenizer and precision, its beams held as
/// sequences of `kv` (which may hold other sequences: they are left alone, and every sequence
/// the search adds is removed before it returns). `on_step` sees every step; returning `false`
/// cancels the search (the running beams then compete as `cancelled` hypotheses).
///
/// Errors before anything is computed: bad parameters, an empty prompt or one that does not fit
/// the model's context, a token outside the vocabulary, a cache of another shape, or fewer free
/// blocks than the search may need ([`BeamParams::kv_blocks_needed`]).
pub fn beam_search(
    engine: &mut Engine,
    kv: &mut KvCache,
    prompt: &[u32],
    params: &BeamParams,
    on_step: impl FnMut(&BeamStep<'_>) -> bool,
) -> Result<BeamOutput, BeamError> {
    search(engine, kv, prompt, params, None, on_step)
}

/// Checks the prompt against the model; returns the model's context length.
fn check_prompt(model: &Model, prompt: &[u32]) -> Result<usize, BeamError> {
    let cfg = model.config();
    if prompt.is_empty() {
        return Err(BeamError::EmptyPrompt);
    }
    if let Some((index, &token)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= cfg.vocab_size)
    {
        return Err(BeamError::TokenOutOfRange {
            token,
            index,
            vocab_size: cfg.vocab_size,
        });
    }
    if prompt.len() > cfg.context_length {
        return Err(BeamError::PromptTooLong {
            prompt: prompt.len(),
            context: cfg.context_length,
        });
    }
    Ok(cfg.context_length)
}

/// A proposal: beam `beam` followed by `token`.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    beam: usize,
    token: u32,
    logprob: f32,
    cumulative: f64,
}

/// A finished (or, at the end, a still running) hypothesis.
struct Finished {
    tokens: Vec<u32>,
    cumulative: f64,
    score: f64,
    node: usize,
    reason: BeamFinish,
}

/// Whether `a` ranks before `b` in the finished set: higher score, then the earlier node.
fn better(a_score: f64, a_node: usize, b: &Finished) -> bool {
    match a_score.total_cmp(&b.score) {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => a_node < b.node,
    }
}

/// The `width` best hypotheses.
struct FinishedSet {
    width: usize,
    items: Vec<Finished>,
}

impl FinishedSet {
    /// The worst member (lowest score, then the latest node).
    fn worst(&self) -> Option<usize> {
        (0..self.items.len()).reduce(|w, i| {
            if better(self.items[w].score, self.items[w].node, &self.items[i]) {
                i
            } else {
                w
            }
        })
    }

    fn is_full(&self) -> bool {
        self.items.len() >= self.width
    }

    fn worst_score(&self) -> Option<f64> {
        self.worst().map(|w| self.items[w].score)
    }

    /// Whether a hypothesis with this score and node would enter the set.
    fn would_take(&self, score: f64, node: usize) -> bool {
        match self.worst() {
            Some(w) if self.is_full() => better(score, node, &self.items[w]),
            _ => true,
        }
    }

    /// Adds a hypothesis, displacing the worst when full; `false` when it is not good enough.
    fn offer(&mut self, h: Finished) -> bool {
        if !self.would_take(h.score, h.node) {
            return false;
        }
        if self.is_full() {
            if let Some(w) = self.worst() {
                self.items.swap_remove(w);
            }
        }
        self.items.push(h);
        true
    }
}

/// The `k` tokens of `row` with the highest log-probabilities (`logit - norm`; ties: lower id
/// first), best first, into `out`; tokens whose log-probability is not finite (NaN, or an
/// impossible token) are never proposed.
fn top_tokens(row: &[f32], norm: f32, k: usize, out: &mut Vec<u32>) {
    out.clear();
    out.extend((0..row.len() as u32).filter(|&t| (row[t as usize] - norm).is_finite()));
    let by_rank = |a: &u32, b: &u32| {
        let (la, lb) = (row[*a as usize] - norm, row[*b as usize] - norm);
        lb.total_cmp(&la).then(a.cmp(b))
    };
    if k == 0 {
        out.clear();
        return;
    }
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, by_rank);
        out.truncate(k);
    }
    out.sort_unstable_by(by_rank);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_kernels::ops::log_normalizer;

    #[test]
    fn top_tokens_ranks_by_logprob_then_id_and_skips_impossible_ones() {
        let row = [1.0f32, 3.0, f32::NEG_INFINITY, 3.0, 2.0, 0.5];
        let mut out = Vec::new();
        let norm = log_normalizer(&row);
        top_tokens(&row, norm, 3, &mut out);
        assert_eq!(out, vec![1, 3, 4]);
        top_tokens(&row, norm, 10, &mut out);
        assert_eq!(out, vec![1, 3, 4, 0, 5]);
        let nan = [f32::NAN, 1.0];
        top_tokens(&nan, log_normalizer(&nan), 2, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn the_finished_set_keeps_the_best_and_prefers_earlier_nodes_on_ties() {
        let h = |score: f64, node| Finished {
            tokens: vec![],
            cumulative: score,
            score,
            node,
            reason: BeamFinish::Stop,
        };
        let mut set = FinishedSet {
            width: 2,
            items: Vec::new(),
        };
        assert!(set.offer(h(-2.0, 0)));
        assert!(set.offer(h(-3.0, 1)));
        assert!(!set.offer(h(-3.0, 2)));
        assert!(set.offer(h(-1.0, 3)));
        assert_eq!(set.worst_score(), Some(-2.0));
        assert!(!set.offer(h(-2.0, 4)));
        let mut nodes: Vec<usize> = set.items.iter().map(|f| f.node).collect();
        nodes.sort();
        assert_eq!(nodes, vec![0, 3]);
    }

    #[test]
    fn parameters_are_validated() {
        let ok = BeamParams::default();
        assert!(ok.validate().is_ok());
        for bad in [
            BeamParams {
                width: 0,
                ..ok.clone()
            },
            BeamParams {
                width: MAX_BEAM_WIDTH + 1,
                ..ok.clone()
            },
            BeamParams {
                length_penalty: f64::NAN,
                ..ok.clone()
            },
            BeamParams {
                length_penalty: f64::INFINITY,
                ..ok.clone()
            },
            BeamParams {
                max_tokens: 0,
                ..ok.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_block_bound_counts_shared_prompt_blocks_once() {
        let p = BeamParams {
            width: 3,
            max_tokens: 5,
            ..Default::default()
        };
        // Prompt of 6 in blocks of 4: one full block shared; each beam writes positions 6..=9
        // (blocks 1 and 2): 1 + 3 * 2.
        assert_eq!(p.kv_blocks_needed(6, 100, 4), 7);
        // Prompt on a boundary: positions 8..=11 in block 2 only.
        assert_eq!(p.kv_blocks_needed(8, 100, 4), 2 + 3);
        // One token: only the prompt; a context that ends the search early.
        let one = BeamParams {
            max_tokens: 1,
            ..p.clone()
        };
        assert_eq!(one.kv_blocks_needed(6, 100, 4), 2);
        assert_eq!(p.token_limit(6, 8), 3);
        assert_eq!(p.token_limit(9, 8), 0);
    }
}
