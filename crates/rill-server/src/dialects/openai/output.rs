//! A generation job's output: its choices' text, tokens, log-probabilities, tool calls and
//! usage, formatted as OpenAI's whole responses and stream chunks (and the `rill` extension's
//! explained tokens).

use std::sync::Arc;

use rill_engine::serve::{ServeEvent, ServeHandle, TokenDetail};
use rill_engine::{FinishCause, FinishReason, TokenLogprobs};
use rill_tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::error::{generation_failed, ApiError};
use crate::generation::answer::{AnswerReader, Delta, ReadOptions};
use crate::generation::prompt::token_repr;
use crate::generation::receipts::ReceiptDraft;
use crate::generation::request::{request_id, unix_time};
use crate::generation::submit::Job;
use crate::params::Endpoint;
use crate::state::State;

/// Usage summed over a job's requests.
#[derive(Default, Clone, Copy)]
pub(super) struct Usage {
    prompt: usize,
    completion: usize,
    cached: usize,
}

impl Usage {
    pub(super) fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": { "cached_tokens": self.cached },
        })
    }
}

/// One choice's state.
#[derive(Default)]
pub(super) struct Choice {
    text: String,
    tokens: usize,
    logprobs: Vec<TokenLogprobs>,
    finish: Option<(FinishReason, FinishCause)>,
    /// Characters of echoed prompt before the completion.
    echo_chars: usize,
    /// Characters of token text before the next token (completions' `text_offset`).
    offset: usize,
    /// The `rill` object of every token, when explaining a whole response.
    explained: Vec<Value>,
    /// With tools or a reasoning model: its answer read into text, thinking and calls.
    reader: Option<AnswerReader>,
    /// The thinking, apart from `text` (a whole response's).
    reasoning: String,
    /// Every generated token, for the receipt.
    generated: Vec<u32>,
}

/// Formats a job's output.
pub(super) struct Output {
    pub(super) endpoint: Endpoint,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) n: usize,
    pub(super) tokenizer: Arc<Tokenizer>,
    pub(super) choices: Vec<Choice>,
    pub(super) usage: Usage,
    /// Whether a `Usage` event came (else usage is counted here).
    pub(super) usage_seen: bool,
    pub(super) prompt_tokens: usize,
    pub(super) logprobs_asked: bool,
    pub(super) include_usage: bool,
    pub(super) explain: bool,
    pub(super) kv_block_size: usize,
    /// The answer has thinking to return apart (`reasoning_content` and `reasoning`).
    pub(super) reasoning_fields: bool,
    /// Chunks made by the last event beyond the one it returned (a token can begin a call and
    /// carry arguments).
    pub(super) extra: Vec<Value>,
    /// The response's reproducibility receipt, while it is recorded.
    pub(super) receipt: Option<ReceiptDraft>,
    /// What the request's log line says of the generation.
    pub(super) note: Option<crate::request_log::GenerationNote>,
}

const FINGERPRINT: &str = concat!("rill-", env!("CARGO_PKG_VERSION"));

impl Output {
    pub(super) fn new(handle: &ServeHandle, job: &Job, read: &ReadOptions) -> Output {
        let reading = read.tools.is_some() || read.reasoning.is_some();
        let mut choices: Vec<Choice> = (0..job.choices())
            .map(|_| Choice {
                reader: reading.then(|| AnswerReader::new(read)),
                ..Choice::default()
            })
            .collect();
        if let Some(texts) = &job.echo {
            for (i, c) in choices.iter_mut().enumerate() {
                c.text = texts[i / job.common.n].clone();
                c.echo_chars = c.text.chars().count();
                c.offset = c.echo_chars;
            }
        }
        Output {
            endpoint: job.endpoint,
            id: request_id(match job.endpoint {
                Endpoint::Chat => "chatcmpl",
                Endpoint::Completions => "cmpl",
            }),
            created: unix_time(),
            model: job.model.clone(),
            n: job.common.n,
            tokenizer: handle.tokenizer(),
            choices,
            usage: Usage::default(),
            usage_seen: false,
            prompt_tokens: job.prompts.iter().map(Vec::len).sum(),
            logprobs_asked: job.common.top_logprobs.is_some(),
            include_usage: job.common.include_usage,
            explain: job.common.explain,
            kv_block_size: handle.model_summary().kv_block_size,
            reasoning_fields: read.reasoning.is_some(),
            extra: Vec::new(),
            receipt: None,
            note: None,
        }
    }

    /// Tells the request's log line the generation's usage and finish reasons.
    pub(super) fn note_finish(&self) {
        if let Some(note) = &self.note {
            let u = self.usage();
            let reasons = (self.choices.iter())
                .map(|c| {
                    c.finish
                        .as_ref()
                        .map_or("unfinished".into(), |f| f.0.as_str().to_string())
                })
                .collect();
            note.finish(&self.model, (u.prompt, u.completion, u.cached), reasons);
        }
    }

    /// Records the receipt of a response delivered whole.
    pub(super) fn store_receipt(&mut self, state: &State) {
        if let Some(draft) = self.receipt.take() {
            let choices = self
                .choices
                .iter_mut()
                .map(|c| {
                    let finish = c
                        .finish
                        .as_ref()
                        .map_or(String::new(), |(reason, _)| reason.as_str().to_string());
                    (std::mem::take(&mut c.generated), finish)
                })
                .collect();
            state.store_receipt(draft, &self.tokenizer, choices);
        }
    }

    /// The global index of `choice` of prompt `prompt`, if it is one of the job's.
    fn index(&self, prompt: usize, choice: usize) -> Option<usize> {
        (choice < self.n)
            .then(|| prompt * self.n + choice)
            .filter(|&i| i < self.choices.len())
    }

    pub(super) fn unfinished(&self) -> bool {
        self.choices.iter().any(|c| c.finish.is_none())
    }

    /// A token's text as OpenAI shows it, and its bytes.
    fn token_repr(&self, id: u32) -> (String, Vec<u8>) {
        token_repr(&self.tokenizer, id)
    }

    /// Candidates as the `rill` object lists them: id, text and log-probability.
    fn candidates(&self, top: &[(u32, f32)]) -> Vec<Value> {
        top.iter()
            .map(|&(id, lp)| {
                json!({ "token": id, "text": self.token_repr(id).0, "logprob": finite(lp) })
            })
            .collect()
    }

    /// The `rill` object of one token (docs/glass-box-api.md).
    fn explained(&self, token: u32, lp: Option<&TokenLogprobs>, d: &TokenDetail) -> Value {
        let mut v = json!({
            "token": token,
            "token_text": self.token_repr(token).0,
            "index": d.index,
            "position": d.position,
            "rule": d.rule.as_str(),
            "probability": d.probability,
            "elapsed_s": d.elapsed_s,
            "step": {
                "id": d.step.id,
                "seconds": d.step.seconds,
                "rows": d.step.rows,
                "sequences": d.step.sequences,
                "requests": d.step.requests,
                "prefill_rows": d.step.prefill_rows,
                "decode_rows": d.step.decode_rows,
            },
            "kv": {
                "blocks": d.kv_blocks,
                "bytes": d.kv_bytes,
                "bytes_without_window": d.kv_bytes_without_window,
                "block_size": self.kv_block_size,
                "positions": d.position + 1,
            },
            "cost": {
                "flops": d.cost.flops,
                "weight_bytes": d.cost.weight_bytes,
                "kv_bytes": d.cost.kv_bytes,
            },
        });
        if let Some(lp) = lp {
            v["logprob"] = json!(finite(lp.logprob));
            v["raw_logprob"] = json!(finite(lp.raw_logprob));
            v["entropy"] = json!(finite(lp.entropy));
            v["raw_entropy"] = json!(finite(lp.raw_entropy));
            v["top"] = json!(self.candidates(&lp.raw_top));
            v["processed_top"] = json!(self.candidates(&lp.top));
        }
        if let Some(c) = &d.constraint {
            v["constraint"] = self.constraint_json(c, lp);
        }
        if let Some(draw) = d.draw {
            v["draw"] = json!({ "uniform": draw.uniform, "from": draw.from, "to": draw.to });
        }
        if let Some(p) = &d.prompt {
            v["prompt"] = json!({
                "tokens": p.tokens,
                "cached_tokens": p.cached_tokens,
                "computed_tokens": p.computed_tokens,
                "prefill_seconds": p.prefill_seconds,
                "prefill_steps": p.prefill_steps,
                "queue_seconds": p.queue_seconds,
            });
        }
        v
    }

    /// The constraint's stage of a step: what it allowed, the model's top candidates it cut,
    /// and the mask (ids when few are allowed or few blocked, else the bits in base64).
    fn constraint_json(
        &self,
        c: &rill_engine::ConstraintStep,
        lp: Option<&TokenLogprobs>,
    ) -> Value {
        let vocab = self.tokenizer.vocab_size();
        let allows = |words: &[u32], t: u32| {
            words
                .get(t as usize / 32)
                .is_some_and(|w| w >> (t % 32) & 1 == 1)
        };
        let mut v = json!({
            "kind": c.kind,
            "allowed": c.allowed,
            "forced": c.allowed == 1,
        });
        let words = &c.mask;
        if let Some(lp) = lp {
            let cut: Vec<u32> = lp
                .raw_top
                .iter()
                .map(|&(t, _)| t)
                .filter(|&t| !allows(words, t))
                .collect();
            v["cut"] = json!(cut);
        }
        const LIST: usize = 2048;
        if c.allowed <= LIST {
            let ids: Vec<u32> = (0..vocab as u32).filter(|&t| allows(words, t)).collect();
            // A few allowed tokens are named, so the viewer can show them.
            if ids.len() <= 64 {
                v["allowed_tokens"] = ids
                    .iter()
                    .map(|&t| json!({ "token": t, "text": self.token_repr(t).0 }))
                    .collect();
            }
            v["allowed_ids"] = json!(ids);
        } else if vocab - c.allowed <= LIST {
            let ids: Vec<u32> = (0..vocab as u32).filter(|&t| !allows(words, t)).collect();
            v["blocked_ids"] = json!(ids);
        } else {
            use base64::Engine as _;
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            v["mask"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
        v
    }

    fn alternatives(&self, top: &[(u32, f32)]) -> Vec<Value> {
        top.iter()
            .map(|&(id, lp)| {
                let (token, bytes) = self.token_repr(id);
                json!({ "token": token, "logprob": finite(lp), "bytes": bytes })
            })
            .collect()
    }

    /// Chat's `logprobs.content` entry: OpenAI's fields carry the raw log-probabilities, the
    /// `processed_*` ones what the sampler chain drew from.
    fn chat_logprob(&self, lp: &TokenLogprobs) -> Value {
        let (token, bytes) = self.token_repr(lp.token);
        json!({
            "token": token,
            "logprob": finite(lp.raw_logprob),
            "bytes": bytes,
            "top_logprobs": self.alternatives(&lp.raw_top),
            "processed_logprob": finite(lp.logprob),
            "processed_top_logprobs": self.alternatives(&lp.top),
            "raw_entropy": finite(lp.raw_entropy),
            "processed_entropy": finite(lp.entropy),
        })
    }

    /// Completions' `logprobs` object for consecutive tokens starting at text offset `offset`.
    fn completion_logprobs(&self, lps: &[TokenLogprobs], mut offset: usize) -> Value {
        let mut tokens = Vec::with_capacity(lps.len());
        let mut token_logprobs = Vec::with_capacity(lps.len());
        let mut top = Vec::with_capacity(lps.len());
        let mut offsets = Vec::with_capacity(lps.len());
        let mut processed = Vec::with_capacity(lps.len());
        let mut processed_top = Vec::with_capacity(lps.len());
        let mut raw_entropies = Vec::with_capacity(lps.len());
        let mut entropies = Vec::with_capacity(lps.len());
        let dict = |alts: &[(u32, f32)]| {
            let mut m = serde_json::Map::new();
            for &(id, lp) in alts {
                m.entry(self.token_repr(id).0).or_insert(json!(finite(lp)));
            }
            Value::Object(m)
        };
        for lp in lps {
            let (token, _) = self.token_repr(lp.token);
            offsets.push(offset);
            offset += token.chars().count();
            tokens.push(token);
            token_logprobs.push(finite(lp.raw_logprob));
            top.push(dict(&lp.raw_top));
            processed.push(finite(lp.logprob));
            processed_top.push(dict(&lp.top));
            raw_entropies.push(finite(lp.raw_entropy));
            entropies.push(finite(lp.entropy));
        }
        json!({
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
            "processed_token_logprobs": processed,
            "processed_top_logprobs": processed_top,
            "raw_entropies": raw_entropies,
            "processed_entropies": entropies,
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    /// A whole (non-streamed) response.
    pub(super) fn response(&self) -> Value {
        let choices: Vec<Value> = self
            .choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (reason, cause) = c
                    .finish
                    .as_ref()
                    .map_or((Value::Null, Value::Null), |(r, c)| {
                        (json!(r.as_str()), stop_reason(c))
                    });
                let mut choice = match self.endpoint {
                    Endpoint::Chat => json!({
                        "index": i,
                        "message": self.message(c),
                        "logprobs": if c.logprobs.is_empty() && !self.wants_logprobs() {
                            Value::Null
                        } else {
                            json!({
                                "content": c.logprobs.iter().map(|l| self.chat_logprob(l))
                                    .collect::<Vec<_>>(),
                                "refusal": null,
                            })
                        },
                        "finish_reason": reason,
                        "stop_reason": cause,
                    }),
                    Endpoint::Completions => json!({
                        "index": i,
                        "text": c.text,
                        "logprobs": if self.wants_logprobs() {
                            self.completion_logprobs(&c.logprobs, c.echo_chars)
                        } else {
                            Value::Null
                        },
                        "finish_reason": reason,
                        "stop_reason": cause,
                    }),
                };
                if self.explain {
                    choice["rill"] = json!({ "tokens": c.explained });
                }
                if self.made_calls(c) {
                    choice["finish_reason"] = json!("tool_calls");
                }
                choice
            })
            .collect();
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
            "usage": self.usage().json(),
        })
    }

    /// A whole response's message: its text (and thinking), or with tools its content and
    /// calls.
    fn message(&self, c: &Choice) -> Value {
        let Some(reader) = &c.reader else {
            return json!({ "role": "assistant", "content": c.text, "refusal": null });
        };
        let calls = reader.calls();
        let text = reader.whole_text(&c.text);
        let mut m = json!({
            "role": "assistant",
            "content": if text.is_empty() && !calls.is_empty() {
                Value::Null
            } else {
                json!(text)
            },
            "refusal": null,
        });
        if self.reasoning_fields {
            let r = match c.reasoning.is_empty() {
                true => Value::Null,
                false => json!(c.reasoning),
            };
            m["reasoning_content"] = r.clone();
            m["reasoning"] = r;
        }
        if !calls.is_empty() {
            m["tool_calls"] = calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    })
                })
                .collect();
        }
        m
    }

    /// Whether a choice that stopped by itself called tools (its finish reason is then
    /// `tool_calls`).
    fn made_calls(&self, c: &Choice) -> bool {
        matches!(c.finish, Some((FinishReason::Stop, _)))
            && c.reader.as_ref().is_some_and(|r| !r.calls().is_empty())
    }

    /// The streamed chunks of a read answer's deltas; the first carries the token's
    /// log-probabilities and explanation (one chunk with an empty delta carries them when the
    /// token made no delta). Chunks beyond the first go to `extra`.
    fn delta_chunks(
        &mut self,
        i: usize,
        deltas: Vec<Delta>,
        mut logprobs: Value,
        mut explained: Option<Value>,
    ) -> Option<Value> {
        let mut chunks = Vec::new();
        let carry = !logprobs.is_null() || explained.is_some();
        if deltas.is_empty() && !carry {
            return None;
        }
        let mut deltas: Vec<Value> = deltas
            .into_iter()
            .map(|d| match d {
                Delta::Text(t) => json!({ "content": t }),
                Delta::Reasoning(t) => json!({ "reasoning_content": t, "reasoning": t }),
                Delta::CallStart { index, id, name } => json!({ "tool_calls": [{
                    "index": index, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]}),
                Delta::CallArguments { index, fragment } => {
                    json!({ "tool_calls": [{ "index": index, "function": {"arguments": fragment} }] })
                }
            })
            .collect();
        if deltas.is_empty() {
            deltas.push(json!({}));
        }
        for delta in deltas {
            let mut choice = self.chunk_choice(i, None, std::mem::take(&mut logprobs), None);
            choice["delta"] = delta;
            if let Some(x) = explained.take() {
                choice["rill"] = x;
            }
            chunks.push(self.chunk(vec![choice]));
        }
        let first = chunks.remove(0);
        self.extra.extend(chunks);
        Some(first)
    }

    /// A single-choice answer that made the calls it may: the loop ends its request (the rest
    /// would be unwanted calls).
    pub(super) fn enough_calls(&self) -> bool {
        matches!(self.choices.as_slice(), [c] if c.finish.is_none()
            && c.reader.as_ref().is_some_and(AnswerReader::enough))
    }

    fn wants_logprobs(&self) -> bool {
        self.logprobs_asked
    }

    pub(super) fn usage(&self) -> Usage {
        if self.usage_seen {
            self.usage
        } else {
            Usage {
                prompt: self.prompt_tokens,
                completion: self.choices.iter().map(|c| c.tokens).sum(),
                cached: 0,
            }
        }
    }

    /// A streamed chunk holding `choices`.
    pub(super) fn chunk(&self, choices: Vec<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The streamed choice: chat's `delta`, completions' `text`.
    fn chunk_choice(
        &self,
        index: usize,
        text: Option<&str>,
        logprobs: Value,
        finish: Option<&(FinishReason, FinishCause)>,
    ) -> Value {
        let (reason, cause) = finish.map_or((Value::Null, Value::Null), |(r, c)| {
            (json!(r.as_str()), stop_reason(c))
        });
        match self.endpoint {
            Endpoint::Chat => json!({
                "index": index,
                "delta": match text {
                    Some(t) => json!({ "content": t }),
                    None => json!({}),
                },
                "logprobs": logprobs,
                "finish_reason": reason,
                "stop_reason": cause,
            }),
            Endpoint::Completions => json!({
                "index": index,
                "text": text.unwrap_or(""),
                "logprobs": logprobs,
                "finish_reason": reason,
                "stop_reason": cause,
            }),
        }
    }

    /// The chunks a stream starts with: chat's role for every choice, completions' echoed
    /// prompts.
    pub(super) fn opening_chunks(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for (i, c) in self.choices.iter().enumerate() {
            match self.endpoint {
                Endpoint::Chat => {
                    let mut choice = self.chunk_choice(i, None, Value::Null, None);
                    choice["delta"] = json!({ "role": "assistant", "content": "" });
                    out.push(self.chunk(vec![choice]));
                }
                Endpoint::Completions if !c.text.is_empty() => {
                    out.push(self.chunk(vec![self.chunk_choice(
                        i,
                        Some(&c.text),
                        Value::Null,
                        None,
                    )]));
                }
                Endpoint::Completions => {}
            }
        }
        out
    }

    /// Takes one event in; when streaming, returns the chunk it makes (if any).
    pub(super) fn on_event(
        &mut self,
        prompt: usize,
        event: ServeEvent,
        streaming: bool,
    ) -> Result<Option<Value>, ApiError> {
        match event {
            ServeEvent::Token {
                choice,
                token,
                text,
                logprobs,
                detail,
            } => {
                let Some(i) = self.index(prompt, choice) else {
                    return Ok(None);
                };
                if let Some(note) = &self.note {
                    note.first_token();
                }
                self.choices[i].tokens += 1;
                if self.receipt.is_some() {
                    self.choices[i].generated.push(token);
                }
                let mut explained = match (&detail, self.explain) {
                    (Some(d), true) => Some(self.explained(token, logprobs.as_ref(), d)),
                    _ => None,
                };
                // Explaining computes log-probabilities; OpenAI's fields only when asked.
                let logprobs = logprobs.filter(|_| self.logprobs_asked);
                if let Some(reader) = self.choices[i].reader.as_mut() {
                    let thinking_before = reader.thinking();
                    let deltas = reader.push(&self.tokenizer, token, &text);
                    // The glass box tells a reasoning model's thinking from its answer.
                    if let (Some(x), true) = (explained.as_mut(), self.reasoning_fields) {
                        let thinking = thinking_before || reader.thinking();
                        x["part"] = json!(if thinking { "reasoning" } else { "answer" });
                    }
                    if !streaming {
                        let c = &mut self.choices[i];
                        for d in deltas {
                            match d {
                                Delta::Text(t) => c.text.push_str(&t),
                                Delta::Reasoning(t) => c.reasoning.push_str(&t),
                                _ => {}
                            }
                        }
                        c.logprobs.extend(logprobs);
                        c.explained.extend(explained);
                        return Ok(None);
                    }
                    let lp = match &logprobs {
                        Some(lp) => json!({ "content": [self.chat_logprob(lp)], "refusal": null }),
                        None => Value::Null,
                    };
                    return Ok(self.delta_chunks(i, deltas, lp, explained));
                }
                if !streaming {
                    let c = &mut self.choices[i];
                    c.text.push_str(&text);
                    c.logprobs.extend(logprobs);
                    c.explained.extend(explained);
                    return Ok(None);
                }
                if text.is_empty() && logprobs.is_none() && explained.is_none() {
                    return Ok(None);
                }
                let lp = match (&logprobs, self.endpoint) {
                    (None, _) => Value::Null,
                    (Some(lp), Endpoint::Chat) => {
                        json!({ "content": [self.chat_logprob(lp)], "refusal": null })
                    }
                    (Some(lp), Endpoint::Completions) => {
                        let offset = self.choices[i].offset;
                        self.choices[i].offset += self.token_repr(lp.token).0.chars().count();
                        self.completion_logprobs(std::slice::from_ref(lp), offset)
                    }
                };
                let mut choice = self.chunk_choice(i, Some(&text), lp, None);
                if let Some(x) = explained {
                    choice["rill"] = x;
                }
                Ok(Some(self.chunk(vec![choice])))
            }
            ServeEvent::Done {
                choice,
                finish_reason,
                cause,
            } => {
                let Some(i) = self.index(prompt, choice) else {
                    return Ok(None);
                };
                let held = match self.choices[i].reader.as_mut() {
                    Some(reader) => reader.finish(),
                    None => Vec::new(),
                };
                self.choices[i].finish = Some((finish_reason, cause));
                if !streaming {
                    let c = &mut self.choices[i];
                    for d in held {
                        match d {
                            Delta::Text(t) => c.text.push_str(&t),
                            Delta::Reasoning(t) => c.reasoning.push_str(&t),
                            _ => {}
                        }
                    }
                    return Ok(None);
                }
                let first = self.delta_chunks(i, held, Value::Null, None);
                let mut choice =
                    self.chunk_choice(i, None, Value::Null, self.choices[i].finish.as_ref());
                if self.made_calls(&self.choices[i]) {
                    choice["finish_reason"] = json!("tool_calls");
                }
                let last = self.chunk(vec![choice]);
                match first {
                    Some(first) => {
                        self.extra.push(last);
                        Ok(Some(first))
                    }
                    None => Ok(Some(last)),
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
                Ok(None)
            }
            ServeEvent::Error { message } => Err(generation_failed(message)),
        }
    }
}

/// A log-probability JSON can hold (`-inf` becomes -9999, as OpenAI reports it).
fn finite(x: f32) -> f64 {
    if x.is_finite() {
        f64::from(x)
    } else if x > 0.0 {
        f64::from(f32::MAX)
    } else {
        -9999.0
    }
}

/// vLLM's `stop_reason`: the stop string or the token that ended the choice.
fn stop_reason(cause: &FinishCause) -> Value {
    match cause {
        FinishCause::StopString(s) => json!(s),
        FinishCause::StopToken(t) | FinishCause::EndOfGeneration(t) => json!(t),
        _ => Value::Null,
    }
}
