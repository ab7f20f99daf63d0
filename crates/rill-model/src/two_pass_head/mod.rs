//! The output head in two passes (`--head two-pass`, the fast path's default where it pays).
//!
//! Decoding reads the whole output head for one row of logits: Gemma 3's 262,144 × 640 head is
//! 178 MB of its 253 MB. Yet a greedy step needs only the largest logit, and a step that cuts
//! the vocabulary (top-k, min-p) only the tokens it keeps. So the first pass reads a 4-bit copy
//! of the head (made at load, [`sketch::HeadSketch`]) and bounds each logit's distance to what
//! the one-pass head computes, rigorously: the copy's error per 32-element block (stored, rounded
//! up) against the hidden state's norm over that block, plus the activations' quantization and
//! the sums' rounding. The second pass computes the file's own rows, exactly as the one-pass head
//! does (same kernel, same bits), for every token whose upper bound reaches the cut; every other
//! token is certified below it and keeps its first-pass estimate. See `docs/two-pass-head.md`.

mod logits;
pub(crate) mod sketch;

pub(crate) use logits::{two_pass_logits, TwoPass, TwoPassScratch};

/// What a row's logits must get right; anything but [`HeadCut::Full`] lets the head take two
/// passes where the model has a copy to make the first.
#[derive(Debug, Clone, Copy, Default)]
pub enum HeadCut {
    /// Every logit exact: the one-pass head.
    #[default]
    Full,
    /// The `k` largest logits exact, with every token that ties or beats the `k`-th: all other
    /// tokens are certified below them and hold the first pass's estimates (greedy is `TopK(1)`;
    /// a sampler whose first cut is top-k). At most [`MAX_TOP_K`]; more takes the full head.
    TopK(u32),
    /// Every logit within `delta` of the largest exact, the largest among them: the others are
    /// certified more than `delta` below it (a sampler whose first cut is min-p:
    /// `delta = T · ln(1 / min_p)`).
    Within(f32),
}

/// The largest `k` of [`HeadCut::TopK`] the two-pass head takes.
pub const MAX_TOP_K: u32 = 256;

impl PartialEq for HeadCut {
    fn eq(&self, other: &HeadCut) -> bool {
        match (self, other) {
            (HeadCut::Full, HeadCut::Full) => true,
            (HeadCut::TopK(a), HeadCut::TopK(b)) => a == b,
            (HeadCut::Within(a), HeadCut::Within(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Eq for HeadCut {}

impl HeadCut {
    /// Whether the cut needs every logit (a full head).
    pub fn is_full(self) -> bool {
        match self {
            HeadCut::Full => true,
            HeadCut::TopK(k) => k == 0 || k > MAX_TOP_K,
            HeadCut::Within(d) => !(d.is_finite() && d >= 0.0),
        }
    }
}

/// When the model's output head may take two passes (for rows whose [`HeadCut`] allows it, on
/// the fast path).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TwoPassMode {
    /// Where it pays: a head of 100,000 rows or more stored in more than 5.5 bits a weight
    /// (the copy made on first use); rows whose bounds would reach far (an outlier-heavy hidden
    /// state, or after such rows) take the one-pass head.
    #[default]
    Auto,
    /// Wherever the head is stored in more than 5.5 bits a weight, for every row that allows
    /// it (none of `Auto`'s turns to the one-pass head after rows whose bounds reached far).
    On,
    /// Never: every row gets the one-pass head.
    Off,
}

/// What the two-pass head did, summed over the rows of logits it computed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeadStats {
    /// Rows of logits the two-pass head computed.
    pub rows: u64,
    /// Rows of logits the one-pass head computed.
    pub full_rows: u64,
    /// Of the two-pass rows, those whose bounds reached so many tokens that the second pass
    /// read the whole head.
    pub fallback_rows: u64,
    /// Head rows (tokens) computed exactly by the second pass, over every two-pass row of
    /// logits (a batch's rows share the refined groups: each counts them).
    pub refined: u64,
    /// Head rows (the vocabulary) over every two-pass row of logits.
    pub vocab: u64,
    /// Bytes of head the passes read: the copy, its bounds and the refined groups (two-pass),
    /// or the whole head (one-pass).
    pub bytes: u64,
}

impl HeadStats {
    /// The share of tokens the second pass computed.
    pub fn refined_share(&self) -> f64 {
        self.refined as f64 / self.vocab.max(1) as f64
    }

    pub(crate) fn add(&mut self, other: &HeadStats) {
        self.rows += other.rows;
        self.full_rows += other.full_rows;
        self.fallback_rows += other.fallback_rows;
        self.refined += other.refined;
        self.vocab += other.vocab;
        self.bytes += other.bytes;
    }
}

/// The model's two-pass head: whether it may be used, the copy once made, and what it did.
#[derive(Default)]
pub(crate) struct TwoPassState {
    pub(crate) mode: TwoPassMode,
    pub(crate) sketch: Option<sketch::HeadSketch>,
    pub(crate) stats: HeadStats,
    /// Passes still to give the one-pass head, and how many the next back-off gives.
    skip: u32,
    backoff: u32,
}

/// A two-pass row that refined more than this share of the head's groups cost about what the
/// one-pass head would have (its first pass then wasted): the next rows likely come from the
/// same flat stretch of text, so the one-pass head takes them, for a number of passes that
/// doubles while such rows follow each other.
const HEAVY_SHARE: f64 = 0.08;
const MAX_BACKOFF: u32 = 64;

impl TwoPassState {
    /// Whether this pass may take two passes (else it is one the back-off gives the one-pass
    /// head).
    pub(crate) fn take_turn(&mut self) -> bool {
        if self.mode == TwoPassMode::On {
            return true;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// After a two-pass head: its stats decide the back-off.
    pub(crate) fn observe(&mut self, stats: &HeadStats) {
        if self.mode == TwoPassMode::On {
            return;
        }
        if stats.refined_share() > HEAVY_SHARE {
            self.backoff = (self.backoff * 2).clamp(1, MAX_BACKOFF);
            self.skip = self.backoff;
        } else {
            self.backoff = 0;
        }
    }
}
