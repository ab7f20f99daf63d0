//! An answer in Ollama's shapes: NDJSON lines of `message` pieces (chat) or `response` pieces
//! (generate), thinking under `thinking`, tool calls whole once written (Ollama sends them so),
//! and a last line with `done: true`, the `done_reason` and the counts and durations
//! (nanoseconds). A whole answer is that last line with everything in it.

use std::time::Instant;

use rill_engine::FinishReason;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generation::answer::{Delta, Event, Finish, Usage};
use crate::generation::deliver::StreamRender;

/// Which endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Chat,
    Generate,
}

pub(super) struct OllamaRender {
    endpoint: Endpoint,
    model: String,
    started: Instant,
    first_token: Option<Instant>,
    text: String,
    thinking: String,
    /// Calls: name and arguments so far; those before `sent` were sent.
    calls: Vec<(String, String)>,
    sent: usize,
    finish: Option<Finish>,
    /// Collecting a whole answer (nothing is sent until the end).
    whole: bool,
}

/// RFC 3339 UTC time of now, with nanoseconds (Ollama's `created_at`).
pub(super) fn now_rfc3339() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(now.as_secs(), now.subsec_nanos())
}

/// `secs` since the epoch (and `nanos`) as RFC 3339 UTC.
pub(super) fn rfc3339(secs: u64, nanos: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl OllamaRender {
    pub(super) fn new(endpoint: Endpoint, model: String, whole: bool) -> OllamaRender {
        OllamaRender {
            endpoint,
            model,
            started: Instant::now(),
            first_token: None,
            text: String::new(),
            thinking: String::new(),
            calls: Vec::new(),
            sent: 0,
            finish: None,
            whole,
        }
    }

    fn line(v: &Value) -> String {
        format!("{v}\n")
    }

    /// A line of the answer so far: a message (chat) or a response piece (generate).
    fn piece(&self, content: &str, thinking: Option<&str>, calls: &[(String, String)]) -> Value {
        let mut v = json!({"model": self.model, "created_at": now_rfc3339(), "done": false});
        match self.endpoint {
            Endpoint::Chat => {
                let mut m = json!({"role": "assistant", "content": content});
                if let Some(t) = thinking {
                    m["thinking"] = json!(t);
                }
                if !calls.is_empty() {
                    m["tool_calls"] = calls
                        .iter()
                        .map(|(name, arguments)| {
                            let arguments = serde_json::from_str::<Value>(arguments)
                                .ok()
                                .filter(Value::is_object)
                                .unwrap_or_else(|| json!({}));
                            json!({"function": {"name": name, "arguments": arguments}})
                        })
                        .collect();
                }
                v["message"] = m;
            }
            Endpoint::Generate => {
                v["response"] = json!(content);
                if let Some(t) = thinking {
                    v["thinking"] = json!(t);
                }
            }
        }
        v
    }

    /// Calls written completely (all of them at the end) that were not sent.
    fn ready_calls(&mut self, all: bool) -> Vec<(String, String)> {
        let ready = if all {
            self.calls.len()
        } else {
            self.calls.len().saturating_sub(1)
        };
        let out = self.calls[self.sent.min(ready)..ready].to_vec();
        self.sent = self.sent.max(ready);
        out
    }

    /// The last line: done, with the whole answer when not streamed, and the statistics.
    pub(super) fn last(&mut self, usage: Usage) -> Value {
        let calls = if self.whole {
            self.calls.clone()
        } else {
            self.ready_calls(true)
        };
        let (content, thinking) = if self.whole {
            (
                self.text.clone(),
                (!self.thinking.is_empty()).then(|| self.thinking.clone()),
            )
        } else {
            (String::new(), None)
        };
        let mut v = self.piece(&content, thinking.as_deref(), &calls);
        let now = Instant::now();
        let first = self.first_token.unwrap_or(now);
        let nanos = |d: std::time::Duration| d.as_nanos() as u64;
        v["done"] = json!(true);
        v["done_reason"] = json!(match &self.finish {
            Some(f) if f.reason == FinishReason::Length => "length",
            _ => "stop",
        });
        v["total_duration"] = json!(nanos(now - self.started));
        v["load_duration"] = json!(0);
        v["prompt_eval_count"] = json!(usage.prompt);
        v["prompt_eval_duration"] = json!(nanos(first - self.started));
        v["eval_count"] = json!(usage.completion);
        v["eval_duration"] = json!(nanos(now - first));
        if self.endpoint == Endpoint::Generate {
            v["context"] = json!([]);
        }
        v
    }
}

impl StreamRender for OllamaRender {
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn events(&mut self, events: Vec<Event>, _usage: Usage) -> Vec<String> {
        self.first_token.get_or_insert_with(Instant::now);
        let mut out = Vec::new();
        for event in events {
            match event {
                Event::Delta { delta, .. } => match delta {
                    Delta::Text(t) => {
                        self.text.push_str(&t);
                        if !self.whole {
                            out.push(Self::line(&self.piece(&t, None, &[])));
                        }
                    }
                    Delta::Reasoning(t) => {
                        self.thinking.push_str(&t);
                        if !self.whole {
                            out.push(Self::line(&self.piece("", Some(&t), &[])));
                        }
                    }
                    Delta::CallStart { name, .. } => {
                        self.calls.push((name, String::new()));
                        let ready = self.ready_calls(false);
                        if !self.whole && !ready.is_empty() {
                            out.push(Self::line(&self.piece("", None, &ready)));
                        }
                    }
                    Delta::CallArguments { fragment, .. } => {
                        if let Some(c) = self.calls.last_mut() {
                            c.1.push_str(&fragment);
                        }
                    }
                },
                Event::Finish { finish, .. } => self.finish = Some(finish),
            }
        }
        out
    }

    fn end(&mut self, usage: Usage) -> Vec<String> {
        let last = self.last(usage);
        vec![Self::line(&last)]
    }

    fn error(&mut self, error: &ApiError) -> Vec<String> {
        vec![Self::line(&json!({ "error": error.message }))]
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_dates() {
        assert_eq!(super::rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            super::rfc3339(1_795_000_000, 5),
            "2026-11-18T11:06:40.000000005Z"
        );
        assert_eq!(
            super::rfc3339(951_782_400, 0),
            "2000-02-29T00:00:00.000000000Z"
        );
    }
}
