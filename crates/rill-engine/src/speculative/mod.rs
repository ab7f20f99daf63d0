//! Speculative decoding: a cheap draft proposes a few tokens, the model verifies all of them in
//! one batched forward pass, and the exact acceptance rule ([`Verifier`]) keeps the output
//! distributed as the model alone would produce it (token for token the same text when greedy).
//!
//! **A round.** The last generated token (`pending`, not yet in the cache) and `k` drafted tokens
//! `d1..dk` go through the model as one batch of `k + 1` rows, with logits for every row: row `i`
//! gives the processed distribution `p` (after the sampler chain) at draft position `i + 1`.
//! Walking the rows, `d(i+1)` is kept with probability `min(1, p(x) / q(x))` (`q`: the draft's
//! processed distribution); the first rejected one is replaced by a draw from `max(0, p - q)`
//! normalised, and if all `k` are kept a bonus token is drawn from the last row's `p`. Every
//! token goes through the same stop checks, streaming and events as [`Session::generate`]; the
//! rows after the last kept token are rolled back with [`KvCache::truncate`] (the draft's cache
//! catches up by the common prefix the next time it drafts). Draws use the sampler chain's own
//! generator, so a seed reproduces a run.
//!
//! **Drafts** ([`DraftSource`]): a smaller model with the same vocabulary (its own KV cache), the
//! model's own first layers ([`Model::forward_layers`], on a KV cache of its own), or prompt
//! lookup ([`ngram_lookup`], a deterministic draft: `q` is one-hot, so a drafted token is kept
//! with probability `p(x)` and the residual is `p` without it), or the model's own
//! multi-token-prediction block (Qwen3.5's MTP: `mtp.rs`).

mod mtp;
mod ngram;
mod run;
mod verify;

use std::time::Instant;

use rill_model::{Batch, KvCache, Model, Precision};
use rill_tokenizer::Tokenizer;

use crate::constrained::Constrained;
use crate::session::SEQ;
use crate::{
    draw_from, Engine, EngineError, GenerateParams, Generation, Rng, SamplerChain, Session,
    TokenEvent,
};

pub use ngram::{ngram_lookup, NgramParams, MAX_NGRAM};
pub use run::SpeculativeRun;
pub use verify::{probability_of, Verdict, Verifier};

/// The most tokens drafted per round.
pub const MAX_DRAFT_TOKENS: usize = 64;

/// With [`SpeculativeParams::adaptive`], rounds without drafting before one token is drafted
/// again.
pub const PROBE_INTERVAL: usize = 8;

/// The longest wait between probes of an adaptive draft.
pub const MAX_PROBE_INTERVAL: usize = 256;

/// Where drafted tokens come from.
pub enum DraftSource {
    /// A separate, smaller model with exactly the target's vocabulary (checked).
    Model(Box<Model>),
    /// The target's own first `n` layers (then its final norm and output head).
    Layers(usize),
    /// Prompt lookup: tokens that followed the sequence's last n-gram earlier in it.
    Ngram(NgramParams),
    /// The model's own multi-token-prediction block (Qwen3.5's MTP), trained with it to draft.
    Mtp,
}

/// The kind of draft, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftKind {
    Model,
    Layers(usize),
    Ngram,
    Mtp,
}

impl std::fmt::Display for DraftKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftKind::Model => f.write_str("draft model"),
            DraftKind::Layers(n) => write!(f, "first {n} layers"),
            DraftKind::Ngram => f.write_str("prompt lookup"),
            DraftKind::Mtp => f.write_str("MTP block"),
        }
    }
}

/// How many tokens to draft per round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeParams {
    /// Most tokens drafted per round, 1..=[`MAX_DRAFT_TOKENS`].
    pub draft_tokens: usize,
    /// Adapt the draft length between rounds: two more after a round whose drafts were all
    /// kept (up to `draft_tokens`), one fewer after a rejection, down to none at all (plain
    /// decoding) for a draft that is seldom right; then one token is drafted again after
    /// [`PROBE_INTERVAL`] rounds, to notice when it becomes useful (after each failed probe the
    /// wait doubles, up to [`MAX_PROBE_INTERVAL`]).
    pub adaptive: bool,
    /// Record every round in [`SpeculativeStats::trace`] (for viewers).
    pub trace: bool,
}

impl Default for SpeculativeParams {
    fn default() -> Self {
        SpeculativeParams {
            draft_tokens: 5,
            adaptive: false,
            trace: false,
        }
    }
}

impl SpeculativeParams {
    pub fn validate(&self) -> Result<(), EngineError> {
        if !(1..=MAX_DRAFT_TOKENS).contains(&self.draft_tokens) {
            return Err(EngineError::BadParameter(format!(
                "draft_tokens must be in 1..={MAX_DRAFT_TOKENS}, got {}",
                self.draft_tokens
            )));
        }
        Ok(())
    }
}

/// What speculation did during one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeStats {
    pub draft: DraftKind,
    /// Most tokens drafted per round.
    pub draft_tokens: usize,
    /// Verification passes of the model (each one round: one to `draft_tokens + 1` rows).
    pub rounds: usize,
    /// Drafted tokens the model judged.
    pub drafted: usize,
    /// Drafted tokens kept.
    pub accepted: usize,
    /// Per draft position (0: the first drafted token of a round): tokens judged there.
    pub drafted_at: Vec<usize>,
    /// Per draft position: tokens kept there (a position is judged only when all before it
    /// were kept).
    pub accepted_at: Vec<usize>,
    /// Tokens proposed but never judged, because generation ended first.
    pub unjudged: usize,
    /// Drafted tokens the structured-output constraint rejected before verification (with
    /// every draft after them in their round).
    pub constraint_rejected: usize,
    /// Forward passes of the draft model (or of the shallow layers); 0 for prompt lookup.
    pub draft_passes: usize,
    /// Time spent drafting (draft forward passes and lookups), its prompt prefill excluded.
    pub draft_seconds: f64,
    /// Time in the model's verification passes.
    pub verify_seconds: f64,
    /// Time the draft took to take in the prompt (counted in the generation's prefill).
    pub draft_prefill_seconds: f64,
    /// Every round, when [`SpeculativeParams::trace`] asked for them.
    pub trace: Vec<SpeculativeRound>,
}

/// One round of speculative decoding: drafts proposed, then verified in one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeRound {
    /// Position of the first drafted token in the sequence.
    pub position: usize,
    pub drafted: Vec<u32>,
    /// Drafts kept (the first `accepted` of `drafted`).
    pub accepted: usize,
    /// The token the model chose after the kept drafts; `None` when generation ended on a
    /// kept draft.
    pub next: Option<u32>,
    /// `next` replaced a rejected draft (else it is the bonus token after all were kept).
    pub corrected: bool,
    /// Seconds of drafting and verifying this round.
    pub seconds: f64,
}

impl SpeculativeStats {
    fn new(draft: DraftKind, draft_tokens: usize) -> SpeculativeStats {
        SpeculativeStats {
            draft,
            draft_tokens,
            rounds: 0,
            drafted: 0,
            accepted: 0,
            drafted_at: vec![0; draft_tokens],
            accepted_at: vec![0; draft_tokens],
            unjudged: 0,
            constraint_rejected: 0,
            draft_passes: 0,
            draft_seconds: 0.0,
            verify_seconds: 0.0,
            draft_prefill_seconds: 0.0,
            trace: Vec::new(),
        }
    }

    /// Kept over judged drafted tokens (0 when none was judged).
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Per draft position: the fraction of tokens judged there that were kept (`None` where
    /// none was judged).
    pub fn acceptance_by_position(&self) -> Vec<Option<f64>> {
        self.drafted_at
            .iter()
            .zip(&self.accepted_at)
            .map(|(&d, &a)| (d > 0).then(|| a as f64 / d as f64))
            .collect()
    }

    /// Tokens generated per verification pass (kept drafts plus one).
    pub fn tokens_per_round(&self) -> f64 {
        (self.accepted + self.rounds) as f64 / self.rounds.max(1) as f64
    }
}

/// A draft's KV cache and the tokens in it.
struct DraftCache {
    kv: KvCache,
    tokens: Vec<u32>,
    /// Logits after the last token of `tokens`.
    logits: Vec<f32>,
}

enum Draft {
    Model {
        model: Box<Model>,
        cache: Option<DraftCache>,
    },
    Layers {
        n_layers: usize,
        cache: Option<DraftCache>,
    },
    Ngram(NgramParams),
    Mtp(mtp::MtpState),
}

/// When a draft that stopped drafting tries again: one token after [`PROBE_INTERVAL`] rounds
/// without a draft, the wait doubling after each probe rejected (up to [`MAX_PROBE_INTERVAL`])
/// and back to the shortest once a round's drafts are all kept. [`AdaptiveDraft`] and the
/// serving loop's prompt lookup each keep one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probe {
    /// Rounds in a row without a draft.
    idle: usize,
    /// Rounds to wait before the next probe.
    interval: usize,
    /// The round under way drafts a probe.
    probing: bool,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            idle: 0,
            interval: PROBE_INTERVAL,
            probing: false,
        }
    }
}

impl Probe {
    /// Another round without a draft: true when the wait is over and this round probes (the
    /// wait then starts again).
    pub(crate) fn idle_round(&mut self) -> bool {
        self.idle += 1;
        if self.idle < self.interval {
            return false;
        }
        self.idle = 0;
        self.probing = true;
        true
    }

    /// A round that drafts: the wait starts again.
    pub(crate) fn busy(&mut self) {
        self.idle = 0;
    }

    /// A round's verdict (neither, for a round that drafted nothing): a rejected probe doubles
    /// the wait, drafts all kept make it the shortest; the round is no probe any more.
    pub(crate) fn judged(&mut self, rejected: bool, all_kept: bool) {
        if rejected && self.probing {
            self.interval = (self.interval * 2).min(MAX_PROBE_INTERVAL);
        } else if all_kept {
            self.interval = PROBE_INTERVAL;
        }
        self.probing = false;
    }
}

/// The adaptive draft length ([`SpeculativeParams::adaptive`]): two more after a round whose
/// drafts were all kept (up to the most), one fewer after a rejection, down to none; then
/// [`Probe`]'s one token now and then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdaptiveDraft {
    /// The most tokens a round drafts.
    most: usize,
    /// Draft length of the next round.
    next_k: usize,
    probe: Probe,
}

impl AdaptiveDraft {
    /// Starts at the most.
    pub(crate) fn new(most: usize) -> AdaptiveDraft {
        AdaptiveDraft {
            most,
            next_k: most,
            probe: Probe::default(),
        }
    }

    /// Tokens the next round may draft.
    pub(crate) fn next(&self) -> usize {
        self.next_k
    }

    /// After a round that drafted `k` tokens: whether one was rejected, whether all were kept.
    pub(crate) fn adapt(&mut self, k: usize, rejected: bool, all_kept: bool) {
        let kept_all = !rejected && k > 0 && all_kept;
        if rejected {
            self.next_k = self.next_k.saturating_sub(1);
        } else if kept_all {
            self.next_k = (self.next_k + 2).min(self.most);
        }
        self.probe.judged(rejected, kept_all);
        if self.next_k > 0 {
            self.probe.busy();
        } else if self.probe.idle_round() {
            self.next_k = 1;
        }
    }
}

/// A draft and its state (its KV cache, kept between generations so that a longer prompt only
/// adds what is new), plus the buffers of the rounds. Made for one target model; use it with
/// [`Session::generate_speculative`].
pub struct Speculator {
    draft: Draft,
    params: SpeculativeParams,
    /// The target's vocabulary size and layer count.
    target: (usize, usize),
    /// The draft length of the next round (adaptive).
    length: AdaptiveDraft,
    drafted: Vec<u32>,
    /// The draft distribution of each drafted token.
    qs: Vec<Vec<(u32, f32)>>,
    verifier: Verifier,
    batch: Batch,
    rows: Vec<f32>,
}

impl Speculator {
    /// A speculator for `engine`'s model. A draft model must have exactly its vocabulary (the
    /// same size and the same token texts); a layer count must be below the model's.
    pub fn new(
        engine: &Engine,
        source: DraftSource,
        params: SpeculativeParams,
    ) -> Result<Speculator, EngineError> {
        params.validate()?;
        let cfg = engine.model.config();
        let draft = match source {
            DraftSource::Model(model) => {
                check_draft_vocabulary(&engine.tokenizer, cfg.vocab_size, &model)?;
                Draft::Model { model, cache: None }
            }
            DraftSource::Layers(n_layers) => {
                if n_layers == 0 || n_layers >= cfg.n_layers {
                    return Err(EngineError::DraftLayers {
                        layers: n_layers,
                        model_layers: cfg.n_layers,
                    });
                }
                Draft::Layers {
                    n_layers,
                    cache: None,
                }
            }
            DraftSource::Ngram(p) => {
                p.validate()?;
                Draft::Ngram(p)
            }
            DraftSource::Mtp => {
                if !engine.model.has_mtp() {
                    let why = rill_model::mtp::why_not(cfg);
                    return Err(EngineError::NoMtp(
                        why.unwrap_or_else(|| "the file's block did not load".into()),
                    ));
                }
                Draft::Mtp(mtp::MtpState::new(cfg.d_model))
            }
        };
        Ok(Speculator {
            draft,
            params,
            target: (cfg.vocab_size, cfg.n_layers),
            length: AdaptiveDraft::new(params.draft_tokens),
            drafted: Vec::new(),
            qs: Vec::new(),
            verifier: Verifier::new(),
            batch: Batch::new(),
            rows: Vec::new(),
        })
    }

    pub fn kind(&self) -> DraftKind {
        match &self.draft {
            Draft::Model { .. } => DraftKind::Model,
            Draft::Layers { n_layers, .. } => DraftKind::Layers(*n_layers),
            Draft::Ngram(_) => DraftKind::Ngram,
            Draft::Mtp(_) => DraftKind::Mtp,
        }
    }

    /// Whether the model's passes must log their hidden states for the draft (the MTP block's
    /// input).
    pub(crate) fn wants_hidden(&self) -> bool {
        matches!(self.draft, Draft::Mtp(_))
    }

    /// Hands the draft the hidden states the model's last passes logged over `tokens` (a
    /// session's sequence).
    pub(crate) fn absorb_hidden(&mut self, model: &mut Model, tokens: &[u32]) {
        let log = model.take_hidden_log();
        if let Draft::Mtp(state) = &mut self.draft {
            state.absorb(log, tokens);
        }
    }

    pub fn params(&self) -> &SpeculativeParams {
        &self.params
    }

    /// The draft model, when the draft is one.
    pub fn draft_model(&self) -> Option<&Model> {
        match &self.draft {
            Draft::Model { model, .. } => Some(model),
            _ => None,
        }
    }

    /// Makes the draft's cache ready for a context of `context` positions (allocated on first
    /// use, reallocated for a larger context) and brings it at most `max_passes` forward passes
    /// closer to holding `prompt`. Returns the passes run and whether it holds `prompt` now.
    fn prepare(
        &mut self,
        target: &mut Model,
        precision: Precision,
        context: usize,
        prompt: &[u32],
        max_passes: usize,
    ) -> Result<(usize, bool), EngineError> {
        let (model, n_layers, cache) = match &mut self.draft {
            Draft::Ngram(_) => return Ok((0, true)),
            Draft::Mtp(state) => {
                let capacity = context.min(target.config().context_length).max(1);
                state.ready(target, capacity, precision)?;
                let passes = state.fill_prompt(target, precision, prompt)?;
                return Ok((passes, true));
            }
            Draft::Model { model, cache } => {
                let n = model.config().n_layers;
                (&mut **model, n, cache)
            }
            Draft::Layers { n_layers, cache } => (target, *n_layers, cache),
        };
        let capacity = context.min(model.config().context_length).max(1);
        let types = model.kv_types(precision);
        let fits = cache.as_ref().is_some_and(|c| {
            c.kv.capacity_tokens() >= capacity
                && c.kv.layout() == model.kv_layout()
                && c.kv.types() == types
        });
        if !fits {
            // Sliding-window layers hold a window and one pass, as a session's do.
            let mut kv = crate::session::session_kv_cache(model, capacity, precision)?;
            kv.add_sequence(SEQ)?;
            *cache = Some(DraftCache {
                kv,
                tokens: Vec::new(),
                logits: Vec::new(),
            });
        }
        let cache = cache.as_mut().expect("set above");
        catch_up(model, n_layers, precision, cache, prompt, max_passes)
    }
}

/// Brings `cache` at most `max_passes` forward passes (of up to
/// [`crate::session::SESSION_PASS_ROWS`] positions) closer to holding `seq` (keeping the common
/// prefix) with the logits after its last token. Returns the passes run and whether it holds
/// `seq` now (also when `seq` does not fit: the draft then drafts nothing).
fn catch_up(
    model: &mut Model,
    n_layers: usize,
    precision: Precision,
    cache: &mut DraftCache,
    seq: &[u32],
    max_passes: usize,
) -> Result<(usize, bool), EngineError> {
    if seq.is_empty() || seq.len() > cache.kv.capacity_tokens() {
        return Ok((0, true));
    }
    let mut common = cache
        .tokens
        .iter()
        .zip(seq)
        .take_while(|(a, b)| a == b)
        .count();
    if common == seq.len() {
        if common == cache.tokens.len() && !cache.logits.is_empty() {
            return Ok((0, true));
        }
        common -= 1;
    }
    // Fewer when the window layers let go of what a query at `common` reads.
    let common = cache.kv.truncate(SEQ, common)?;
    cache.tokens.truncate(common);
    cache.logits.clear();
    // A session's passes (its window layers hold one).
    let mut passes = 0;
    for (batch, chunk) in crate::session::prompt_passes(&seq[common..], common).take(max_passes) {
        model.forward_layers(
            &batch,
            &mut cache.kv,
            precision,
            &mut cache.logits,
            n_layers,
        )?;
        cache.tokens.extend_from_slice(chunk);
        passes += 1;
    }
    Ok((passes, cache.tokens.len() == seq.len()))
}

/// `Ok` when `draft` has exactly the vocabulary of the target (`tokenizer`, with `vocab_size`
/// logits): the same size and the same text for every token.
pub fn check_draft_vocabulary(
    tokenizer: &Tokenizer,
    vocab_size: usize,
    draft: &Model,
) -> Result<(), EngineError> {
    let draft_vocab = draft.config().vocab_size;
    if draft_vocab != vocab_size {
        return Err(EngineError::DraftVocabulary(format!(
            "the draft has {draft_vocab} tokens, the model {vocab_size}"
        )));
    }
    let draft_tokenizer = Tokenizer::from_gguf(draft.file().metadata())?;
    if draft_tokenizer.vocab_size() != tokenizer.vocab_size() {
        return Err(EngineError::DraftVocabulary(format!(
            "the draft's tokenizer has {} tokens, the model's {}",
            draft_tokenizer.vocab_size(),
            tokenizer.vocab_size()
        )));
    }
    for id in 0..tokenizer.vocab_size() as u32 {
        let (a, b) = (draft_tokenizer.token_text(id), tokenizer.token_text(id));
        if a != b {
            return Err(EngineError::DraftVocabulary(format!(
                "token {id} is {:?} in the draft but {:?} in the model",
                a.unwrap_or(""),
                b.unwrap_or("")
            )));
        }
    }
    Ok(())
}

impl Session {
    /// [`Session::generate`] with speculative decoding: the same parameters, stop conditions,
    /// events and result (with [`Generation::speculative`] set), and the same output
    /// distribution; greedy, the same tokens. The draft takes in the prompt during the prefill.
    /// A [`SpeculativeRun`] stepped to its end.
    pub fn generate_speculative(
        &mut self,
        engine: &mut Engine,
        speculator: &mut Speculator,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_token: impl FnMut(&TokenEvent<'_>) -> bool,
    ) -> Result<Generation, EngineError> {
        let Engine {
            model,
            tokenizer,
            precision,
        } = engine;
        let mut run = SpeculativeRun::start(
            self, speculator, tokenizer, model, *precision, prompt, params,
        )?;
        while !run.step(model, &mut on_token)? {}
        run.finish().ok_or_else(|| {
            EngineError::BadParameter("the speculative generation did not finish".into())
        })
    }
}

/// Drafts up to `k` tokens after `seq` (the cached tokens and the pending one) into
/// `sp.drafted`, with their draft distributions in `sp.qs`. `generated` counts generated tokens
/// (pending included), for `min_tokens`.
#[allow(clippy::too_many_arguments)]
pub(super) fn draft(
    sp: &mut Speculator,
    target: &mut Model,
    precision: Precision,
    seq: &[u32],
    k: usize,
    chain: &mut SamplerChain,
    rng: &mut Rng,
    generated: usize,
    stats: &mut SpeculativeStats,
    constraint: Option<&Constrained>,
) -> Result<(), EngineError> {
    let started = Instant::now();
    sp.drafted.clear();
    if k == 0 {
        return Ok(());
    }
    let (model, n_layers, cache) = match &mut sp.draft {
        Draft::Ngram(params) => {
            ngram_lookup(seq, params, k, &mut sp.drafted);
            for (i, &d) in sp.drafted.iter().enumerate() {
                set_q(&mut sp.qs, i, &[(d, 1.0)]);
            }
            stats.draft_seconds += started.elapsed().as_secs_f64();
            return Ok(());
        }
        Draft::Mtp(state) => {
            let drafted = draft_mtp(
                state,
                (&mut sp.drafted, &mut sp.qs),
                target,
                precision,
                seq,
                k,
                (chain, rng, generated),
                stats,
                constraint,
            );
            state.end_round()?;
            stats.draft_seconds += started.elapsed().as_secs_f64();
            return drafted;
        }
        Draft::Model { model, cache } => {
            let n = model.config().n_layers;
            (&mut **model, n, cache)
        }
        Draft::Layers { n_layers, cache } => (target, *n_layers, cache),
    };
    let Some(cache) = cache.as_mut() else {
        return Ok(());
    };
    // The draft's cache holds `seq` and the drafts but the last.
    let capacity = cache.kv.capacity_tokens();
    if seq.len() > capacity {
        return Ok(());
    }
    let k = k.min(capacity + 1 - seq.len());
    stats.draft_passes += catch_up(model, n_layers, precision, cache, seq, usize::MAX)?.0;
    let greedy = chain.is_greedy();
    let mut step = Batch::new();
    // The draft follows the constraint too, so its drafts are ones the model may keep.
    let mut state = constraint.cloned();
    for i in 0..k {
        if let Some(s) = state.as_mut() {
            s.mask(chain, false)?;
        }
        let q = chain.probabilities(&cache.logits, &cache.tokens, generated + i);
        let picked = if greedy {
            q.first().copied()
        } else {
            draw_from(rng, q)
        };
        let Some((x, _)) = picked else { break };
        set_q(&mut sp.qs, i, chain.distribution());
        sp.drafted.push(x);
        if let Some(s) = state.as_mut() {
            if s.take(x).unwrap_or(true) {
                break;
            }
        }
        if i + 1 < k {
            step.rows.clear();
            step.push(SEQ, x, cache.tokens.len(), true);
            model.forward_layers(&step, &mut cache.kv, precision, &mut cache.logits, n_layers)?;
            cache.tokens.push(x);
            stats.draft_passes += 1;
        }
    }
    stats.draft_seconds += started.elapsed().as_secs_f64();
    Ok(())
}

/// Where a draft puts its tokens and their draft distributions.
type DraftsOut<'a> = (&'a mut Vec<u32>, &'a mut Vec<Vec<(u32, f32)>>);

/// [`draft`] with the MTP block: its first pass takes in the pairs it lacks up to the pending
/// token, each further one pairs its own last output state with the draft before.
#[allow(clippy::too_many_arguments)]
fn draft_mtp(
    state: &mut mtp::MtpState,
    (drafted, qs): DraftsOut,
    model: &mut Model,
    precision: Precision,
    seq: &[u32],
    k: usize,
    (chain, rng, generated): (&mut SamplerChain, &mut Rng, usize),
    stats: &mut SpeculativeStats,
    constraint: Option<&Constrained>,
) -> Result<(), EngineError> {
    if seq.len() + k > state.capacity() {
        return Ok(());
    }
    let passes = state.catch_up(model, precision, seq)?;
    if passes == 0 {
        return Ok(());
    }
    stats.draft_passes += passes;
    let greedy = chain.is_greedy();
    let mut state_c = constraint.cloned();
    let mut history = seq.to_vec();
    for i in 0..k {
        if let Some(s) = state_c.as_mut() {
            s.mask(chain, false)?;
        }
        let q = chain.probabilities(&state.logits, &history, generated + i);
        let picked = if greedy {
            q.first().copied()
        } else {
            draw_from(rng, q)
        };
        let Some((x, _)) = picked else { break };
        set_q(qs, i, chain.distribution());
        drafted.push(x);
        history.push(x);
        if let Some(s) = state_c.as_mut() {
            if s.take(x).unwrap_or(true) {
                break;
            }
        }
        if i + 1 < k {
            state.step(model, precision, x)?;
            stats.draft_passes += 1;
        }
    }
    Ok(())
}

fn set_q(qs: &mut Vec<Vec<(u32, f32)>>, i: usize, q: &[(u32, f32)]) {
    if qs.len() <= i {
        qs.resize_with(i + 1, Vec::new);
    }
    qs[i].clear();
    qs[i].extend_from_slice(q);
}
