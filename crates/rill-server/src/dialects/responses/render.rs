//! A Responses answer in OpenAI's shapes. One renderer builds both the stream (`response.created`,
//! `response.in_progress`, per output item `response.output_item.added`, its part and text or
//! argument deltas and their `done` events, `response.output_item.done`, then
//! `response.completed` or `response.incomplete`) and the final response object, which a whole
//! answer returns and a stored response keeps.

use std::collections::BTreeMap;

use rill_engine::FinishReason;
use serde_json::{json, Map, Value};

use super::request::DeclaredTool;
use crate::error::ApiError;
use crate::generation::answer::{Delta, Event, Finish, Usage};
use crate::generation::deliver::{sse_event, StreamRender};

/// The item being written.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// What is done with the final response object (storing it).
pub(crate) type OnEnd = Box<dyn FnOnce(&Value) + Send>;

/// Renders one answer.
pub(crate) struct ResponsesRender {
    /// The response object without `output`, `status`, `usage` (filled in at the end).
    base: Map<String, Value>,
    declared: BTreeMap<String, DeclaredTool>,
    sequence: u64,
    output: Vec<Value>,
    open: Option<Open>,
    finish: Option<Finish>,
    usage: Usage,
    failed: Option<ApiError>,
    /// Called with the final response object when the answer ends (to store it).
    on_end: Option<OnEnd>,
}

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}", crate::params::random_seed())
}

impl ResponsesRender {
    pub(crate) fn new(
        base: Map<String, Value>,
        declared: BTreeMap<String, DeclaredTool>,
        on_end: Option<OnEnd>,
    ) -> ResponsesRender {
        ResponsesRender {
            base,
            declared,
            sequence: 0,
            output: Vec::new(),
            open: None,
            finish: None,
            usage: Usage::default(),
            failed: None,
            on_end,
        }
    }

    fn event(&mut self, name: &str, mut data: Value) -> String {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        sse_event(name, &data)
    }

    /// The response object as it stands (`status` given).
    pub(crate) fn response(&self, status: &str) -> Value {
        let mut r = self.base.clone();
        r.insert("status".into(), json!(status));
        r.insert("output".into(), Value::Array(self.output.clone()));
        let incomplete = (self.finish.as_ref())
            .filter(|f| f.reason == FinishReason::Length)
            .map(|_| json!({"reason": "max_output_tokens"}));
        r.insert(
            "incomplete_details".into(),
            incomplete.unwrap_or(Value::Null),
        );
        r.insert(
            "error".into(),
            match &self.failed {
                Some(e) => json!({"code": e.code.unwrap_or("server_error"), "message": e.message}),
                None => Value::Null,
            },
        );
        if status != "in_progress" {
            let u = self.usage;
            r.insert(
                "usage".into(),
                json!({
                    "input_tokens": u.prompt,
                    "input_tokens_details": {"cached_tokens": u.cached},
                    "output_tokens": u.completion,
                    "output_tokens_details": {"reasoning_tokens": u.reasoning},
                    "total_tokens": u.prompt + u.completion,
                }),
            );
        }
        Value::Object(r)
    }

    /// The final status: completed, or incomplete when cut by the length limit.
    fn status(&self) -> &'static str {
        match (&self.failed, &self.finish) {
            (Some(_), _) => "failed",
            (None, Some(f)) if f.reason == FinishReason::Length => "incomplete",
            _ => "completed",
        }
    }

    /// The finished item of what is open.
    fn item(&self, open: &Open, status: &str) -> Value {
        match open {
            Open::Reasoning { id, text } => json!({
                "type": "reasoning", "id": id, "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}],
            }),
            Open::Message { id, text } => json!({
                "type": "message", "id": id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
            }),
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => match self.declared.get(name) {
                Some(DeclaredTool::Custom { name }) => {
                    let input = serde_json::from_str::<Value>(arguments)
                        .ok()
                        .and_then(|v| v.get("input").and_then(Value::as_str).map(str::to_string))
                        .unwrap_or_default();
                    json!({"type": "custom_tool_call", "id": id, "call_id": call_id,
                           "name": name, "input": input, "status": status})
                }
                Some(DeclaredTool::Function {
                    name,
                    namespace: Some(ns),
                }) => json!({
                    "type": "function_call", "id": id, "call_id": call_id, "name": name,
                    "namespace": ns, "arguments": arguments, "status": status,
                }),
                _ => json!({
                    "type": "function_call", "id": id, "call_id": call_id, "name": name,
                    "arguments": arguments, "status": status,
                }),
            },
        }
    }

    fn close(&mut self, out: &mut Vec<String>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.output.len();
        let done = self.item(&open, "completed");
        match &open {
            Open::Reasoning { id, text } => {
                let e = json!({"item_id": id, "output_index": index, "content_index": 0,
                               "text": text});
                out.push(self.event("response.reasoning_text.done", e));
                let e = json!({"item_id": id, "output_index": index, "content_index": 0,
                               "part": {"type": "reasoning_text", "text": text}});
                out.push(self.event("response.content_part.done", e));
            }
            Open::Message { id, text } => {
                let e = json!({"item_id": id, "output_index": index, "content_index": 0,
                               "text": text, "logprobs": []});
                out.push(self.event("response.output_text.done", e));
                let part = json!({"type": "output_text", "text": text, "annotations": [],
                                  "logprobs": []});
                let e = json!({"item_id": id, "output_index": index, "content_index": 0,
                               "part": part});
                out.push(self.event("response.content_part.done", e));
            }
            Open::Call {
                id,
                name,
                arguments,
                ..
            } => {
                if !matches!(self.declared.get(name), Some(DeclaredTool::Custom { .. })) {
                    let e = json!({"item_id": id, "output_index": index,
                                   "arguments": arguments});
                    out.push(self.event("response.function_call_arguments.done", e));
                }
            }
        }
        let e = json!({"output_index": index, "item": done});
        out.push(self.event("response.output_item.done", e));
        self.output.push(done);
    }

    /// Opens a new item (closing the open one), announcing it.
    fn open(&mut self, open: Open, out: &mut Vec<String>) {
        self.close(out);
        let index = self.output.len();
        let mut added = self.item(&open, "in_progress");
        match &open {
            Open::Reasoning { id, .. } => {
                added["content"] = json!([]);
                out.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                ));
                let e = json!({"item_id": id, "output_index": index, "content_index": 0,
                               "part": {"type": "reasoning_text", "text": ""}});
                out.push(self.event("response.content_part.added", e));
            }
            Open::Message { id, .. } => {
                added["content"] = json!([]);
                out.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                ));
                let part = json!({"type": "output_text", "text": "", "annotations": [],
                                  "logprobs": []});
                let e = json!({"item_id": id, "output_index": index, "content_index": 0,
                               "part": part});
                out.push(self.event("response.content_part.added", e));
            }
            Open::Call { .. } => {
                out.push(self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                ));
            }
        }
        self.open = Some(open);
    }

    fn delta(&mut self, delta: Delta, out: &mut Vec<String>) {
        let index = self.output.len();
        match delta {
            Delta::Reasoning(t) => {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    let id = item_id("rs");
                    self.open(
                        Open::Reasoning {
                            id,
                            text: String::new(),
                        },
                        out,
                    );
                }
                if let Some(Open::Reasoning { id, text }) = &mut self.open {
                    text.push_str(&t);
                    let e = json!({"item_id": id, "output_index": index, "content_index": 0,
                                   "delta": t});
                    out.push(self.event("response.reasoning_text.delta", e));
                }
            }
            Delta::Text(t) => {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    let id = item_id("msg");
                    self.open(
                        Open::Message {
                            id,
                            text: String::new(),
                        },
                        out,
                    );
                }
                let index = self.output.len();
                if let Some(Open::Message { id, text }) = &mut self.open {
                    text.push_str(&t);
                    let e = json!({"item_id": id, "output_index": index, "content_index": 0,
                                   "delta": t, "logprobs": []});
                    out.push(self.event("response.output_text.delta", e));
                }
            }
            Delta::CallStart { id, name, .. } => {
                let open = Open::Call {
                    id: item_id("fc"),
                    call_id: id,
                    name,
                    arguments: String::new(),
                };
                self.open(open, out);
            }
            Delta::CallArguments { fragment, .. } => {
                let index = self.output.len();
                let custom = match &self.open {
                    Some(Open::Call { name, .. }) => {
                        matches!(self.declared.get(name), Some(DeclaredTool::Custom { .. }))
                    }
                    _ => return,
                };
                if let Some(Open::Call { id, arguments, .. }) = &mut self.open {
                    arguments.push_str(&fragment);
                    if !custom {
                        let e = json!({"item_id": id, "output_index": index, "delta": fragment});
                        out.push(self.event("response.function_call_arguments.delta", e));
                    }
                }
            }
        }
    }

    /// The final response object of a whole answer, after its events went through
    /// [`StreamRender::events`].
    pub(crate) fn whole(&mut self, usage: Usage) -> Value {
        self.usage = usage;
        self.finished()
    }

    /// The final response object (stored, when the request stores it).
    fn finished(&mut self) -> Value {
        let mut out = Vec::new();
        self.close(&mut out);
        let response = self.response(self.status());
        if let Some(store) = self.on_end.take() {
            store(&response);
        }
        response
    }
}

impl StreamRender for ResponsesRender {
    fn start(&mut self) -> Vec<String> {
        let r = self.response("in_progress");
        vec![
            self.event("response.created", json!({"response": r})),
            self.event("response.in_progress", json!({"response": r})),
        ]
    }

    fn events(&mut self, events: Vec<Event>, usage: Usage) -> Vec<String> {
        self.usage = usage;
        let mut out = Vec::new();
        for event in events {
            match event {
                Event::Delta { delta, .. } => self.delta(delta, &mut out),
                Event::Finish { finish, .. } => {
                    self.close(&mut out);
                    self.finish = Some(finish);
                }
            }
        }
        out
    }

    fn end(&mut self, usage: Usage) -> Vec<String> {
        self.usage = usage;
        let mut out = Vec::new();
        self.close(&mut out);
        let response = self.finished();
        let name = if self.status() == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.event(name, json!({ "response": response })));
        out
    }

    fn error(&mut self, error: &ApiError) -> Vec<String> {
        let mut out = Vec::new();
        self.close(&mut out);
        self.failed = Some(error.clone());
        let response = self.response("failed");
        out.push(self.event("response.failed", json!({ "response": response })));
        out
    }
}
