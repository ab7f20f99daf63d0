//! The wire formats `rill bench serve` can load a server through: OpenAI's Chat Completions
//! (any OpenAI-compatible server), Anthropic's Messages and OpenAI's Responses (rill serve's
//! other dialects, to measure what a dialect costs per token). Each gives the request body and
//! reads its stream's events: the answer's text, the usage, the end.

use serde_json::{json, Value};

/// Which API the requests go through.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Dialect {
    /// `POST /v1/chat/completions`.
    #[default]
    Chat,
    /// `POST /v1/messages`.
    Messages,
    /// `POST /v1/responses`.
    Responses,
}

/// What one stream event says.
#[derive(Debug, Default, PartialEq)]
pub struct EventReading {
    /// Answer text it carries.
    pub text: Option<String>,
    /// (prompt, output) tokens, when it reports usage.
    pub usage: Option<(usize, usize)>,
    /// The stream's last event.
    pub done: bool,
}

/// The request's sampling: exactly `max_tokens` tokens (rill's and vLLM's `ignore_eos` and
/// `min_tokens`, which rill reads in every dialect).
pub struct Sampling {
    pub max_tokens: usize,
    pub temperature: f32,
    pub seed: u64,
}

impl Dialect {
    pub fn path(self) -> &'static str {
        match self {
            Dialect::Chat => "/v1/chat/completions",
            Dialect::Messages => "/v1/messages",
            Dialect::Responses => "/v1/responses",
        }
    }

    /// A streamed request of `messages` (`{role, content}` with string contents).
    pub fn body(self, messages: Vec<Value>, s: &Sampling, model: Option<&str>) -> Value {
        let t = s.max_tokens.max(1);
        let mut body = match self {
            Dialect::Chat => json!({
                "messages": messages,
                "max_tokens": t,
                "stream_options": { "include_usage": true },
            }),
            Dialect::Messages => json!({ "messages": messages, "max_tokens": t }),
            Dialect::Responses => json!({ "input": messages, "max_output_tokens": t }),
        };
        body["min_tokens"] = json!(t);
        body["ignore_eos"] = json!(true);
        body["temperature"] = json!(s.temperature);
        body["seed"] = json!(s.seed % (1 << 53));
        body["stream"] = json!(true);
        if let Some(m) = model {
            body["model"] = json!(m);
        }
        body
    }

    /// Reads one event's `data` (`[DONE]` ends a Chat Completions stream). An error event is
    /// an error.
    pub fn read(self, data: &str) -> Result<EventReading, String> {
        let mut r = EventReading::default();
        if data == "[DONE]" {
            r.done = self == Dialect::Chat;
            return Ok(r);
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("bad event: {data}: {e}"))?;
        if v.get("error").is_some_and(|e| !e.is_null()) || v["type"] == "error" {
            return Err(format!("error event: {data}"));
        }
        let get = |u: &Value, k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
        let nonempty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_string);
        match self {
            Dialect::Chat => {
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    r.usage = Some((get(u, "prompt_tokens"), get(u, "completion_tokens")));
                }
                let mut text = String::new();
                for c in v["choices"].as_array().into_iter().flatten() {
                    if let Some(s) = c.pointer("/delta/content").or_else(|| c.get("text")) {
                        text.push_str(s.as_str().unwrap_or(""));
                    }
                }
                r.text = nonempty(Some(&text));
            }
            Dialect::Messages => match v["type"].as_str() {
                Some("content_block_delta") => {
                    r.text = nonempty(v.pointer("/delta/text").and_then(Value::as_str))
                }
                Some("message_delta") => {
                    let u = &v["usage"];
                    r.usage = Some((
                        get(u, "input_tokens") + get(u, "cache_read_input_tokens"),
                        get(u, "output_tokens"),
                    ));
                }
                Some("message_stop") => r.done = true,
                _ => {}
            },
            Dialect::Responses => match v["type"].as_str() {
                Some("response.output_text.delta") => r.text = nonempty(v["delta"].as_str()),
                Some("response.completed" | "response.incomplete") => {
                    let u = &v["response"]["usage"];
                    r.usage = Some((get(u, "input_tokens"), get(u, "output_tokens")));
                    r.done = true;
                }
                Some("response.failed") => return Err(format!("failed: {data}")),
                _ => {}
            },
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dialect_reads_text_usage_and_the_end() {
        let chat = Dialect::Chat;
        assert_eq!(
            chat.read(r#"{"choices":[{"delta":{"content":"hi"}}]}"#)
                .unwrap()
                .text
                .as_deref(),
            Some("hi")
        );
        assert!(chat.read("[DONE]").unwrap().done);
        let m = Dialect::Messages;
        let r = m
            .read(r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"yo"}}"#)
            .unwrap();
        assert_eq!(r.text.as_deref(), Some("yo"));
        let r = m
            .read(r#"{"type":"message_delta","usage":{"input_tokens":3,"cache_read_input_tokens":4,"output_tokens":5}}"#)
            .unwrap();
        assert_eq!(r.usage, Some((7, 5)));
        assert!(m.read(r#"{"type":"message_stop"}"#).unwrap().done);
        assert!(m
            .read(r#"{"type":"error","error":{"type":"api_error","message":"x"}}"#)
            .is_err());
        let resp = Dialect::Responses;
        let r = resp
            .read(r#"{"type":"response.completed","response":{"usage":{"input_tokens":9,"output_tokens":2}}}"#)
            .unwrap();
        assert!(r.done);
        assert_eq!(r.usage, Some((9, 2)));
        assert_eq!(
            resp.read(r#"{"type":"response.output_text.delta","delta":"a"}"#)
                .unwrap()
                .text
                .as_deref(),
            Some("a")
        );
    }
}
