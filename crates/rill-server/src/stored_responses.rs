//! The Responses API's stored responses, for `previous_response_id` and `GET /v1/responses/ID`:
//! in memory, bounded in number ([`RESPONSES_KEPT`], the oldest forgotten first) and in age
//! ([`RESPONSE_MAX_AGE`]). A server restart forgets them all.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rill_tokenizer::ChatMessage;
use serde_json::Value;

/// Most responses kept.
pub const RESPONSES_KEPT: usize = 256;
/// Longest a response is kept.
pub const RESPONSE_MAX_AGE: Duration = Duration::from_secs(3600);

/// One stored response.
#[derive(Debug, Clone)]
pub(crate) struct StoredResponse {
    /// The conversation up to and including this response's output (without `instructions`,
    /// which a follow-up does not inherit).
    pub conversation: Vec<ChatMessage>,
    /// The response object as it was returned.
    pub response: Value,
}

/// The newest stored responses by id.
#[derive(Default)]
pub(crate) struct ResponseStore {
    entries: VecDeque<(String, Instant, StoredResponse)>,
}

impl ResponseStore {
    pub(crate) fn insert(&mut self, id: String, response: StoredResponse) {
        self.expire();
        if self.entries.len() == RESPONSES_KEPT {
            self.entries.pop_front();
        }
        self.entries.push_back((id, Instant::now(), response));
    }

    pub(crate) fn get(&mut self, id: &str) -> Option<StoredResponse> {
        self.expire();
        (self.entries.iter())
            .find(|(i, _, _)| i == id)
            .map(|(_, _, r)| r.clone())
    }

    /// Forgets response `id`; whether it was kept.
    pub(crate) fn remove(&mut self, id: &str) -> bool {
        self.expire();
        let before = self.entries.len();
        self.entries.retain(|(i, _, _)| i != id);
        self.entries.len() != before
    }

    fn expire(&mut self) {
        while (self.entries.front()).is_some_and(|(_, at, _)| at.elapsed() > RESPONSE_MAX_AGE) {
            self.entries.pop_front();
        }
    }
}
