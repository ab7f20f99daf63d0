//! A chat request as every dialect gives it (messages, tools, a structured-output constraint,
//! template variables), prepared for the engine: the template rendered with the tools where it
//! renders them (else the conversation rewritten for the generic format), the tool or output
//! constraint compiled, and how the answer is to be read (thinking, calls).

use std::sync::Arc;

use rill_constrain::tools::ToolFormat;
use rill_constrain::{ConstraintSpec, Grammar};
use rill_engine::serve::ServeHandle;
use rill_tokenizer::ChatMessage;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::generation::answer::{Answer, CallLimit, ReadOptions};
use crate::generation::prompt::chat_prompt;
use crate::generation::reasoning::ReasoningSyntax;
use crate::generation::request::blocking;
use crate::generation::submit::{merge, submit, Job};
use crate::generation::tools::ToolRequest;
use crate::params::{Common, Endpoint};
use crate::request_log::GenerationNote;
use crate::state::State;

/// A chat request, parsed from any dialect.
pub(crate) struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub tools: Option<ToolRequest>,
    /// A structured-output constraint and the field it came from.
    pub structured: Option<(ConstraintSpec, String)>,
    /// Extra template variables (`chat_template_kwargs`, `enable_thinking`).
    pub template_kwargs: Map<String, Value>,
    pub add_generation_prompt: bool,
    /// Whether the answer's thinking is read apart from its text (the dialects that can
    /// return it apart; a reasoning model's thinking otherwise stays in the text).
    pub separate_reasoning: bool,
    /// Most tokens of thinking (a reasoning model's closing is forced after them).
    pub thinking_budget: Option<usize>,
}

/// What the engine is given and how the answer is read.
pub(crate) struct PreparedChat {
    pub prompt: Vec<u32>,
    pub constraint: Option<Grammar>,
    /// The format calls are read in, when the model may call tools.
    pub tool_format: Option<ToolFormat>,
    pub read: ReadOptions,
    /// The thinking budget, for a reasoning model asked for one.
    pub thinking_budget: Option<rill_engine::ThinkingBudget>,
}

/// The field a request's constraint came from together with tools is refused: the answer is
/// either a tool call or the constrained text.
fn tools_and_constraint(field: &str) -> ApiError {
    ApiError::param(
        field.to_string(),
        format!(
            "'{field}' together with 'tools' is not supported: the answer is either a tool call \
             or text"
        ),
    )
}

/// The prompt alone (for counting tokens): the conversation as the template renders it with the
/// request's tools, nothing compiled.
pub(crate) async fn prompt_only(
    handle: &ServeHandle,
    request: ChatRequest,
) -> Result<Vec<u32>, ApiError> {
    let tokenizer = handle.tokenizer();
    let (format, _) = crate::generation::tools::format_of(&tokenizer);
    let (messages, template_tools) = match &request.tools {
        Some(t) => crate::generation::tools::prompt_messages(request.messages, t, format),
        None => (request.messages, None),
    };
    let kwargs = (!request.template_kwargs.is_empty()).then_some(request.template_kwargs);
    let agp = request.add_generation_prompt;
    let (prompt, _) = blocking(move || {
        chat_prompt(
            &tokenizer,
            &messages,
            template_tools.as_ref(),
            agp,
            kwargs.as_ref(),
        )
    })
    .await?;
    Ok(prompt)
}

/// Renders and tokenizes the request, compiles its constraint, and says how to read the
/// answer.
pub(crate) async fn prepare(
    state: &Arc<State>,
    handle: &ServeHandle,
    request: ChatRequest,
) -> Result<PreparedChat, ApiError> {
    crate::generation::submit::check_generative(handle)?;
    let tokenizer = handle.tokenizer();
    let (mut format, open_is_token) = crate::generation::tools::format_of(&tokenizer);
    // Calls that must happen (`required`, a named tool) are enforced, which a family's own
    // free-text syntax cannot be: those requests take the generic format.
    if let Some(t) = &request.tools {
        let must_call = matches!(
            t.choice,
            rill_constrain::tools::ToolChoice::Required
                | rill_constrain::tools::ToolChoice::Named(_)
        );
        if must_call && !format.enforces_calls() {
            format = ToolFormat::Generic;
        }
    }
    let mut constraint = None;
    let mut tool_format = None;
    let mut call_limit = CallLimit::Many;
    let ChatRequest {
        messages,
        tools,
        structured,
        template_kwargs,
        add_generation_prompt,
        separate_reasoning,
        thinking_budget,
    } = request;
    let (messages, template_tools) = match &tools {
        Some(t) => {
            // The generic format answers in JSON even without calls (`tool_choice: none`).
            if t.active() || format == ToolFormat::Generic {
                if let Some((_, field)) = &structured {
                    return Err(tools_and_constraint(field));
                }
                let plan = crate::generation::tools::request_plan(t, format, open_is_token);
                if let Some(spec) = plan.constraint {
                    let mut grammar = crate::generation::structured::compile(
                        state,
                        tokenizer.clone(),
                        spec,
                        "tools".into(),
                    )
                    .await?;
                    if let Some(trigger) = &plan.trigger {
                        grammar = grammar.after(trigger);
                    }
                    constraint = Some(grammar);
                }
                tool_format = Some(format);
                if !t.parallel || matches!(t.choice, rill_constrain::tools::ToolChoice::Named(_)) {
                    call_limit = CallLimit::One;
                }
            }
            crate::generation::tools::prompt_messages(messages, t, format)
        }
        None => {
            if let Some((spec, field)) = structured {
                constraint = Some(
                    crate::generation::structured::compile(state, tokenizer.clone(), spec, field)
                        .await?,
                );
            }
            (messages, None)
        }
    };
    let tool_names = match (&tools, tool_format) {
        (Some(t), Some(f)) if f != ToolFormat::Generic => {
            t.tools.iter().map(|t| t.name.clone()).collect()
        }
        _ => Vec::new(),
    };
    let param_types = match &tools {
        Some(t) => rill_constrain::native_calls::ParamTypes::from_schemas(
            t.tools.iter().map(|t| (t.name.as_str(), &t.parameters)),
        ),
        None => Default::default(),
    };
    let model_syntax = ReasoningSyntax::detect(tokenizer.chat_template());
    let syntax = model_syntax.filter(|_| separate_reasoning);
    let kwargs = (!template_kwargs.is_empty()).then_some(template_kwargs);
    let (prompt, text) = blocking(move || {
        chat_prompt(
            &tokenizer,
            &messages,
            template_tools.as_ref(),
            add_generation_prompt,
            kwargs.as_ref(),
        )
    })
    .await?;
    let thinking_budget = model_syntax
        .zip(thinking_budget)
        .map(|(s, tokens)| s.budget(tokens, &text));
    Ok(PreparedChat {
        prompt,
        constraint,
        tool_format,
        thinking_budget,
        read: ReadOptions {
            reasoning: syntax.map(|s| (s, prompt_tail(&text))),
            tools: tool_format,
            call_limit,
            tool_names,
            param_types,
        },
    })
}

/// Submits a prepared chat as one choice with `common` (the prepared constraint and thinking
/// budget set in it) within `context` positions, `max_tokens` a cap; the answer's events and
/// the prompt's length. The Messages, Responses and Ollama dialects start so.
pub(crate) fn start(
    handle: &ServeHandle,
    prepared: PreparedChat,
    mut common: Common,
    model: String,
    context: usize,
    note: GenerationNote,
) -> Result<(Answer, usize), ApiError> {
    common.params.constraint = prepared.constraint;
    common.params.thinking_budget = prepared.thinking_budget;
    let job = Job {
        endpoint: Endpoint::Chat,
        prompts: vec![prepared.prompt],
        echo: None,
        common,
        model,
        context,
        tools: prepared.tool_format,
        cap_max_tokens: true,
    };
    let (streams, _) = submit(handle, &job)?;
    let answer = Answer::new(
        merge(streams),
        handle.tokenizer(),
        &job,
        &prepared.read,
        Some(note),
    );
    Ok((answer, job.prompts[0].len()))
}

/// The end of a rendered prompt: enough to see whether it opens the thinking.
fn prompt_tail(text: &str) -> String {
    let mut start = text.len().saturating_sub(64);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    text[start..].to_string()
}
