//! A Messages answer in Anthropic's shapes: the whole `message` object, or its stream
//! (`message_start`, `ping`, per block `content_block_start` / `content_block_delta` /
//! `content_block_stop`, `message_delta` with the stop reason and usage, `message_stop`; an
//! `error` event when generation fails midway).

use rill_engine::{FinishCause, FinishReason};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::generation::answer::{Delta, Event, Finish, Usage, Whole};
use crate::generation::deliver::{sse_event, StreamRender};

/// `stop_reason` and `stop_sequence` of a finish.
fn stop_reason(finish: &Finish) -> (&'static str, Value) {
    if finish.tool_calls {
        return ("tool_use", Value::Null);
    }
    match (&finish.reason, &finish.cause) {
        (FinishReason::Length, _) => ("max_tokens", Value::Null),
        (_, FinishCause::StopString(s)) => ("stop_sequence", json!(s)),
        _ => ("end_turn", Value::Null),
    }
}

fn usage_json(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt.saturating_sub(u.cached),
        "output_tokens": u.completion,
        "cache_read_input_tokens": u.cached,
        "cache_creation_input_tokens": 0,
    })
}

/// A call's arguments as the `input` object (an unreadable text becomes `{}`).
fn input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// The whole `message` object (`show_thinking`: else a thinking block is empty, as with
/// `thinking.display: "omitted"`).
pub(super) fn message(id: &str, model: &str, whole: &Whole, show_thinking: bool) -> Value {
    let c = &whole.choices[0];
    let mut content = Vec::new();
    if !c.reasoning.is_empty() {
        let thinking = if show_thinking {
            c.reasoning.as_str()
        } else {
            ""
        };
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !c.text.is_empty() || (c.calls.is_empty() && content.is_empty()) {
        content.push(json!({"type": "text", "text": c.text}));
    }
    for call in &c.calls {
        content.push(json!({
            "type": "tool_use", "id": call.id, "name": call.name, "input": input(&call.arguments),
        }));
    }
    let (reason, sequence) = stop_reason(&c.finish);
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage_json(whole.usage),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse(usize),
}

/// The stream of one answer.
pub(super) struct MessagesStream {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// The open block and its index.
    open: Option<(Block, usize)>,
    next_index: usize,
    finish: Option<Finish>,
    show_thinking: bool,
}

impl MessagesStream {
    pub(super) fn new(
        id: String,
        model: String,
        prompt_tokens: usize,
        show_thinking: bool,
    ) -> MessagesStream {
        MessagesStream {
            show_thinking,
            id,
            model,
            prompt_tokens,
            open: None,
            next_index: 0,
            finish: None,
        }
    }

    fn close(&mut self, out: &mut Vec<String>) {
        if let Some((block, index)) = self.open.take() {
            if block == Block::Thinking {
                out.push(sse_event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "signature_delta", "signature": ""}}),
                ));
            }
            out.push(sse_event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    /// The index of `block`, opening it (and closing the one before) when it is not open.
    fn ensure(&mut self, block: Block, start: Value, out: &mut Vec<String>) -> usize {
        if let Some((open, index)) = self.open {
            if open == block {
                return index;
            }
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((block, index));
        out.push(sse_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        index
    }

    fn delta(index: usize, delta: Value) -> String {
        sse_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }
}

impl StreamRender for MessagesStream {
    fn start(&mut self) -> Vec<String> {
        vec![
            sse_event(
                "message_start",
                &json!({"type": "message_start", "message": {
                    "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0,
                              "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
                }}),
            ),
            sse_event("ping", &json!({"type": "ping"})),
        ]
    }

    fn events(&mut self, events: Vec<Event>, _usage: Usage) -> Vec<String> {
        let mut out = Vec::new();
        for event in events {
            match event {
                Event::Delta { delta, .. } => match delta {
                    Delta::Reasoning(t) => {
                        let start = json!({"type": "thinking", "thinking": "", "signature": ""});
                        let i = self.ensure(Block::Thinking, start, &mut out);
                        if self.show_thinking {
                            out.push(Self::delta(
                                i,
                                json!({"type": "thinking_delta", "thinking": t}),
                            ));
                        }
                    }
                    Delta::Text(t) => {
                        let i =
                            self.ensure(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                        out.push(Self::delta(i, json!({"type": "text_delta", "text": t})));
                    }
                    Delta::CallStart { index, id, name } => {
                        let start =
                            json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                        self.ensure(Block::ToolUse(index), start, &mut out);
                    }
                    Delta::CallArguments { index, fragment } => {
                        let i = self.ensure(
                            Block::ToolUse(index),
                            json!({"type": "tool_use", "id": "", "name": "", "input": {}}),
                            &mut out,
                        );
                        out.push(Self::delta(
                            i,
                            json!({"type": "input_json_delta", "partial_json": fragment}),
                        ));
                    }
                },
                Event::Finish { finish, .. } => {
                    self.close(&mut out);
                    self.finish = Some(finish);
                }
            }
        }
        out
    }

    fn end(&mut self, usage: Usage) -> Vec<String> {
        let mut out = Vec::new();
        self.close(&mut out);
        let (reason, sequence) = self
            .finish
            .as_ref()
            .map_or(("end_turn", Value::Null), stop_reason);
        out.push(sse_event(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage_json(usage)}),
        ));
        out.push(sse_event("message_stop", &json!({"type": "message_stop"})));
        out
    }

    fn error(&mut self, error: &ApiError) -> Vec<String> {
        let kind = if error.status.as_u16() == 503 {
            "overloaded_error"
        } else {
            "api_error"
        };
        vec![sse_event(
            "error",
            &json!({"type": "error", "error": {"type": kind, "message": error.message}}),
        )]
    }
}
