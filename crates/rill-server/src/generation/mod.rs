//! The internal generation request and its output, which every dialect shares: reading an HTTP
//! request, prompts as tokens, the request submitted to the engine loop ([`submit::Job`]), the
//! constraint stage's inputs (structured output, tools), and the answer read back as typed
//! deltas (text, reasoning, tool calls). Dialects parse their wire format into a `Job` and
//! render these deltas; nothing here knows a wire format's shape but the errors'.

pub(crate) mod answer;
pub(crate) mod chat;
pub(crate) mod deliver;
pub(crate) mod embed;
pub(crate) mod prompt;
pub(crate) mod reasoning;
pub(crate) mod receipts;
pub(crate) mod request;
pub(crate) mod structured;
pub(crate) mod submit;
pub(crate) mod tools;
