//! `/v1/chat/completions` and `/v1/completions`: requests validated into engine requests,
//! answered whole or streamed as server-sent events in OpenAI's chunk format.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::http::StatusCode;
use axum::response::Response;
use futures::stream::{BoxStream, SelectAll};
use futures::StreamExt;
use rill_engine::serve::{
    ResponseStream, ServeEvent, ServeHandle, ServeRequest, SubmitError, Trace,
};
use rill_engine::GenerateParams;
use rill_tokenizer::{ChatMessage, Tokenizer, TokenizerError};
use serde_json::Value;

use crate::error::ApiError;
use crate::fields::Fields;
use crate::params::{parse_common, token_list, Common, Endpoint, MAX_N};
use crate::receipts::ReceiptDraft;
use crate::request_log::GenerationNote;
use crate::routes::{blocking, open_request};
use crate::State;

mod output;
mod respond;

pub(crate) use output::token_repr;
use output::Output;
use respond::{collect, sse};

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
    axum::Extension(note): axum::Extension<GenerationNote>,
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
    run(state, handle, job, note).await
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
    axum::Extension(note): axum::Extension<GenerationNote>,
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
    run(state, handle, job, note).await
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

async fn run(
    state: AppState,
    handle: ServeHandle,
    job: Job,
    note: GenerationNote,
) -> Result<Response, ApiError> {
    let (streams, params) = submit(&handle, &job)?;
    let mut out = Output::new(&handle, &job);
    out.note = Some(note);
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
