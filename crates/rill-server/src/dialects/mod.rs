//! The wire formats clients speak, each an adapter over [`crate::generation`]: it parses its
//! requests into the internal request and renders the answer's deltas in its own shapes (whole
//! and streamed), with its own error shape.

pub(crate) mod anthropic;
pub(crate) mod ollama;
pub(crate) mod openai;
pub(crate) mod responses;
