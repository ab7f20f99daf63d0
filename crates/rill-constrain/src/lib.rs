//! Structured output: what a generation may say, enforced token by token.
//!
//! A [`ConstraintSpec`] (a JSON Schema, any JSON object, a regular expression, a list of
//! choices, a Lark or GBNF grammar) is compiled by a [`Constrainer`] (one per model: it holds
//! the vocabulary as a trie of token bytes, built from rill's own tokenizer) into a [`Grammar`];
//! each sequence then walks it with a [`TokenConstraint`], which says which tokens may come
//! next (a bit mask over the vocabulary), takes the chosen one, undoes tokens, forks, names
//! the tokens the grammar forces, and says when the text is complete.
//!
//! The parsing is llguidance's (an Earley parser over a lazy lexer, masks computed from the
//! token trie); this crate is the bridge to rill's vocabulary and the place where every
//! constraint fails closed: a schema or grammar that cannot be enforced is an error naming
//! the construct, never unconstrained output.

mod closing;
mod gbnf;
mod matcher;
pub mod native_calls;
mod spec;
pub mod tools;
mod vocab;

pub use closing::Closing;
pub use matcher::{CompileLimits, Constrainer, Grammar, TokenConstraint};
pub use spec::{layout_json, ConstraintSpec};

/// Why a constraint cannot be compiled or followed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConstraintError {
    /// The schema, regex, choices or grammar cannot be enforced (unsupported keyword, syntax
    /// error, a limit exceeded, nothing can match).
    #[error("invalid {kind}: {message}")]
    Invalid { kind: &'static str, message: String },
    /// A GBNF grammar that cannot be read or lowered.
    #[error("GBNF grammar, line {line} column {column}: {message}")]
    Gbnf {
        line: usize,
        column: usize,
        message: String,
    },
    /// Compiling took longer than [`CompileLimits::timeout`].
    #[error("compiling the {kind} took longer than {limit_ms} ms")]
    Timeout { kind: &'static str, limit_ms: u64 },
    /// A token the constraint does not allow at this point.
    #[error("token {token} rejected: {message}")]
    Rejected { token: u32, message: String },
    /// The constraint's state failed (a step limit reached while computing a mask).
    #[error("constraint failed: {0}")]
    State(String),
    /// The vocabulary cannot be turned into a token trie.
    #[error("cannot index the vocabulary for constraints: {0}")]
    Vocabulary(String),
}
