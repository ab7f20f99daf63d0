//! Compiling constraints for one model ([`Constrainer`]), a compiled constraint ([`Grammar`]),
//! and a sequence's place in it ([`TokenConstraint`]).

use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use llguidance::api::ParserLimits;
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::{Matcher, ParserFactory};
use rill_tokenizer::Tokenizer;

use crate::vocab::Vocab;
use crate::{ConstraintError, ConstraintSpec};

/// Bounds on compiling one constraint, so a hostile schema or grammar costs a bounded time and
/// memory and then fails, never stalls the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileLimits {
    /// Wall-clock time a compile may take ([`Constrainer::compile_with_timeout`]); zero
    /// refuses every constraint (structured output switched off).
    pub timeout: Duration,
    /// Symbols in the grammar's productions (llguidance's `max_grammar_size`).
    pub max_grammar_size: usize,
    /// Lexer states, which hold memory (~1-2 kB each).
    pub max_lexer_states: usize,
    /// Work building the lexer's regular expressions (llguidance's `initial_lexer_fuel`).
    pub initial_lexer_fuel: u64,
    /// Work the lexer may do for one token mask (`step_lexer_fuel`).
    pub step_lexer_fuel: u64,
    /// Earley items one token mask may create (`step_max_items`).
    pub step_max_items: usize,
}

impl Default for CompileLimits {
    fn default() -> Self {
        let d = ParserLimits::default();
        CompileLimits {
            timeout: Duration::from_secs(10),
            max_grammar_size: d.max_grammar_size,
            max_lexer_states: d.max_lexer_states,
            initial_lexer_fuel: d.initial_lexer_fuel,
            step_lexer_fuel: d.step_lexer_fuel,
            step_max_items: d.step_max_items,
        }
    }
}

/// Compiles constraints against one model's vocabulary. Building it walks the whole vocabulary
/// (tens of milliseconds for 49k tokens, a few hundred for 262k); build it once per model and
/// share it.
pub struct Constrainer {
    factory: ParserFactory,
    limits: CompileLimits,
}

impl std::fmt::Debug for Constrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constrainer")
            .field("limits", &self.limits)
            .finish()
    }
}

impl Constrainer {
    /// A compiler for `tokenizer`'s vocabulary with the default limits.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Constrainer, ConstraintError> {
        Constrainer::with_limits(tokenizer, CompileLimits::default())
    }

    pub fn with_limits(
        tokenizer: Arc<Tokenizer>,
        limits: CompileLimits,
    ) -> Result<Constrainer, ConstraintError> {
        let env: TokEnv = Arc::new(Vocab::new(tokenizer));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Vocabulary(e.to_string()))?;
        factory.quiet();
        let l = factory.limits_mut();
        l.max_grammar_size = limits.max_grammar_size;
        l.max_lexer_states = limits.max_lexer_states;
        l.initial_lexer_fuel = limits.initial_lexer_fuel;
        l.step_lexer_fuel = limits.step_lexer_fuel;
        l.step_max_items = limits.step_max_items;
        // Errors name the construct; the parser state and grammar dump would only be noise.
        l.verbose_errors = false;
        Ok(Constrainer { factory, limits })
    }

    /// Compiles `spec` on this thread (bounded by the limits' fuel and sizes, not by time).
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Grammar, ConstraintError> {
        let grammar = spec.to_grammar()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ConstraintError::Invalid {
                kind: spec.kind(),
                message: first_line(&e.to_string()),
            })?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Invalid {
                kind: spec.kind(),
                message: first_line(&e),
            });
        }
        // A grammar whose first mask is empty can produce nothing at all.
        let mask = matcher
            .compute_mask()
            .map_err(|e| ConstraintError::Invalid {
                kind: spec.kind(),
                message: first_line(&e.to_string()),
            })?;
        if mask.is_zero() {
            return Err(ConstraintError::Invalid {
                kind: spec.kind(),
                message: "no token of the vocabulary can start a matching text".into(),
            });
        }
        Ok(Grammar {
            start: TokenConstraint {
                matcher,
                mask: Some(mask),
                kind: spec.kind(),
                waiting: None,
                committed: 0,
                byte_tokens: Arc::default(),
            },
        })
    }

    /// [`Constrainer::compile`] on a thread of its own, given up after the limits' timeout (the
    /// thread then finishes on its own, bounded by the fuel limits, and its result is dropped).
    pub fn compile_with_timeout(
        self: &Arc<Self>,
        spec: ConstraintSpec,
    ) -> Result<Grammar, ConstraintError> {
        let me = Arc::clone(self);
        let kind = spec.kind();
        bounded(kind, self.limits.timeout, move || me.compile(&spec))
    }
}

/// `work` on a thread of its own, its result if it comes within `timeout`. A zero timeout
/// refuses at once, without starting anything.
fn bounded<T: Send + 'static>(
    kind: &'static str,
    timeout: Duration,
    work: impl FnOnce() -> Result<T, ConstraintError> + Send + 'static,
) -> Result<T, ConstraintError> {
    let timed_out = || ConstraintError::Timeout {
        kind,
        limit_ms: timeout.as_millis() as u64,
    };
    if timeout.is_zero() {
        return Err(timed_out());
    }
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("rill-constrain".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| ConstraintError::Vocabulary(format!("cannot start a thread: {e}")))?;
    match rx.recv_timeout(timeout) {
        Ok(result) => result,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(timed_out()),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(ConstraintError::Invalid {
            kind,
            message: "the compiler failed".into(),
        }),
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_string()
}

/// A compiled constraint at its start: [`Grammar::start`] gives each sequence its own state.
#[derive(Clone)]
pub struct Grammar {
    /// The state every sequence starts from.
    start: TokenConstraint,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar")
            .field("kind", &self.start.kind)
            .field("advanced", &self.start.committed)
            .finish()
    }
}

impl Grammar {
    /// The kind of constraint ([`ConstraintSpec::kind`]).
    pub fn kind(&self) -> &'static str {
        self.start.kind
    }

    /// The grammar with `tokens` already taken: sequences start after them (a branch that
    /// continues a constrained text from one of its tokens). An error if the constraint does
    /// not allow them.
    pub fn advanced(&self, tokens: &[u32]) -> Result<Grammar, ConstraintError> {
        let mut start = self.start.clone();
        for &t in tokens {
            start.commit(t)?;
        }
        Ok(Grammar { start })
    }

    /// The constraint applies only once the generated text ends with `trigger` (a control
    /// token's text counts as its text): before, every token is allowed; after, the grammar
    /// describes what follows the trigger. (A lazy grammar: a tool call constrained once the
    /// model opens one.)
    pub fn after(mut self, trigger: &str) -> Grammar {
        self.start.waiting = Some((trigger.as_bytes().to_vec(), Vec::new()));
        self
    }

    /// A fresh state for one sequence.
    pub fn start(&self) -> TokenConstraint {
        self.start.clone()
    }
}

/// One sequence's place in a constraint: which tokens may come next, taking the chosen one,
/// undoing tokens (speculation's rollback), copying (forks, beams).
#[derive(Clone)]
pub struct TokenConstraint {
    pub(crate) matcher: Matcher,
    /// The mask of the current state, once computed.
    mask: Option<SimpleVob>,
    kind: &'static str,
    /// Not started yet: the trigger, and the last bytes generated.
    waiting: Option<(Vec<u8>, Vec<u8>)>,
    committed: usize,
    /// The single-byte tokens a closing is searched over, in the search's order: looked up
    /// once per compiled constraint, shared by its sequences and their copies.
    pub(crate) byte_tokens: Arc<OnceLock<Vec<(u8, u32)>>>,
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConstraint")
            .field("kind", &self.kind)
            .field("committed", &self.committed)
            .finish()
    }
}

impl TokenConstraint {
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    fn state_error(&self, e: impl std::fmt::Display) -> ConstraintError {
        ConstraintError::State(first_line(&e.to_string()))
    }

    /// The tokens allowed next, as bits (token `t` is bit `t % 32` of word `t / 32`); computed
    /// once per state. End-of-generation tokens are allowed where the text may end.
    pub fn allowed(&mut self) -> Result<&[u32], ConstraintError> {
        if self.mask.is_none() {
            let mask = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| self.state_error(e))?;
            self.mask = Some(mask);
        }
        Ok(self.mask.as_ref().map(|m| m.as_slice()).unwrap_or(&[]))
    }

    /// [`TokenConstraint::allowed`], or `None` while a lazy constraint waits for its trigger
    /// (every token is allowed then).
    pub fn allowed_if_started(&mut self) -> Result<Option<&[u32]>, ConstraintError> {
        if self.waiting.is_some() {
            return Ok(None);
        }
        self.allowed().map(Some)
    }

    /// Whether a lazy constraint still waits for its trigger.
    pub fn is_waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// Whether `token` may come next.
    pub fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        if self.waiting.is_some() {
            return Ok(true);
        }
        let words = self.allowed()?;
        Ok(words
            .get(token as usize / 32)
            .is_some_and(|w| w >> (token % 32) & 1 == 1))
    }

    /// Takes `token` as the sequence's next token; an error if the constraint forbids it
    /// (nothing changes then).
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        if let Some((trigger, tail)) = self.waiting.as_mut() {
            let env = self
                .matcher
                .tok_env()
                .map_err(|e| ConstraintError::State(e.to_string()))?;
            let bytes = env.tok_trie().token(token);
            let bytes = bytes
                .strip_prefix(&[llguidance::toktrie::TokTrie::SPECIAL_TOKEN_MARKER])
                .unwrap_or(bytes);
            tail.extend_from_slice(bytes);
            if tail.ends_with(trigger) {
                self.waiting = None;
            } else {
                let keep = tail.len().saturating_sub(trigger.len());
                tail.drain(..keep);
            }
            return Ok(());
        }
        if !self.allows(token)? {
            return Err(ConstraintError::Rejected {
                token,
                message: format!("the {} does not allow it here", self.kind),
            });
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| self.state_error(e))?;
        self.mask = None;
        self.committed += 1;
        Ok(())
    }

    /// Undoes the last `n` committed tokens.
    pub fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        if n == 0 {
            return Ok(());
        }
        if n > self.committed {
            return Err(ConstraintError::State(format!(
                "cannot undo {n} tokens: only {} were taken",
                self.committed
            )));
        }
        self.matcher.rollback(n).map_err(|e| self.state_error(e))?;
        self.mask = None;
        self.committed -= n;
        Ok(())
    }

    /// The tokens the constraint forces from here, whatever the model prefers (a JSON key
    /// that is the only one left, the rest of the one matching choice): they can be appended
    /// without sampling. Not committed.
    pub fn forced(&mut self) -> Vec<u32> {
        if self.waiting.is_some() || self.is_finished() {
            return Vec::new();
        }
        self.matcher.compute_ff_tokens()
    }

    /// The text is complete and nothing may follow it (or the state failed): generation ends.
    pub fn is_finished(&self) -> bool {
        self.waiting.is_none() && self.matcher.is_stopped()
    }

    /// The text so far is complete (it may end here, though it may also go on).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_that_does_not_finish_in_time_is_given_up() {
        // The work waits for a message the test sends only after the bound has passed, so the
        // timeout is reached however fast the machine is.
        let (release, wait) = mpsc::channel::<()>();
        let got = bounded("test", Duration::from_millis(20), move || {
            let _ = wait.recv();
            Ok(1)
        });
        let _ = release.send(());
        assert!(matches!(
            got,
            Err(ConstraintError::Timeout {
                kind: "test",
                limit_ms: 20
            })
        ));
        // Work that is done is returned; a zero bound refuses without running anything.
        assert_eq!(bounded("test", Duration::from_secs(600), || Ok(2)), Ok(2));
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = ran.clone();
        let got = bounded("test", Duration::ZERO, move || {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(3)
        });
        assert!(matches!(got, Err(ConstraintError::Timeout { .. })));
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }
}
