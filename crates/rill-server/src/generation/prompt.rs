//! Prompts as the model sees them: rill's chat messages (OpenAI's `messages` shape, which the
//! glass box and every dialect convert to) rendered by the chat template and tokenized, raw
//! prompts (text or token ids), and a token's text as the API spells it.

use rill_tokenizer::{ChatMessage, Tokenizer, TokenizerError};
use serde_json::Value;

use crate::error::ApiError;
use crate::fields::Fields;
use crate::params::{token_list, MAX_N};

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
                message.tool_calls =
                    crate::generation::tools::history_calls(&mf.name("tool_calls"), v)?;
            }
            // The thinking an earlier answer returned, under either name peers use.
            message.reasoning_content = match mf.str("reasoning_content")? {
                Some(r) => Some(r.to_string()),
                None => mf.str("reasoning")?.map(str::to_string),
            };
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
    let text = render(tokenizer, messages, tools, add_generation_prompt, None)?;
    Ok(tokenizer.encode_with_special(&text, add_special, true))
}

/// The prompt's tokens and text: the template given `tools` and extra variables (`kwargs`),
/// then tokenized as [`chat_tokens`] does.
pub(crate) fn chat_prompt(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    tools: Option<&Value>,
    add_generation_prompt: bool,
    kwargs: Option<&serde_json::Map<String, Value>>,
) -> Result<(Vec<u32>, String), ApiError> {
    let text = render(tokenizer, messages, tools, add_generation_prompt, kwargs)?;
    Ok((tokenizer.encode_with_special(&text, true, true), text))
}

fn render(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    tools: Option<&Value>,
    add_generation_prompt: bool,
    kwargs: Option<&serde_json::Map<String, Value>>,
) -> Result<String, ApiError> {
    tokenizer
        .apply_chat_template_with_options(messages, tools, add_generation_prompt, kwargs)
        .map_err(|e| match e {
            TokenizerError::NoChatTemplate => ApiError::param(
                "messages",
                "this model has no chat template: use /v1/completions with a raw prompt",
            ),
            e => ApiError::param("messages", format!("cannot apply the chat template: {e}")),
        })
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
