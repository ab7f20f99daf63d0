//! The runtime around the model: loading a model with its tokenizer ([`Engine`]), sessions that
//! keep a sequence's KV cache between calls ([`Session`]), token choice ([`SamplerChain`]), stop
//! strings over streamed text ([`StopMatcher`]), log-probabilities ([`TokenLogprobs`]), and the
//! autoregressive loop with its stop conditions and streamed events, plain or speculative
//! ([`Session::generate_speculative`]: a draft model, the model's own first layers, or prompt
//! lookup proposes tokens that one batched pass verifies).

pub mod beam;
mod budget_closing;
mod constrained;
pub mod counterfactual;
mod decoder;
mod embedding;
mod emit;
mod engine;
mod error;
mod lens;
mod logprobs;
pub mod receipt;
mod rng;
mod sampling;
pub mod serve;
mod session;
pub mod speculative;
mod stop;
mod thinking_budget;

pub use beam::{
    beam_score, beam_search, BeamError, BeamFinish, BeamHypothesis, BeamNode, BeamOutput,
    BeamParams, BeamStep, BeamStop, BeamTrace, EarlyStopping, NodeStatus, RunningBeam,
};
pub use constrained::ConstraintStep;
pub use counterfactual::{
    apply_edit, check_edits, Counterfactual, Counterfactuals, Edit, MAX_COUNTERFACTUALS,
};
pub use embedding::{leading_dimensions, Embeddings, Pooling};
pub use engine::{CacheLease, Engine};
pub use error::EngineError;
pub use lens::{LayerWrites, Lens, LensLayer, LensOptions, MAX_VALUE_WEIGHT_WORK};
pub use logprobs::{
    check_top_logprobs, kl_divergence, log_softmax_stats, top_logprobs, top_logprobs_into,
    LogSoftmaxStats, PromptTokenLogprobs, TokenLogprobs, MAX_TOP_LOGPROBS,
};
pub use receipt::{
    kernel_paths, ModelIdentity, Receipt, ReceiptChoice, ReceiptError, ReplayVerdict,
    RECEIPT_VERSION,
};
pub use rng::Rng;
pub use sampling::{argmax, draw_from, Draw, Sampler, SamplerChain, SamplingParams, Stage};
pub use serve::{
    kv_capacity, spawn, split_kv_budget, state_budget, Job, KvCapacity, KvSplit, KvStats,
    ModelInfo, ModelSummary, PickRule, PromptInfo, ResponseStream, ServeConfig, ServeEvent,
    ServeHandle, ServeRequest, StateBudget, StepInfo, SubmitError, TokenCost, TokenDetail, Trace,
    KV_SPLIT_CONVERSATION_TOKENS, MAX_CHOICES,
};
pub use session::{
    FinishCause, FinishReason, GenerateParams, Generation, Session, TokenEvent, SESSION_PASS_ROWS,
};
pub use speculative::{
    check_draft_vocabulary, ngram_lookup, DraftKind, DraftSource, NgramParams, SpeculativeParams,
    SpeculativeRound, SpeculativeStats, Speculator, Verdict, Verifier, MAX_DRAFT_TOKENS,
    MAX_PROBE_INTERVAL, PROBE_INTERVAL,
};
pub use stop::StopMatcher;
pub use thinking_budget::ThinkingBudget;

pub use rill_model::{Precision, SeqId};
