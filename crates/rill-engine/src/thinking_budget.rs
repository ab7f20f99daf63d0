//! A thinking budget: a reasoning model's thinking ends after so many tokens, by forcing the
//! text that closes it (`</think>`, Gemma 4's `<channel|>`, harmony's switch to the `final`
//! channel), appended without sampling like a constraint's forced tokens. The thinking is found
//! in the text (control tokens spelled out): it starts with the answer when the prompt opened it,
//! else when the answer writes its opening; it ends when the answer writes its closing.

use rill_tokenizer::Tokenizer;

/// How much a generation may think (a field of [`crate::GenerateParams`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingBudget {
    /// Tokens of thinking allowed (0: the thinking is closed at once).
    pub tokens: usize,
    /// The text that opens the thinking (when the answer must open it itself).
    pub open: String,
    /// The text forced to end it (the closing, with what should follow it).
    pub close: String,
    /// The text that shows the model ended it itself (`</think>`; harmony's `<|end|>`).
    pub closed_by: String,
    /// The prompt opened the thinking: the answer starts inside it.
    pub starts_inside: bool,
}

/// A decoder's progress through its budget.
pub(crate) struct BudgetState {
    budget: ThinkingBudget,
    /// The closing's token ids.
    close_ids: Vec<u32>,
    inside: bool,
    /// Thinking tokens so far.
    used: usize,
    /// The thinking is over (closed by the model or by force): nothing more to watch.
    over: bool,
    /// The end of the text so far (enough to find a marker that spans tokens).
    tail: String,
}

impl BudgetState {
    pub(crate) fn new(tokenizer: &Tokenizer, budget: &ThinkingBudget) -> BudgetState {
        BudgetState {
            close_ids: tokenizer.encode_with_special(&budget.close, false, true),
            inside: budget.starts_inside,
            used: 0,
            over: false,
            tail: String::new(),
            budget: budget.clone(),
        }
    }

    /// Takes an emitted token into account.
    pub(crate) fn saw(&mut self, tokenizer: &Tokenizer, token: u32) {
        if self.over {
            return;
        }
        if let Ok(piece) = tokenizer.token_to_bytes(token, true) {
            self.tail.push_str(&String::from_utf8_lossy(&piece));
        }
        let marker = |m: &str| !m.is_empty() && self.tail.contains(m);
        if self.inside {
            self.used += 1;
            if marker(&self.budget.closed_by) {
                self.over = true;
            }
        } else if marker(&self.budget.open) {
            self.inside = true;
            self.tail.clear();
        }
        // Keep only what a marker could span.
        let keep = 4 * (self.budget.open.len() + self.budget.close.len()).max(16);
        if self.tail.len() > keep {
            let mut cut = self.tail.len() - keep;
            while !self.tail.is_char_boundary(cut) {
                cut += 1;
            }
            self.tail.drain(..cut);
        }
    }

    /// The tokens to force now: the closing, once the budget is spent inside the thinking.
    pub(crate) fn due(&mut self) -> Option<Vec<u32>> {
        if self.over || !self.inside || self.used < self.budget.tokens {
            return None;
        }
        self.over = true;
        Some(self.close_ids.clone())
    }
}
