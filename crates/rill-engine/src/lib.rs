//! The runtime around the model: loading a model with its tokenizer ([`Engine`]), sessions that
//! keep a sequence's KV cache between calls ([`Session`]), token choice ([`Sampler`]), and the
//! autoregressive loop with its stop conditions and streamed events.

mod engine;
mod error;
mod rng;
mod sampler;
mod session;

pub use engine::Engine;
pub use error::EngineError;
pub use rng::Rng;
pub use sampler::{argmax, top_logprobs, Sampler, SamplingParams};
pub use session::{FinishReason, GenerateParams, Generation, Session, TokenEvent};

pub use rill_model::{Precision, SeqId};
