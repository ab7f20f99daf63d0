//! `/v1/chat/completions` and `/v1/completions`: requests validated into engine requests,
//! answered whole or streamed as server-sent events in OpenAI's chunk format.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State as Extract;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::stream::{BoxStream, SelectAll};
use futures::StreamExt;
use rill_engine::serve::{
    ResponseStream, ServeEvent, ServeHandle, ServeRequest, SubmitError, TokenDetail, Trace,
};
use rill_engine::{FinishCause, FinishReason, GenerateParams, TokenLogprobs};
use rill_tokenizer::{ChatMessage, Tokenizer, TokenizerError};
use serde_json::{json, Value};

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::params::{parse_common, token_list, Common, Endpoint, MAX_N};
use crate::receipts::ReceiptDraft;
use crate::routes::{blocking, open_request};
use crate::State;

type AppState = Arc<State>;

/// Default `max_tokens` of `/v1/completions` (OpenAI's).
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

pub(crate) fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn request_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", crate::params::random_seed())
}

/// What a validated request asks for.
struct Job {
    endpoint: Endpoint,
    /// Token ids of each prompt (one for chat; completions may batch several).
    prompts: Vec<Vec<u32>>,
    /// With `echo`: each prompt's text, put before its completions.
    echo: Option<Vec<String>>,
    common: Common,
    model: String,
    context: usize,
    /// The format tool calls are read in, when the model may call tools.
    tools: Option<rill_constrain::tools::ToolFormat>,
}

impl Job {
    fn choices(&self) -> usize {
        self.prompts.len() * self.common.n
    }
}

// ----- chat -----

pub(crate) async fn chat(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let messages = parse_messages(&f)?;
    let agp = f.bool("add_generation_prompt")?.unwrap_or(true);
    let mut common = parse_common(&f, Endpoint::Chat, info.vocab_size)?;
    let tools = crate::tools::parse(&f)?;
    let tokenizer = handle.tokenizer();
    let (format, open_is_token) = crate::tools::format_of(&tokenizer);
    let mut tool_format = None;
    let (messages, template_tools) = match &tools {
        Some(t) => {
            // The generic format answers in JSON even without calls (`tool_choice: none`).
            if t.active() || format == rill_constrain::tools::ToolFormat::Generic {
                if let Some((_, field)) = crate::structured::parse(&f)? {
                    return Err(ApiError::param(
                        field.clone(),
                        format!("'{field}' together with 'tools' is not supported: the answer is either a tool call or text"),
                    ));
                }
                let plan = crate::tools::request_plan(t, format, open_is_token);
                if let Some(spec) = plan.constraint {
                    let mut grammar =
                        crate::structured::compile(&state, tokenizer.clone(), spec, "tools".into())
                            .await?;
                    if let Some(trigger) = &plan.trigger {
                        grammar = grammar.after(trigger);
                    }
                    common.params.constraint = Some(grammar);
                }
                tool_format = Some(format);
            }
            crate::tools::prompt_messages(messages, t, format)
        }
        None => {
            constrain(&state, &handle, &f, &mut common).await?;
            (messages, None)
        }
    };
    let prompt = blocking(move || {
        chat_tokens_with_tools(&tokenizer, &messages, template_tools.as_ref(), agp, true)
    })
    .await?;
    let job = Job {
        endpoint: Endpoint::Chat,
        prompts: vec![prompt],
        echo: None,
        common,
        model: info.name,
        context: info.context,
        tools: tool_format,
    };
    run(state, handle, job).await
}

/// Compiles the request's structured-output constraint, if it asks for one, into its
/// parameters.
async fn constrain(
    state: &AppState,
    handle: &ServeHandle,
    f: &Fields<'_>,
    common: &mut Common,
) -> Result<(), ApiError> {
    let prefix = match f.get("constraint_prefix") {
        None | Some(Value::Null) => None,
        Some(v) => Some(token_list(
            "constraint_prefix",
            v,
            handle.model_info().vocab_size,
            handle.model_info().context,
        )?),
    };
    match crate::structured::parse(f)? {
        Some((spec, field)) => {
            let mut grammar =
                crate::structured::compile(state, handle.tokenizer(), spec, field).await?;
            // rill's extension: a branch continues a constrained text after these tokens.
            if let Some(prefix) = prefix {
                grammar = grammar.advanced(&prefix).map_err(|e| {
                    ApiError::param(
                        "constraint_prefix",
                        format!("'constraint_prefix' does not follow the constraint: {e}"),
                    )
                })?;
            }
            common.params.constraint = Some(grammar);
        }
        None if prefix.is_some() => {
            return Err(ApiError::param(
                "constraint_prefix",
                "'constraint_prefix' needs a constraint (response_format, structured_outputs, ...)",
            ))
        }
        None => {}
    }
    Ok(())
}

/// `messages`: a non-empty array of `{role, content}`; content is a string, an array of text
/// parts, or null (for an assistant message).
pub(crate) fn parse_messages(f: &Fields<'_>) -> Result<Vec<ChatMessage>, ApiError> {
    let v = f
        .get("messages")
        .ok_or_else(|| ApiError::missing("messages"))?;
    let Value::Array(list) = v else {
        return Err(ApiError::wrong_type("messages", "an array of messages", v));
    };
    if list.is_empty() {
        return Err(ApiError::param(
            "messages",
            "'messages' must hold at least one message",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let name = format!("messages[{i}]");
        let Value::Object(map) = m else {
            return Err(ApiError::wrong_type(&name, "an object", m));
        };
        let mf = Fields::nested(map, format!("{name}."));
        let role = mf
            .str("role")?
            .ok_or_else(|| ApiError::missing(&mf.name("role")))?;
        let role = match role {
            "system" | "user" | "assistant" | "tool" => role,
            // OpenAI's newer name for system messages; templates know "system".
            "developer" => "system",
            other => {
                return Err(ApiError::param(
                    mf.name("role"),
                    format!(
                    "'{}' must be one of system, developer, user, assistant, tool; got {other:?}",
                    mf.name("role")
                ),
                ))
            }
        };
        let content = match mf.get("content") {
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None => return Err(ApiError::missing(&mf.name("content"))),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => text_parts(&mf.name("content"), parts)?,
            Some(v) => {
                return Err(ApiError::wrong_type(
                    &mf.name("content"),
                    "a string or an array of text parts",
                    v,
                ))
            }
        };
        mf.str("name")?;
        let mut message = ChatMessage::new(role, content);
        if role == "assistant" {
            if let Some(v) = mf.get("tool_calls") {
                message.tool_calls = crate::tools::history_calls(&mf.name("tool_calls"), v)?;
            }
        }
        if role == "tool" {
            message.tool_call_id = mf.str("tool_call_id")?.map(str::to_string);
        }
        out.push(message);
    }
    Ok(out)
}

/// The text of content parts `[{"type": "text", "text": ...}]`, joined by newlines.
fn text_parts(name: &str, parts: &[Value]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let pname = format!("{name}[{j}]");
        let Value::Object(map) = p else {
            return Err(ApiError::wrong_type(&pname, "a content part object", p));
        };
        let pf = Fields::nested(map, format!("{pname}."));
        match pf.str("type")? {
            Some("text") => texts.push(
                pf.str("text")?
                    .ok_or_else(|| ApiError::missing(&pf.name("text")))?,
            ),
            // An assistant's refusal is text too.
            Some("refusal") => texts.push(
                pf.str("refusal")?
                    .ok_or_else(|| ApiError::missing(&pf.name("refusal")))?,
            ),
            Some(other) => {
                return Err(ApiError::param(
                    pf.name("type"),
                    format!(
                    "content parts of type {other:?} are not supported: this model takes text only"
                ),
                ))
            }
            None => return Err(ApiError::missing(&pf.name("type"))),
        }
    }
    Ok(texts.join("\n"))
}

/// The chat template applied to `messages`, tokenized with control tokens parsed (BOS added,
/// when the model wants one and `add_special` is set, only if the template did not render it).
pub(crate) fn chat_tokens(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    add_special: bool,
) -> Result<Vec<u32>, ApiError> {
    chat_tokens_with_tools(
        tokenizer,
        messages,
        None,
        add_generation_prompt,
        add_special,
    )
}

/// [`chat_tokens`] with the template given `tools`.
pub(crate) fn chat_tokens_with_tools(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    tools: Option<&Value>,
    add_generation_prompt: bool,
    add_special: bool,
) -> Result<Vec<u32>, ApiError> {
    let text = tokenizer
        .apply_chat_template_with_tools(messages, tools, add_generation_prompt)
        .map_err(|e| match e {
            TokenizerError::NoChatTemplate => ApiError::param(
                "messages",
                "this model has no chat template: use /v1/completions with a raw prompt",
            ),
            e => ApiError::param("messages", format!("cannot apply the chat template: {e}")),
        })?;
    Ok(tokenizer.encode_with_special(&text, add_special, true))
}

// ----- completions -----

pub(crate) async fn completions(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let prompts = parse_prompts(&f, info.vocab_size)?;
    let mut common = parse_common(&f, Endpoint::Completions, info.vocab_size)?;
    constrain(&state, &handle, &f, &mut common).await?;
    if prompts.len() * common.n > MAX_N as usize {
        return Err(ApiError::param(
            "n",
            format!(
                "{} prompts with n = {} ask for {} choices; at most {MAX_N} per request",
                prompts.len(),
                common.n,
                prompts.len() * common.n
            ),
        ));
    }
    let echo = f.bool("echo")?.unwrap_or(false);
    if echo && common.top_logprobs.is_some() {
        return Err(ApiError::param(
            "echo",
            "'echo' together with 'logprobs' is not supported (prompt log-probabilities are not \
             computed)",
        ));
    }
    if let Some(s) = f.str("suffix")? {
        if !s.is_empty() {
            return Err(ApiError::param("suffix", "'suffix' is not supported"));
        }
    }
    if let Some(b) = f.int("best_of", 1, MAX_N)? {
        if b as usize != common.n {
            return Err(ApiError::param(
                "best_of",
                format!(
                    "'best_of' must equal 'n' ({}): choosing the best of several is not supported",
                    common.n
                ),
            ));
        }
    }
    let tokenizer = handle.tokenizer();
    let (prompts, texts) = blocking(move || Ok(tokenize_prompts(&tokenizer, prompts))).await?;
    let echo = echo.then_some(texts);
    let job = Job {
        endpoint: Endpoint::Completions,
        prompts,
        echo,
        common,
        model: info.name,
        context: info.context,
        tools: None,
    };
    run(state, handle, job).await
}

pub(crate) enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// Every prompt's token ids (text with the model's special tokens parsed and BOS added), and
/// its text (token ids decoded).
pub(crate) fn tokenize_prompts(
    tokenizer: &Tokenizer,
    prompts: Vec<Prompt>,
) -> (Vec<Vec<u32>>, Vec<String>) {
    prompts
        .into_iter()
        .map(|p| match p {
            Prompt::Text(t) => (tokenizer.encode_with_special(&t, true, true), t),
            Prompt::Tokens(t) => {
                let text = tokenizer.decode(&t);
                (t, text)
            }
        })
        .unzip()
}

/// `prompt`: a string, an array of strings, an array of token ids, or an array of arrays of
/// token ids.
pub(crate) fn parse_prompts(f: &Fields<'_>, vocab_size: usize) -> Result<Vec<Prompt>, ApiError> {
    let v = f.get("prompt").ok_or_else(|| ApiError::missing("prompt"))?;
    let expected = "a string, an array of strings, an array of token ids or an array of arrays \
                    of token ids";
    match v {
        Value::String(s) => Ok(vec![Prompt::Text(s.clone())]),
        Value::Array(a) if a.is_empty() => Err(ApiError::param(
            "prompt",
            "'prompt' must not be an empty array",
        )),
        Value::Array(a) => {
            // A list of prompts (not of token ids) is bounded like the choices.
            if a.len() > MAX_N as usize && !a[0].is_number() {
                return Err(ApiError::param(
                    "prompt",
                    format!("'prompt' may hold at most {MAX_N} prompts, got {}", a.len()),
                ));
            }
            match &a[0] {
                Value::String(_) => a
                    .iter()
                    .enumerate()
                    .map(|(i, s)| match s {
                        Value::String(s) => Ok(Prompt::Text(s.clone())),
                        other => Err(ApiError::wrong_type(
                            &format!("prompt[{i}]"),
                            "a string (like prompt[0])",
                            other,
                        )
                        .with_param("prompt")),
                    })
                    .collect(),
                Value::Number(_) => Ok(vec![Prompt::Tokens(token_list(
                    "prompt",
                    v,
                    vocab_size,
                    usize::MAX,
                )?)]),
                Value::Array(_) => a
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        token_list(&format!("prompt[{i}]"), p, vocab_size, usize::MAX)
                            .map(Prompt::Tokens)
                            .map_err(|e| e.with_param("prompt"))
                    })
                    .collect(),
                other => {
                    Err(ApiError::wrong_type("prompt[0]", expected, other).with_param("prompt"))
                }
            }
        }
        other => Err(ApiError::wrong_type("prompt", expected, other)),
    }
}

// ----- submitting -----

/// The request's `max_tokens`, else the endpoint's default for a prompt of `prompt_len`.
pub(crate) fn max_tokens_for(
    endpoint: Endpoint,
    given: Option<usize>,
    context: usize,
    prompt_len: usize,
) -> usize {
    match (given, endpoint) {
        (Some(m), _) => m,
        // OpenAI's chat default: whatever the context leaves.
        (None, Endpoint::Chat) => context.saturating_sub(prompt_len).max(1),
        (None, Endpoint::Completions) => COMPLETIONS_DEFAULT_MAX_TOKENS,
    }
}

fn prompt_param(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completions => "prompt",
    }
}

fn too_long(endpoint: Endpoint, prompt: usize, max_tokens: usize, context: usize) -> ApiError {
    ApiError::invalid(format!(
        "This model's maximum context length is {context} tokens, but {} tokens were requested: \
         {prompt} in the {} and {max_tokens} for the completion (max_tokens). Shorten the {} or \
         lower max_tokens.",
        prompt.saturating_add(max_tokens),
        prompt_param(endpoint),
        prompt_param(endpoint),
    ))
    .with_param(prompt_param(endpoint))
    .with_code("context_length_exceeded")
}

pub(crate) fn submit_error(endpoint: Endpoint, e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull { retry_after_s } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "The server's request queue is full: retry later",
        )
        .with_code("rate_limit_exceeded")
        .with_retry_after(retry_after_s.max(1)),
        SubmitError::Invalid { param, message } => ApiError::param(param, message),
        SubmitError::PromptTooLong {
            prompt_tokens,
            max_tokens,
            context,
        } => too_long(endpoint, prompt_tokens, max_tokens, context),
        SubmitError::ShuttingDown => {
            ApiError::unavailable("the server is shutting down", "shutting_down")
        }
    }
}

/// One engine request per prompt; an error drops (cancels) those already submitted.
/// Also returns the parameters the last prompt was submitted with (`max_tokens` resolved).
fn submit(
    handle: &ServeHandle,
    job: &Job,
) -> Result<(Vec<ResponseStream>, GenerateParams), ApiError> {
    let mut streams = Vec::with_capacity(job.prompts.len());
    let mut submitted = job.common.params.clone();
    for prompt in &job.prompts {
        if prompt.is_empty() {
            return Err(ApiError::param(
                prompt_param(job.endpoint),
                format!(
                    "'{}' must not be empty: the model needs at least one token",
                    prompt_param(job.endpoint)
                ),
            ));
        }
        let max_tokens = max_tokens_for(
            job.endpoint,
            job.common.max_tokens,
            job.context,
            prompt.len(),
        );
        if prompt.len().saturating_add(max_tokens) > job.context {
            return Err(too_long(
                job.endpoint,
                prompt.len(),
                max_tokens,
                job.context,
            ));
        }
        if job.common.params.min_tokens > max_tokens {
            return Err(ApiError::param(
                "min_tokens",
                format!(
                    "'min_tokens' ({}) must not exceed max_tokens ({max_tokens})",
                    job.common.params.min_tokens
                ),
            ));
        }
        let mut params = job.common.params.clone();
        params.max_tokens = max_tokens;
        submitted.max_tokens = max_tokens;
        let request = ServeRequest {
            prompt: prompt.clone(),
            params,
            n: job.common.n,
            trace: Trace {
                explain: job.common.explain,
                full_logits: false,
            },
        };
        streams.push(
            handle
                .submit(request)
                .map_err(|e| submit_error(job.endpoint, e))?,
        );
    }
    Ok((streams, submitted))
}

/// The events of all of a job's streams, tagged with the prompt's index. Dropping it drops the
/// streams, which cancels their requests.
type Events = SelectAll<BoxStream<'static, (usize, ServeEvent)>>;

fn merge(streams: Vec<ResponseStream>) -> Events {
    futures::stream::select_all(streams.into_iter().enumerate().map(|(i, rs)| {
        futures::stream::unfold(rs, |mut rs| async move {
            let event = rs.recv().await?;
            Some((event, rs))
        })
        .map(move |e| (i, e))
        .boxed()
    }))
}

async fn run(state: AppState, handle: ServeHandle, job: Job) -> Result<Response, ApiError> {
    let (streams, params) = submit(&handle, &job)?;
    let mut out = Output::new(&handle, &job);
    if job.tools.is_none() {
        out.receipt = ReceiptDraft::new(&state, &handle, &out.id, &job.prompts, &params);
    }
    let events = merge(streams);
    if job.common.stream {
        Ok(sse(state, out, events))
    } else {
        collect(state, out, events).await
    }
}

// ----- output -----

/// Counts a response whose client left before its end (on drop, unless finished).
struct Tracker {
    state: AppState,
    finished: bool,
    stream: bool,
}

impl Tracker {
    fn new(state: AppState, stream: bool) -> Tracker {
        if stream {
            state.metrics.streams_active.fetch_add(1, Ordering::Relaxed);
        }
        Tracker {
            state,
            finished: false,
            stream,
        }
    }
}

impl Tracker {
    /// The response was delivered whole.
    fn finish(&mut self) {
        self.finished = true;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if self.stream {
            self.state
                .metrics
                .streams_active
                .fetch_sub(1, Ordering::Relaxed);
        }
        if !self.finished {
            self.state
                .metrics
                .client_disconnects
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Usage summed over a job's requests.
#[derive(Default, Clone, Copy)]
struct Usage {
    prompt: usize,
    completion: usize,
    cached: usize,
}

impl Usage {
    fn json(&self) -> Value {
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
struct Choice {
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
    /// With tools: the generated ids (end-of-generation tokens left out), read for calls.
    ids: Vec<u32>,
    reader: Option<rill_constrain::tools::ToolReader>,
    /// Ids of the calls streamed so far.
    call_ids: Vec<String>,
    /// Every generated token, for the receipt.
    generated: Vec<u32>,
}

/// Formats a job's output.
struct Output {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    n: usize,
    tokenizer: Arc<Tokenizer>,
    choices: Vec<Choice>,
    usage: Usage,
    /// Whether a `Usage` event came (else usage is counted here).
    usage_seen: bool,
    prompt_tokens: usize,
    logprobs_asked: bool,
    include_usage: bool,
    explain: bool,
    kv_block_size: usize,
    tools: Option<rill_constrain::tools::ToolFormat>,
    /// Chunks made by the last event beyond the one it returned (a token can begin a call and
    /// carry arguments).
    extra: Vec<Value>,
    /// The response's reproducibility receipt, while it is recorded.
    receipt: Option<ReceiptDraft>,
}

const FINGERPRINT: &str = concat!("rill-", env!("CARGO_PKG_VERSION"));

impl Output {
    fn new(handle: &ServeHandle, job: &Job) -> Output {
        let mut choices: Vec<Choice> = (0..job.choices())
            .map(|_| Choice {
                reader: job.tools.map(rill_constrain::tools::ToolReader::new),
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
            tools: job.tools,
            extra: Vec::new(),
            receipt: None,
        }
    }

    /// Records the receipt of a response delivered whole.
    fn store_receipt(&mut self, state: &State) {
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

    fn unfinished(&self) -> bool {
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
    fn response(&self) -> Value {
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

    /// A whole response's message: its text, or with tools its content and calls.
    fn message(&self, c: &Choice) -> Value {
        let Some(format) = self.tools else {
            return json!({ "role": "assistant", "content": c.text, "refusal": null });
        };
        let text = self.tokenizer.decode_with(&c.ids, true);
        let parsed = rill_constrain::tools::ToolReader::parse(format, &text);
        let mut m = json!({
            "role": "assistant",
            "content": if parsed.content.is_empty() && !parsed.calls.is_empty() {
                Value::Null
            } else {
                json!(parsed.content)
            },
            "refusal": null,
        });
        if !parsed.calls.is_empty() {
            m["tool_calls"] = parsed
                .calls
                .iter()
                .map(|call| {
                    json!({
                        "id": crate::tools::call_id(),
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
        let Some(format) = self.tools else {
            return false;
        };
        if !matches!(c.finish, Some((FinishReason::Stop, _))) {
            return false;
        }
        match &c.reader {
            Some(r) if r.calls() > 0 => true,
            _ => {
                let text = self.tokenizer.decode_with(&c.ids, true);
                !rill_constrain::tools::ToolReader::parse(format, &text)
                    .calls
                    .is_empty()
            }
        }
    }

    /// With tools, a streamed token: the content and call deltas it makes (chunks beyond the
    /// first go to `extra`).
    fn tool_chunks(&mut self, i: usize, token: u32) -> Option<Value> {
        if !self.tokenizer.is_end_of_generation(token) {
            self.choices[i].ids.push(token);
        }
        let text = self.tokenizer.decode_with(&self.choices[i].ids, true);
        let deltas = self.choices[i].reader.as_mut()?.update(&text);
        let mut chunks = Vec::new();
        for d in deltas {
            let delta = match d {
                rill_constrain::tools::ToolDelta::Content(t) => json!({ "content": t }),
                rill_constrain::tools::ToolDelta::CallStart { index, name } => {
                    let id = crate::tools::call_id();
                    self.choices[i].call_ids.push(id.clone());
                    json!({ "tool_calls": [{
                        "index": index, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }]})
                }
                rill_constrain::tools::ToolDelta::Arguments { index, fragment } => {
                    json!({ "tool_calls": [{ "index": index, "function": {"arguments": fragment} }] })
                }
            };
            let mut choice = self.chunk_choice(i, None, Value::Null, None);
            choice["delta"] = delta;
            chunks.push(self.chunk(vec![choice]));
        }
        let first = (!chunks.is_empty()).then(|| chunks.remove(0));
        self.extra.extend(chunks);
        first
    }

    fn wants_logprobs(&self) -> bool {
        self.logprobs_asked
    }

    fn usage(&self) -> Usage {
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
    fn chunk(&self, choices: Vec<Value>) -> Value {
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
    fn opening_chunks(&self) -> Vec<Value> {
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
    fn on_event(
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
                self.choices[i].tokens += 1;
                if self.receipt.is_some() {
                    self.choices[i].generated.push(token);
                }
                if self.tools.is_some() {
                    if !streaming {
                        if !self.tokenizer.is_end_of_generation(token) {
                            self.choices[i].ids.push(token);
                        }
                        return Ok(None);
                    }
                    return Ok(self.tool_chunks(i, token));
                }
                let explained = match (&detail, self.explain) {
                    (Some(d), true) => Some(self.explained(token, logprobs.as_ref(), d)),
                    _ => None,
                };
                // Explaining computes log-probabilities; OpenAI's fields only when asked.
                let logprobs = logprobs.filter(|_| self.logprobs_asked);
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
                self.choices[i].finish = Some((finish_reason, cause));
                if !streaming {
                    return Ok(None);
                }
                let mut choice =
                    self.chunk_choice(i, None, Value::Null, self.choices[i].finish.as_ref());
                if self.made_calls(&self.choices[i]) {
                    choice["finish_reason"] = json!("tool_calls");
                }
                Ok(Some(self.chunk(vec![choice])))
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

/// The engine could not finish a request: out of KV-cache room (503, retry later) or an
/// internal failure (500).
fn generation_failed(message: String) -> ApiError {
    if message.starts_with("KV cache") {
        ApiError::unavailable(format!("generation failed: {message}"), "kv_cache_full")
    } else {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("generation failed: {message}"),
        )
    }
}

/// A token's text as OpenAI shows it (`bytes:\\xNN...` when its bytes are not valid UTF-8 on
/// their own, a piece of a multi-byte character), and its bytes.
pub(crate) fn token_repr(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer
        .token_to_bytes(id, true)
        .map(|b| b.into_owned())
        .unwrap_or_default();
    let text = match std::str::from_utf8(&bytes) {
        Ok(s) => s.to_string(),
        Err(_) => {
            let mut s = String::from("bytes:");
            for b in &bytes {
                s.push_str(&format!("\\x{b:02x}"));
            }
            s
        }
    };
    (text, bytes)
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

/// Collects every event and answers with the whole response.
async fn collect(state: AppState, out: Output, mut events: Events) -> Result<Response, ApiError> {
    let mut out = out;
    let header = out.receipt.as_ref().map(ReceiptDraft::path);
    let mut tracker = Tracker::new(state.clone(), false);
    let result = async {
        while let Some((p, e)) = events.next().await {
            out.on_event(p, e, false)?;
        }
        if out.unfinished() {
            return Err(generation_failed(
                "the engine ended the request without finishing it".into(),
            ));
        }
        let mut response = json_body(&out.response());
        if let Some(path) = header.and_then(|p| HeaderValue::from_str(&p).ok()) {
            out.store_receipt(&state);
            response.headers_mut().insert(RECEIPT_HEADER, path);
        }
        Ok(response)
    }
    .await;
    tracker.finish();
    result
}

/// A streamed response's state.
struct Sse {
    out: Output,
    events: Events,
    queue: VecDeque<Bytes>,
    ended: bool,
    tracker: Tracker,
}

impl Sse {
    fn push(&mut self, v: &Value) {
        self.queue.push_back(Bytes::from(format!("data: {v}\n\n")));
    }

    /// The closing events: an error if the engine stopped early, usage, `[DONE]`.
    fn end(&mut self, error: Option<ApiError>) {
        // Dropping the streams cancels whatever still runs.
        self.events = SelectAll::new();
        let error = error.or_else(|| {
            self.out.unfinished().then(|| {
                generation_failed("the engine ended the request without finishing it".into())
            })
        });
        match error {
            Some(e) => self.push(&e.body()),
            None => self.out.store_receipt(&self.tracker.state),
        }
        if self.out.include_usage {
            let mut v = self.out.chunk(Vec::new());
            v["usage"] = self.out.usage().json();
            self.push(&v);
        }
        self.queue
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.ended = true;
    }
}

/// Answers with server-sent events: one chunk per token, a final chunk per choice, usage when
/// asked for, then `[DONE]`. When the client goes away the body is dropped, and with it the
/// engine's streams, which cancels the request.
fn sse(state: AppState, out: Output, events: Events) -> Response {
    let receipt = out
        .receipt
        .as_ref()
        .and_then(|d| HeaderValue::from_str(&d.path()).ok());
    let mut s = Sse {
        out,
        events,
        queue: VecDeque::new(),
        ended: false,
        tracker: Tracker::new(state, true),
    };
    for chunk in s.out.opening_chunks() {
        s.push(&chunk);
    }
    let body = futures::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(b) = s.queue.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if s.ended {
                s.tracker.finish();
                return None;
            }
            match s.events.next().await {
                Some((p, e)) => match s.out.on_event(p, e, true) {
                    Ok(chunk) => {
                        if let Some(chunk) = chunk {
                            s.push(&chunk);
                        }
                        for extra in std::mem::take(&mut s.out.extra) {
                            s.push(&extra);
                        }
                    }
                    Err(e) => s.end(Some(e)),
                },
                None => s.end(None),
            }
        }
    });
    let mut response = (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        Body::from_stream(body),
    )
        .into_response();
    if let Some(path) = receipt {
        response.headers_mut().insert(RECEIPT_HEADER, path);
    }
    response
}

/// Names a response's reproducibility receipt (`GET` it, or `POST` its id to `/v1/rill/replay`).
const RECEIPT_HEADER: header::HeaderName = header::HeaderName::from_static("x-rill-receipt");
