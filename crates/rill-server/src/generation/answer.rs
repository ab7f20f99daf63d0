//! The answer as typed deltas, whatever dialect renders it: text, thinking (apart from the text,
//! [`super::reasoning`]) and tool calls (their start, then their arguments in pieces), then a
//! finish and the usage. [`AnswerReader`] reads one choice's tokens; [`Answer`] drives a
//! submitted job's streams and yields [`Event`]s, or collects them into a [`Whole`] answer.

use std::sync::Arc;

use futures::stream::SelectAll;
use futures::StreamExt;
use rill_constrain::native_calls::ParamTypes;
use rill_constrain::tools::{ToolDelta, ToolFormat, ToolReader};
use rill_engine::serve::ServeEvent;
use rill_engine::{FinishCause, FinishReason};
use rill_tokenizer::Tokenizer;

use crate::error::ApiError;
use crate::generation::reasoning::{Part, ReasoningSplit, ReasoningSyntax};
use crate::generation::submit::{Events, Job};
use crate::request_log::GenerationNote;

/// A piece of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Delta {
    Text(String),
    Reasoning(String),
    /// Call `index` begins: its id and complete name.
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    CallArguments {
        index: usize,
        fragment: String,
    },
}

/// A tool call of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub id: String,
    pub name: String,
    /// The arguments' JSON text as the model wrote it.
    pub arguments: String,
}

/// How many calls an answer may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallLimit {
    /// One call, then the answer ends (`parallel_tool_calls: false`, a named tool choice).
    One,
    /// Any number; a call identical to an earlier one ends the list instead of repeating it.
    Many,
}

/// How to read an answer.
#[derive(Debug, Clone)]
pub(crate) struct ReadOptions {
    /// The thinking syntax, and the prompt's text (which may open the thinking).
    pub reasoning: Option<(ReasoningSyntax, String)>,
    /// The format calls are written in, when the request gave tools.
    pub tools: Option<ToolFormat>,
    pub call_limit: CallLimit,
    /// The declared tools, when an answer that is only a JSON object naming one (bare or in a
    /// fence) counts as its call (the formats read from free text).
    pub tool_names: Vec<String>,
    /// The tools' parameter types, which calls written as bare text (Qwen's XML) are read as.
    pub param_types: ParamTypes,
}

impl ReadOptions {
    /// Plain text: no thinking, no calls.
    pub(crate) fn text() -> ReadOptions {
        ReadOptions {
            reasoning: None,
            tools: None,
            call_limit: CallLimit::Many,
            tool_names: Vec::new(),
            param_types: ParamTypes::default(),
        }
    }
}

/// Reads one choice's tokens into deltas.
pub(crate) struct AnswerReader {
    split: Option<ReasoningSplit>,
    tools: Option<(ToolFormat, ToolReader)>,
    call_limit: CallLimit,
    /// The answer's text apart from thinking and harmony calls (tools read it whole).
    content: String,
    /// Calls begun: id, name, arguments so far, whether it was announced.
    calls: Vec<Call>,
    /// Calls streamed as they are written (the first); later ones wait until complete, so
    /// that a repeated call can end the list before any of it was sent.
    streamed: usize,
    /// A call repeated an earlier one, or the one allowed call is complete: the answer ends.
    enough: bool,
    tool_names: Vec<String>,
    /// Content held back because it may be a JSON call (it opens with `{` or a fence).
    held_json: String,
    /// The answer was a JSON call: it has no text.
    json_call: bool,
}

impl AnswerReader {
    pub(crate) fn new(options: &ReadOptions) -> AnswerReader {
        AnswerReader {
            split: (options.reasoning.as_ref()).map(|(s, prompt)| ReasoningSplit::new(*s, prompt)),
            tools: (options.tools)
                .map(|f| (f, ToolReader::with_types(f, options.param_types.clone()))),
            call_limit: options.call_limit,
            content: String::new(),
            calls: Vec::new(),
            streamed: 0,
            enough: false,
            tool_names: options.tool_names.clone(),
            held_json: String::new(),
            json_call: false,
        }
    }

    /// Whether the answer is inside its thinking (a thinking budget counts these tokens).
    pub(crate) fn thinking(&self) -> bool {
        self.split.as_ref().is_some_and(ReasoningSplit::thinking)
    }

    /// Whether the answer has made the calls it may: nothing after it is read.
    pub(crate) fn enough(&self) -> bool {
        self.enough
    }

    /// A whole answer's text: the text streamed, or with tools the content as read from the
    /// whole answer (its trailing whitespace left out).
    pub(crate) fn whole_text(&self, streamed: &str) -> String {
        if self.json_call {
            return String::new();
        }
        match &self.tools {
            Some((_, reader)) => reader.read_whole(&self.content).content,
            None => streamed.to_string(),
        }
    }

    /// The calls read so far (complete ones, once the answer ends).
    pub(crate) fn calls(&self) -> &[Call] {
        &self.calls
    }

    /// The deltas of one generated token: `text` is the engine's text of it (never part of a
    /// stop string); a control token's own text is read too when thinking or calls are read,
    /// since their markers are often control tokens.
    pub(crate) fn push(&mut self, tokenizer: &Tokenizer, token: u32, text: &str) -> Vec<Delta> {
        if self.enough {
            return Vec::new();
        }
        if self.split.is_none() && self.tools.is_none() {
            return if text.is_empty() {
                Vec::new()
            } else {
                vec![Delta::Text(text.to_string())]
            };
        }
        let spelled;
        let text = if text.is_empty()
            && tokenizer.is_control(token)
            && !tokenizer.is_end_of_generation(token)
        {
            spelled = tokenizer
                .token_to_bytes(token, true)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            spelled.as_str()
        } else {
            text
        };
        let parts = match &mut self.split {
            Some(split) => split.push(text),
            None => vec![Part::Content(text.to_string())],
        };
        self.parts(parts)
    }

    /// The deltas of whatever was held back, at the answer's end.
    pub(crate) fn finish(&mut self) -> Vec<Delta> {
        let parts = match &mut self.split {
            Some(split) if !self.enough => split.finish(),
            _ => Vec::new(),
        };
        let mut out = self.parts(parts);
        if !self.held_json.is_empty() {
            let held = std::mem::take(&mut self.held_json);
            let names: Vec<&str> = self.tool_names.iter().map(String::as_str).collect();
            match rill_constrain::native_calls::json_call(&held, &names) {
                Some((name, arguments)) => {
                    let id = crate::generation::tools::call_id();
                    out.push(Delta::CallStart {
                        index: 0,
                        id: id.clone(),
                        name: name.clone(),
                    });
                    out.push(Delta::CallArguments {
                        index: 0,
                        fragment: arguments.clone(),
                    });
                    self.calls.push(Call {
                        id,
                        name,
                        arguments,
                    });
                    self.json_call = true;
                    return out;
                }
                None => out.push(Delta::Text(held)),
            }
        }
        if let Some((_, reader)) = self
            .tools
            .as_ref()
            .filter(|(f, _)| *f != ToolFormat::Harmony)
        {
            // Only complete calls stay (one cut by the length limit is not a call).
            let complete = reader.read_whole(&self.content).calls;
            if complete.is_empty() {
                self.calls.clear();
            }
            if !self.enough {
                out.extend(self.release(&complete));
            }
        }
        out
    }

    fn parts(&mut self, parts: Vec<Part>) -> Vec<Delta> {
        let mut out = Vec::new();
        for part in parts {
            match part {
                Part::Reasoning(t) => out.push(Delta::Reasoning(t)),
                Part::Content(t) => match &mut self.tools {
                    None => out.push(Delta::Text(t)),
                    Some(_) => {
                        self.content.push_str(&t);
                        self.read_calls(&mut out);
                    }
                },
                Part::CallStart(name) => {
                    let index = self.calls.len();
                    let id = crate::generation::tools::call_id();
                    self.calls.push(Call {
                        id: id.clone(),
                        name: name.clone(),
                        arguments: String::new(),
                    });
                    self.streamed = self.calls.len();
                    out.push(Delta::CallStart { index, id, name });
                }
                Part::CallArguments(fragment) => {
                    if let Some(call) = self.calls.last_mut() {
                        call.arguments.push_str(&fragment);
                        out.push(Delta::CallArguments {
                            index: self.calls.len() - 1,
                            fragment,
                        });
                    }
                }
            }
            if self.enough {
                break;
            }
        }
        out
    }

    /// Reads the content's calls: the first streams as it is written; later ones are released
    /// whole once complete, unless one repeats an earlier call (the list ends there).
    fn read_calls(&mut self, out: &mut Vec<Delta>) {
        let Some((format, reader)) = &mut self.tools else {
            return;
        };
        let format = *format;
        for d in reader.update(&self.content) {
            match d {
                ToolDelta::Content(t) => {
                    let candidate = !self.tool_names.is_empty()
                        && self.calls.is_empty()
                        && (!self.held_json.is_empty() || {
                            let head = t.trim_start();
                            head.starts_with('{') || head.starts_with('`')
                        });
                    if candidate {
                        self.held_json.push_str(&t);
                    } else {
                        out.push(Delta::Text(t));
                    }
                }
                ToolDelta::CallStart { index, name } if index == 0 => {
                    let id = crate::generation::tools::call_id();
                    self.calls.push(Call {
                        id: id.clone(),
                        name: name.clone(),
                        arguments: String::new(),
                    });
                    self.streamed = 1;
                    out.push(Delta::CallStart { index, id, name });
                }
                ToolDelta::Arguments { index, fragment } if index == 0 => {
                    self.calls[0].arguments.push_str(&fragment);
                    out.push(Delta::CallArguments { index, fragment });
                }
                _ => {}
            }
        }
        // Harmony's calls come with its channels, not from the text.
        if self.calls.is_empty() || format == ToolFormat::Harmony {
            return;
        }
        let Some((_, reader)) = &self.tools else {
            return;
        };
        let complete = reader.read_whole(&self.content).calls;
        if self.call_limit == CallLimit::One && !complete.is_empty() {
            self.enough = true;
            return;
        }
        out.extend(self.release(&complete));
    }

    /// Releases the complete calls after the first not yet released; a repeat ends the list.
    fn release(&mut self, complete: &[rill_constrain::tools::ParsedCall]) -> Vec<Delta> {
        let mut out = Vec::new();
        while self.streamed < complete.len() && !self.enough {
            let call = &complete[self.streamed];
            let repeat = complete[..self.streamed]
                .iter()
                .any(|c| c.name == call.name && same_json(&c.arguments, &call.arguments));
            if repeat {
                self.enough = true;
                break;
            }
            let index = self.streamed;
            let id = crate::generation::tools::call_id();
            self.calls.push(Call {
                id: id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
            out.push(Delta::CallStart {
                index,
                id,
                name: call.name.clone(),
            });
            out.push(Delta::CallArguments {
                index,
                fragment: call.arguments.clone(),
            });
            self.streamed += 1;
        }
        out
    }
}

/// Whether two JSON texts hold the same value (else the same text).
fn same_json(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<serde_json::Value>(a),
        serde_json::from_str::<serde_json::Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// How a choice ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finish {
    pub reason: FinishReason,
    pub cause: FinishCause,
    /// The answer made tool calls (and stopped by itself, or after its allowed calls).
    pub tool_calls: bool,
}

/// Tokens of a job.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Usage {
    pub prompt: usize,
    pub completion: usize,
    pub cached: usize,
    /// Generated tokens of thinking (part of `completion`).
    pub reasoning: usize,
}

/// What [`Answer::next`] yields.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    Delta { choice: usize, delta: Delta },
    Finish { choice: usize, finish: Finish },
}

struct ChoiceState {
    reader: AnswerReader,
    tokens: usize,
    reasoning_tokens: usize,
    finish: Option<Finish>,
}

/// A submitted job's answer as typed events.
pub(crate) struct Answer {
    events: Events,
    tokenizer: Arc<Tokenizer>,
    choices: Vec<ChoiceState>,
    /// Choices per prompt.
    n: usize,
    usage: Usage,
    usage_seen: bool,
    prompt_tokens: usize,
    /// The served model's name (for the request log).
    model: String,
    note: Option<GenerationNote>,
}

impl Answer {
    /// The answer of `job`, whose streams are `events`.
    pub(crate) fn new(
        events: Events,
        tokenizer: Arc<Tokenizer>,
        job: &Job,
        options: &ReadOptions,
        note: Option<GenerationNote>,
    ) -> Answer {
        Answer {
            events,
            tokenizer,
            model: job.model.clone(),
            n: job.common.n,
            prompt_tokens: job.prompts.iter().map(Vec::len).sum(),
            choices: (0..job.choices())
                .map(|_| ChoiceState {
                    reader: AnswerReader::new(options),
                    tokens: 0,
                    reasoning_tokens: 0,
                    finish: None,
                })
                .collect(),
            usage: Usage::default(),
            usage_seen: false,
            note,
        }
    }

    /// The job's usage so far (counted here when the engine did not report it).
    pub(crate) fn usage(&self) -> Usage {
        let reasoning = self.choices.iter().map(|c| c.reasoning_tokens).sum();
        if self.usage_seen {
            Usage {
                reasoning,
                ..self.usage
            }
        } else {
            Usage {
                prompt: self.prompt_tokens,
                completion: self.choices.iter().map(|c| c.tokens).sum(),
                cached: 0,
                reasoning,
            }
        }
    }

    /// The next events (None: the answer ended); an error ends it.
    pub(crate) async fn next(&mut self) -> Option<Result<Vec<Event>, ApiError>> {
        loop {
            let Some((prompt, event)) = self.events.next().await else {
                self.note_finish();
                if self.choices.iter().any(|c| c.finish.is_none()) {
                    return Some(Err(crate::error::generation_failed(
                        "the engine ended the request without finishing it".into(),
                    )));
                }
                return None;
            };
            match self.on_event(prompt, event) {
                Ok(events) if events.is_empty() => continue,
                Ok(events) => return Some(Ok(events)),
                Err(e) => {
                    self.events = SelectAll::new();
                    return Some(Err(e));
                }
            }
        }
    }

    fn on_event(&mut self, prompt: usize, event: ServeEvent) -> Result<Vec<Event>, ApiError> {
        let mut out = Vec::new();
        match event {
            ServeEvent::Token {
                choice,
                token,
                text,
                ..
            } => {
                let i = prompt * self.n + choice;
                let Some(c) = self.choices.get_mut(i) else {
                    return Ok(out);
                };
                if c.finish.is_some() {
                    return Ok(out);
                }
                if let Some(note) = &self.note {
                    note.first_token();
                }
                c.tokens += 1;
                let was_thinking = c.reader.thinking();
                let deltas = c.reader.push(&self.tokenizer, token, &text);
                if was_thinking || c.reader.thinking() {
                    c.reasoning_tokens += 1;
                }
                for delta in deltas {
                    out.push(Event::Delta { choice: i, delta });
                }
                if c.reader.enough() && self.choices.len() == 1 {
                    // The allowed calls are made: the rest is not generated (dropping the
                    // streams cancels the request).
                    self.events = SelectAll::new();
                    out.extend(self.finish_choice(i, FinishReason::Stop, FinishCause::Cancelled));
                }
            }
            ServeEvent::Done {
                choice,
                finish_reason,
                cause,
            } => {
                let i = prompt * self.n + choice;
                if self.choices.get(i).is_some_and(|c| c.finish.is_none()) {
                    out.extend(self.finish_choice(i, finish_reason, cause));
                }
            }
            ServeEvent::Usage {
                prompt_tokens,
                completion_tokens,
                cached_prompt_tokens,
            } => {
                self.usage_seen = true;
                self.usage.prompt += prompt_tokens;
                self.usage.completion += completion_tokens;
                self.usage.cached += cached_prompt_tokens;
            }
            ServeEvent::Error { message } => return Err(crate::error::generation_failed(message)),
        }
        Ok(out)
    }

    fn finish_choice(&mut self, i: usize, reason: FinishReason, cause: FinishCause) -> Vec<Event> {
        let c = &mut self.choices[i];
        let mut out: Vec<Event> = c
            .reader
            .finish()
            .into_iter()
            .map(|delta| Event::Delta { choice: i, delta })
            .collect();
        let tool_calls = !c.reader.calls().is_empty() && reason == FinishReason::Stop;
        let finish = Finish {
            reason,
            cause,
            tool_calls,
        };
        c.finish = Some(finish.clone());
        out.push(Event::Finish { choice: i, finish });
        out
    }

    fn note_finish(&self) {
        if let Some(note) = &self.note {
            let u = self.usage();
            let reasons = (self.choices.iter())
                .map(|c| match &c.finish {
                    Some(f) if f.tool_calls => "tool_calls".to_string(),
                    Some(f) => f.reason.as_str().to_string(),
                    None => "unfinished".to_string(),
                })
                .collect();
            note.finish(&self.model, (u.prompt, u.completion, u.cached), reasons);
        }
    }

    /// Every event collected: the whole answer.
    pub(crate) async fn whole(mut self) -> Result<Whole, ApiError> {
        let mut choices: Vec<WholeChoice> = (0..self.choices.len())
            .map(|_| WholeChoice {
                text: String::new(),
                reasoning: String::new(),
                calls: Vec::new(),
                finish: Finish {
                    reason: FinishReason::Cancelled,
                    cause: FinishCause::Cancelled,
                    tool_calls: false,
                },
            })
            .collect();
        while let Some(events) = self.next().await {
            for event in events? {
                match event {
                    Event::Delta { choice, delta, .. } => {
                        let c = &mut choices[choice];
                        match delta {
                            Delta::Text(t) => c.text.push_str(&t),
                            Delta::Reasoning(t) => c.reasoning.push_str(&t),
                            Delta::CallStart { .. } | Delta::CallArguments { .. } => {}
                        }
                    }
                    Event::Finish { choice, finish } => {
                        choices[choice].calls = self.choices[choice].reader.calls().to_vec();
                        choices[choice].finish = finish;
                    }
                }
            }
        }
        Ok(Whole {
            choices,
            usage: self.usage(),
        })
    }
}

/// A whole answer.
#[derive(Debug)]
pub(crate) struct Whole {
    pub choices: Vec<WholeChoice>,
    pub usage: Usage,
}

/// A choice of a whole answer ([`Answer::whole`] returns one only when every choice finished).
#[derive(Debug)]
pub(crate) struct WholeChoice {
    pub text: String,
    pub reasoning: String,
    pub calls: Vec<Call>,
    pub finish: Finish,
}

#[cfg(test)]
mod tests {
    use rill_constrain::native_calls::NativeSyntax;

    use super::*;

    /// A tokenizer (the synthetic model's: byte tokens and ChatML controls). The reader reads
    /// the engine's text of each token; the token itself matters only for control tokens.
    fn tokenizer() -> Tokenizer {
        let model = rill_model::synthetic::SyntheticSpec::llama_tiny()
            .build()
            .unwrap();
        let file = rill_gguf::GgufFile::from_bytes(model.to_bytes().unwrap()).unwrap();
        Tokenizer::from_gguf(file.metadata()).unwrap()
    }

    /// The deltas of `text` pushed a character at a time, then the end.
    fn read(options: &ReadOptions, text: &str) -> (Vec<Delta>, AnswerReader) {
        let tok = tokenizer();
        let mut r = AnswerReader::new(options);
        let mut out = Vec::new();
        for c in text.chars() {
            out.extend(r.push(&tok, u32::from(b'a'), &c.to_string()));
        }
        out.extend(r.finish());
        (out, r)
    }

    fn options(tools: ToolFormat, names: &[&str]) -> ReadOptions {
        ReadOptions {
            reasoning: None,
            tools: Some(tools),
            call_limit: CallLimit::Many,
            tool_names: names.iter().map(|n| n.to_string()).collect(),
            param_types: ParamTypes::default(),
        }
    }

    fn text_of(deltas: &[Delta]) -> String {
        deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn qwen_xml_calls_come_whole_after_the_content() {
        let text = "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
        let (deltas, r) = read(
            &options(ToolFormat::Native(NativeSyntax::QwenXml), &["get_weather"]),
            text,
        );
        assert_eq!(text_of(&deltas), "Checking.");
        assert_eq!(r.calls().len(), 1);
        assert_eq!(r.calls()[0].name, "get_weather");
        assert_eq!(r.calls()[0].arguments, r#"{"city":"Paris"}"#);
        assert!(deltas
            .iter()
            .any(|d| matches!(d, Delta::CallArguments { fragment, .. } if fragment == r#"{"city":"Paris"}"#)));
    }

    /// The declared parameter types reach the reader: a postcode of digits stays a string, a
    /// day count is a number, both streamed and whole.
    #[test]
    fn qwen_xml_values_take_their_declared_types() {
        let text = "<tool_call>\n<function=get_weather>\n<parameter=zip>\n02139\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
        let schema = serde_json::json!({"type": "object", "properties": {
            "zip": {"type": "string"}, "days": {"type": "integer"}}});
        let mut o = options(ToolFormat::Native(NativeSyntax::QwenXml), &["get_weather"]);
        o.param_types = ParamTypes::from_schemas([("get_weather", &schema)]);
        let (deltas, r) = read(&o, text);
        let want = r#"{"zip":"02139","days":3}"#;
        assert_eq!(r.calls()[0].arguments, want);
        assert!(deltas
            .iter()
            .any(|d| matches!(d, Delta::CallArguments { fragment, .. } if fragment == want)));
    }

    #[test]
    fn a_fenced_json_answer_naming_a_tool_is_its_call() {
        let fenced =
            "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```";
        let (deltas, r) = read(&options(ToolFormat::Hermes, &["get_weather"]), fenced);
        assert_eq!(text_of(&deltas), "");
        assert_eq!(r.calls().len(), 1);
        assert_eq!(r.whole_text(""), "");
        // JSON that names no declared tool stays text.
        let other = "{\"name\": \"nothing\"}";
        let (deltas, r) = read(&options(ToolFormat::Hermes, &["get_weather"]), other);
        assert_eq!(text_of(&deltas), other);
        assert!(r.calls().is_empty());
    }

    #[test]
    fn harmony_calls_come_from_the_channels() {
        let options = ReadOptions {
            reasoning: Some((ReasoningSyntax::Harmony, "<|start|>assistant".into())),
            tools: Some(ToolFormat::Harmony),
            call_limit: CallLimit::Many,
            tool_names: vec!["get_weather".into()],
            param_types: ParamTypes::default(),
        };
        let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        let (deltas, r) = read(&options, text);
        let thinking: String = deltas
            .iter()
            .filter_map(|d| match d {
                Delta::Reasoning(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(thinking, "Need weather.");
        assert_eq!(text_of(&deltas), "");
        assert_eq!(r.calls().len(), 1);
        assert_eq!(r.calls()[0].arguments, "{\"city\":\"Paris\"}");
    }

    #[test]
    fn a_repeated_call_ends_the_list() {
        let text = r#"{"tool_calls": [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}, {"name": "f", "arguments": {"a": 1}}, {"name": "h", "arguments": {}}]}"#;
        let (_, r) = read(&options(ToolFormat::Generic, &[]), text);
        assert!(r.enough());
        let names: Vec<&str> = r.calls().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["f", "g"]);
        // One call allowed: the answer is enough after the first.
        let mut one = options(ToolFormat::Generic, &[]);
        one.call_limit = CallLimit::One;
        let (_, r) = read(&one, text);
        assert!(r.enough());
        assert_eq!(r.calls().len(), 1);
    }
}
