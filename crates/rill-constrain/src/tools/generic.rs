//! The generic tool format, for templates that know no call syntax: the tools described in the
//! system prompt, and the conversation's calls and results rewritten as the JSON the model
//! answers in (`{"tool_calls": [...]}` or `{"response": "..."}`, enforced by the constraint).

use serde_json::{json, Map, Value};

use super::{ParsedCall, Tool, ToolChoice};

/// The system prompt that describes `tools` for the generic format.
pub fn generic_system_prompt(tools: &[Tool], choice: &ToolChoice) -> String {
    if tools.is_empty() || *choice == ToolChoice::None {
        return "Answer with only a JSON object {\"response\": <your answer>}. Tool results come back in a message that starts with \"Tool result\".".into();
    }
    let list: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut m = Map::new();
            m.insert("name".into(), json!(t.name));
            if let Some(d) = &t.description {
                m.insert("description".into(), json!(d));
            }
            m.insert("parameters".into(), t.parameters.clone());
            Value::Object(m)
        })
        .collect();
    let tools_json = serde_json::to_string_pretty(&list).unwrap_or_default();
    let how = match choice {
        ToolChoice::Auto => "To call tools, answer with only a JSON object {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]}. To answer the user directly, answer with only {\"response\": <your answer>}.",
        _ => "Answer with only a JSON object {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]}.",
    };
    format!("You can call these tools:\n{tools_json}\n{how} Tool results come back in a message that starts with \"Tool result\".")
}

/// A conversation with tool calls and results rewritten for the generic format: the tools in
/// the system prompt, an assistant's calls as the JSON it would have written, tool results as
/// user messages, consecutive messages of one role merged (templates such as Gemma's require
/// alternating roles). Each message is `(role, content, tool_calls, tool_call_id)`.
pub fn generic_messages(
    messages: &[(String, String, Vec<ParsedCall>, Option<String>)],
    tools: &[Tool],
    choice: &ToolChoice,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let system = generic_system_prompt(tools, choice);
    let push = |role: &str, content: String, out: &mut Vec<(String, String)>| match out.last_mut() {
        Some((r, c)) if r == role => {
            c.push_str("\n\n");
            c.push_str(&content);
        }
        _ => out.push((role.to_string(), content)),
    };
    match messages.first() {
        Some((role, content, _, _)) if role == "system" => {
            push("system", format!("{content}\n\n{system}"), &mut out);
        }
        _ => push("system", system, &mut out),
    }
    let skip = usize::from(messages.first().is_some_and(|m| m.0 == "system"));
    for (role, content, calls, call_id) in &messages[skip..] {
        match role.as_str() {
            "assistant" if !calls.is_empty() => {
                let list: Vec<String> = calls
                    .iter()
                    .map(|c| {
                        format!(
                            "{{\"name\": {}, \"arguments\": {}}}",
                            serde_json::to_string(&c.name).unwrap_or_default(),
                            c.arguments
                        )
                    })
                    .collect();
                push(
                    "assistant",
                    format!("{{\"tool_calls\": [{}]}}", list.join(", ")),
                    &mut out,
                );
            }
            "assistant" => push(
                "assistant",
                format!(
                    "{{\"response\": {}}}",
                    serde_json::to_string(content).unwrap_or_default()
                ),
                &mut out,
            ),
            "tool" => {
                let id = call_id.as_deref().unwrap_or("");
                push("user", format!("Tool result ({id}): {content}"), &mut out);
            }
            other => push(other, content.clone(), &mut out),
        }
    }
    out
}
