//! The dialects over one internal request, on the tiny synthetic model with reasoning templates:
//! thinking comes back apart from the answer in Chat Completions (`reasoning_content`,
//! `reasoning`), Messages (`thinking` blocks) and Responses (`reasoning` items), whole and
//! streamed, and never inside the answer's text; `chat_template_kwargs` and each dialect's
//! thinking switch reach the template; each dialect's errors keep its own shape; Messages and
//! Responses treat a `max_tokens` past the context as a cap; stored responses continue a
//! conversation.

mod common;

use common::*;
use rill_engine::Engine;
use rill_model::synthetic::SyntheticSpec;
use rill_server::ServerOptions;
use serde_json::{json, Value};

/// Qwen3's kind of template: the answer may open with `<think>`; `enable_thinking: false`
/// renders an empty thinking block in the prompt.
const THINK_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}\
{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n\
{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}\
{% endif %}";

/// DeepSeek-R1's and Qwen3.5's kind: the prompt opens the thinking, so the answer starts
/// inside it (unless thinking is off).
const OPENED_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n\
{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n\
{% else %}<think>\n{% endif %}{% endif %}";

fn engine(template: &str) -> Engine {
    engine_with_context(template, SyntheticSpec::llama_tiny().context_length)
}

fn engine_with_context(template: &str, context_length: usize) -> Engine {
    let spec = SyntheticSpec {
        context_length,
        ..SyntheticSpec::llama_tiny()
    };
    let mut model = spec.build().unwrap();
    model.set_metadata(
        "tokenizer.chat_template",
        rill_gguf::Value::String(template.into()),
    );
    load(&model)
}

async fn server(template: &str, options: ServerOptions) -> TestServer {
    TestServer::start(engine(template), small_config(), options).await
}

/// The forced answer: thinking, then the text.
const FORCED: &str = "<think>\\nI add 2 and 2\\.\\n</think>\\n\\nIt is 4\\.";

fn forced_chat(stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": "What is 2 + 2?"}],
        "structured_outputs": {"regex": FORCED},
        "max_tokens": 100,
        "temperature": 0,
        "stream": stream,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_return_the_thinking_apart() {
    let s = server(THINK_TEMPLATE, ServerOptions::default()).await;
    let r = post(&s.base, "/v1/chat/completions", &forced_chat(false)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let m = &r.json["choices"][0]["message"];
    assert_eq!(m["content"], "It is 4.", "{}", r.text);
    assert_eq!(m["reasoning_content"], "I add 2 and 2.", "{}", r.text);
    assert_eq!(m["reasoning"], "I add 2 and 2.", "{}", r.text);

    let st = stream(&s.base, "/v1/chat/completions", &forced_chat(true)).await;
    assert_eq!(st.status, 200);
    let (mut reasoning, mut other_name) = (String::new(), String::new());
    for c in st.chunks() {
        let d = &c["choices"][0]["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        other_name.push_str(d["reasoning"].as_str().unwrap_or(""));
    }
    assert_eq!(st.text(0), "It is 4.");
    assert_eq!(reasoning, "I add 2 and 2.");
    assert_eq!(other_name, reasoning);
    assert_eq!(st.finish_reason(0).as_deref(), Some("stop"));

    // llama.cpp's switch leaves the thinking in the content.
    let mut body = forced_chat(false);
    body["reasoning_format"] = json!("none");
    let r = post(&s.base, "/v1/chat/completions", &body).await;
    let m = &r.json["choices"][0]["message"];
    assert_eq!(
        m["content"], "<think>\nI add 2 and 2.\n</think>\n\nIt is 4.",
        "{}",
        r.text
    );
    assert!(m.get("reasoning_content").is_none(), "{}", r.text);

    // A thinking history goes back to the template.
    let body = json!({
        "messages": [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
            {"role": "user", "content": "Sure?"},
        ],
    });
    let r = post(&s.base, "/tokenize", &body).await;
    let tokens: Vec<u32> = serde_json::from_value(r.json["tokens"].clone()).unwrap();
    let rendered = post(&s.base, "/detokenize", &json!({ "tokens": tokens })).await;
    let rendered = rendered.json["prompt"].as_str().unwrap().to_string();
    assert!(
        rendered.contains("<think>\ntwo and two\n</think>"),
        "{rendered}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_template_kwargs_reach_the_template() {
    let s = server(OPENED_TEMPLATE, ServerOptions::default()).await;
    let ask = |kwargs: Value| {
        json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 12,
            "temperature": 0,
            "ignore_eos": true,
            "chat_template_kwargs": kwargs,
        })
    };
    // Thinking on (the template's default): the prompt opens it, so all of a short answer is
    // thinking.
    let r = post(&s.base, "/v1/chat/completions", &ask(json!({}))).await;
    let m = &r.json["choices"][0]["message"];
    assert_eq!(m["content"], "", "{}", r.text);
    assert!(
        m["reasoning_content"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{}",
        r.text
    );
    // Thinking off: the answer is content.
    let r = post(
        &s.base,
        "/v1/chat/completions",
        &ask(json!({"enable_thinking": false, "unused_by_the_template": 1})),
    )
    .await;
    let m = &r.json["choices"][0]["message"];
    assert!(
        m["content"].as_str().is_some_and(|t| !t.is_empty()),
        "{}",
        r.text
    );
    assert_eq!(m["reasoning_content"], Value::Null, "{}", r.text);
    // Not an object: a 400 naming the field.
    let r = post(&s.base, "/v1/chat/completions", &ask(json!(5))).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error_param(), Some("chat_template_kwargs"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_return_thinking_blocks() {
    let s = server(OPENED_TEMPLATE, ServerOptions::default()).await;
    let body = json!({
        "model": "tiny",
        "max_tokens": 10,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hi"}],
    });
    let r = post(&s.base, "/v1/messages", &body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["type"], "message");
    let content = r.json["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "thinking", "{}", r.text);
    assert!(
        content
            .iter()
            .all(|b| b["type"] != "text" || b["text"] == ""),
        "{}",
        r.text
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let st = stream(&s.base, "/v1/messages", &streamed).await;
    let kinds: Vec<&str> = st.chunks().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"message_start"));
    assert_eq!(kinds.last(), Some(&"message_stop"));
    let thinking: String = st
        .chunks()
        .filter_map(|e| e.pointer("/delta/thinking").and_then(Value::as_str))
        .collect();
    assert_eq!(thinking, content[0]["thinking"].as_str().unwrap());
    assert!(st
        .chunks()
        .all(|e| e.pointer("/delta/type") != Some(&json!("text_delta"))));

    // Thinking off reaches the template: the answer is text.
    let mut off = body.clone();
    off["thinking"] = json!({"type": "disabled"});
    let r = post(&s.base, "/v1/messages", &off).await;
    let content = r.json["content"].as_array().unwrap();
    assert_eq!(content[0]["type"], "text", "{}", r.text);
    assert!(
        content.iter().all(|b| b["type"] != "thinking"),
        "{}",
        r.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_return_reasoning_items() {
    let s = server(OPENED_TEMPLATE, ServerOptions::default()).await;
    let body = json!({
        "input": "Hi",
        "max_output_tokens": 10,
        "temperature": 0,
    });
    let r = post(&s.base, "/v1/responses", &body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["object"], "response");
    assert_eq!(r.json["output"][0]["type"], "reasoning", "{}", r.text);
    let usage = &r.json["usage"];
    assert_eq!(
        usage["output_tokens_details"]["reasoning_tokens"], usage["output_tokens"],
        "{}",
        r.text
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let st = stream(&s.base, "/v1/responses", &streamed).await;
    let kinds: Vec<&str> = st.chunks().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
    assert!(
        kinds.contains(&"response.reasoning_text.delta"),
        "{kinds:?}"
    );
    assert!(!kinds.contains(&"response.output_text.delta"), "{kinds:?}");
    // Ten tokens of thinking: cut by the limit.
    assert_eq!(kinds.last(), Some(&"response.incomplete"));
    let numbers: Vec<u64> = st
        .chunks()
        .filter_map(|e| e["sequence_number"].as_u64())
        .collect();
    assert_eq!(numbers, (0..numbers.len() as u64).collect::<Vec<_>>());

    // `reasoning.effort: "none"` turns thinking off.
    let mut off = body.clone();
    off["reasoning"] = json!({"effort": "none"});
    let r = post(&s.base, "/v1/responses", &off).await;
    assert_eq!(r.json["output"][0]["type"], "message", "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_continue_a_conversation() {
    let s = server(THINK_TEMPLATE, ServerOptions::default()).await;
    let first = post(
        &s.base,
        "/v1/responses",
        &json!({"input": "Hi", "max_output_tokens": 5, "temperature": 0}),
    )
    .await;
    let id = first.json["id"].as_str().unwrap().to_string();
    let got = get(&s.base, &format!("/v1/responses/{id}")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json["output"], first.json["output"]);
    let next = post(
        &s.base,
        "/v1/responses",
        &json!({"input": "More", "previous_response_id": id, "max_output_tokens": 5}),
    )
    .await;
    assert_eq!(next.status, 200, "{}", next.text);
    // The follow-up's prompt holds the first exchange.
    assert!(
        next.json["usage"]["input_tokens"].as_u64() > first.json["usage"]["input_tokens"].as_u64(),
        "{} / {}",
        first.text,
        next.text
    );
    let deleted = send(client().delete(format!("{}/v1/responses/{id}", s.base))).await;
    assert_eq!(deleted.json["deleted"], true);
    let gone = post(
        &s.base,
        "/v1/responses",
        &json!({"input": "x", "previous_response_id": id}),
    )
    .await;
    assert_eq!(gone.status, 404);
    gone.assert_error_shape();
    assert_eq!(gone.error_param(), Some("previous_response_id"));
    // Not stored: nothing to fetch.
    let unstored = post(
        &s.base,
        "/v1/responses",
        &json!({"input": "x", "store": false, "max_output_tokens": 2}),
    )
    .await;
    let id = unstored.json["id"].as_str().unwrap();
    assert_eq!(
        get(&s.base, &format!("/v1/responses/{id}")).await.status,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_past_the_context_is_a_cap_in_messages_and_responses() {
    let s = server(THINK_TEMPLATE, ServerOptions::default()).await;
    let r = post(
        &s.base,
        "/v1/messages",
        &json!({"max_tokens": 64000, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let u = &r.json["usage"];
    let total = u["input_tokens"].as_u64().unwrap()
        + u["cache_read_input_tokens"].as_u64().unwrap()
        + u["output_tokens"].as_u64().unwrap();
    assert!(total <= 256, "{}", r.text);
    let r = post(
        &s.base,
        "/v1/responses",
        &json!({"max_output_tokens": 64000, "input": "Hi"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Chat Completions keeps OpenAI's rule: past the context is an error.
    let r = post(
        &s.base,
        "/v1/chat/completions",
        &json!({"max_tokens": 64000, "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(r.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dialect_keeps_its_error_shape() {
    let s = server(
        THINK_TEMPLATE,
        ServerOptions {
            api_key: Some("k".into()),
            ..ServerOptions::default()
        },
    )
    .await;
    let anthropic = |path: &str, key: Option<&str>, body: Value| {
        let mut r = client()
            .post(format!("{}{path}", s.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        send(r)
    };
    let ok_body = json!({"max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]});
    // Anthropic's client sends its key in x-api-key.
    let r = anthropic("/v1/messages", Some("k"), ok_body.clone()).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for (key, body, status, kind) in [
        (None, ok_body.clone(), 401, "authentication_error"),
        (Some("wrong"), ok_body.clone(), 401, "authentication_error"),
        (
            Some("k"),
            json!({"max_tokens": 3, "messages": []}),
            400,
            "invalid_request_error",
        ),
        (
            Some("k"),
            json!({"max_tokens": 3, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
            400,
            "invalid_request_error",
        ),
        (
            Some("k"),
            json!({"model": "nope", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}),
            404,
            "not_found_error",
        ),
    ] {
        let r = anthropic("/v1/messages", key, body).await;
        assert_eq!(r.status, status, "{}", r.text);
        assert_eq!(r.json["type"], "error", "{}", r.text);
        assert_eq!(r.json["error"]["type"], kind, "{}", r.text);
        assert!(r.json["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    let r = anthropic(
        "/v1/messages/count_tokens",
        Some("k"),
        json!({"messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert!(
        r.json["input_tokens"].as_u64().is_some_and(|n| n > 0),
        "{}",
        r.text
    );
    // Responses keeps OpenAI's shape.
    let r = send(
        client()
            .post(format!("{}/v1/responses", s.base))
            .bearer_auth("k")
            .body(json!({"input": 5}).to_string()),
    )
    .await;
    assert_eq!(r.status, 400);
    r.assert_error_shape();
    assert_eq!(r.error_param(), Some("input"));
}

/// Every value of a valid body, and of its nested objects and arrays, replaced in turn by a
/// value of each other JSON type.
fn type_swaps(body: &Value) -> Vec<Value> {
    fn walk(v: &Value, path: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
        out.push(path.clone());
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    path.push(json!(k));
                    walk(x, path, out);
                    path.pop();
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    path.push(json!(i));
                    walk(x, path, out);
                    path.pop();
                }
            }
            _ => {}
        }
    }
    let mut paths = Vec::new();
    walk(body, &mut Vec::new(), &mut paths);
    let mut out = Vec::new();
    for path in paths.into_iter().filter(|p| !p.is_empty()) {
        for replacement in [
            json!(null),
            json!(-1),
            json!("x"),
            json!([]),
            json!({}),
            json!(true),
        ] {
            let mut b = body.clone();
            let mut at = &mut b;
            for step in &path {
                at = match step {
                    Value::String(k) => &mut at[k.as_str()],
                    Value::Number(i) => &mut at[i.as_u64().unwrap() as usize],
                    _ => unreachable!(),
                };
            }
            *at = replacement;
            out.push(b);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_each_dialects_400_never_a_500() {
    // Room for the generic tool format's instructions.
    let s = TestServer::start(
        engine_with_context(THINK_TEMPLATE, 2048),
        small_config(),
        ServerOptions::default(),
    )
    .await;
    let messages = json!({
        "model": "tiny", "max_tokens": 2, "system": [{"type": "text", "text": "s"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}]},
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
        "stop_sequences": ["x"], "temperature": 0.5,
    });
    let responses = json!({
        "model": "tiny", "max_output_tokens": 2, "instructions": "s",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "d"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r"},
            {"role": "user", "content": "hi"},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
                  {"type": "namespace", "name": "ns", "description": "d",
                   "tools": [{"type": "function", "name": "g"}]}],
        "tool_choice": "auto", "text": {"format": {"type": "text"}}, "reasoning": {"effort": "low"},
        "temperature": 0.5, "store": false,
    });
    let ollama = json!({
        "model": "tiny:latest", "stream": false, "format": "json", "think": true,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "thinking": "t",
             "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "content": "r", "tool_name": "f"},
        ],
        "options": {"temperature": 0.5, "num_predict": 2, "stop": ["x"], "num_ctx": 2048,
                    "top_k": 5, "seed": 3},
    });
    for (path, body) in [
        ("/v1/messages", &messages),
        ("/v1/responses", &responses),
        ("/api/chat", &ollama),
    ] {
        let ok = post(&s.base, path, body).await;
        assert_eq!(ok.status, 200, "{path}: {}", ok.text);
        let swaps = type_swaps(body);
        assert!(swaps.len() > 100, "{}", swaps.len());
        for b in swaps {
            let r = post(&s.base, path, &b).await;
            // 404: a `model` that is not served.
            assert!(
                matches!(r.status, 200 | 400 | 404),
                "{path} {b}: {} {}",
                r.status,
                r.text
            );
            if r.status != 200 {
                if path == "/api/chat" {
                    assert!(
                        r.json["error"].as_str().is_some_and(|m| !m.is_empty()),
                        "{}",
                        r.text
                    );
                } else if path == "/v1/messages" {
                    let kind = if r.status == 400 {
                        "invalid_request_error"
                    } else {
                        "not_found_error"
                    };
                    assert_eq!(r.json["error"]["type"], kind, "{}", r.text);
                } else {
                    r.assert_error_shape();
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_in_both_dialects() {
    let s = server(THINK_TEMPLATE, ServerOptions::default()).await;
    let r = post(
        &s.base,
        "/v1/embeddings",
        &json!({"input": ["a cat", "a dog sat", "a cat"]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["object"], "list");
    let data = r.json["data"].as_array().unwrap();
    let vector =
        |i: usize| -> Vec<f32> { serde_json::from_value(data[i]["embedding"].clone()).unwrap() };
    let d = vector(0).len();
    assert!(d > 0);
    for (i, item) in data.iter().enumerate() {
        assert_eq!(item["index"], i);
        let norm: f32 = vector(i).iter().map(|x| x * x).sum();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
    }
    // Vectors are compared as f32 (what they are): JSON's decimal form parses back to the same
    // f32, not always to the same f64.
    // The same text in one request: the same vector.
    assert_eq!(vector(0), vector(2));
    assert!(r.json["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    // Token ids, base64 (little-endian f32), fewer dimensions.
    let ids = post(&s.base, "/tokenize", &json!({"prompt": "a cat"}))
        .await
        .json["tokens"]
        .clone();
    let by_ids = post(&s.base, "/v1/embeddings", &json!({"input": ids})).await;
    let by_ids: Vec<f32> =
        serde_json::from_value(by_ids.json["data"][0]["embedding"].clone()).unwrap();
    assert_eq!(by_ids, vector(0));
    let b64 = post(
        &s.base,
        "/v1/embeddings",
        &json!({"input": "a cat", "encoding_format": "base64"}),
    )
    .await;
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.json["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(decoded, vector(0));
    let short = post(
        &s.base,
        "/v1/embeddings",
        &json!({"input": "a cat", "dimensions": 8}),
    )
    .await;
    let short: Vec<f32> =
        serde_json::from_value(short.json["data"][0]["embedding"].clone()).unwrap();
    assert_eq!(short.len(), 8);
    assert!((short.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-4);
    // Bad inputs: 400s naming the field.
    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": 5}), "input"),
        (
            json!({"input": "x", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": "x", "dimensions": 100000}), "dimensions"),
        (json!({"input": "x ".repeat(400)}), "input"),
        (json!({"input": vec!["x"; 2049]}), "input"),
    ] {
        let r = post(&s.base, "/v1/embeddings", &body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text);
        r.assert_error_shape();
        assert_eq!(r.error_param(), Some(param), "{}", r.text);
    }
    // Ollama's: /api/embed (several, truncating long inputs by default), /api/embeddings.
    let r = post(
        &s.base,
        "/api/embed",
        &json!({"model": "tiny", "input": ["a cat", "x ".repeat(400)]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let first: Vec<f32> = serde_json::from_value(r.json["embeddings"][0].clone()).unwrap();
    assert_eq!(first, vector(0));
    let r = post(
        &s.base,
        "/api/embed",
        &json!({"input": "x ".repeat(400), "truncate": false}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(r.json["error"].is_string());
    let r = post(
        &s.base,
        "/api/embeddings",
        &json!({"model": "tiny:latest", "prompt": "a cat"}),
    )
    .await;
    let legacy: Vec<f32> = serde_json::from_value(r.json["embedding"].clone()).unwrap();
    assert_eq!(legacy, vector(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thinking_budget_forces_the_closing() {
    // The prompt opens the thinking: without a budget, 30 tokens are all thinking.
    let s = server(OPENED_TEMPLATE, ServerOptions::default()).await;
    let ask = |extra: Value| {
        let mut body = json!({
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 30,
            "temperature": 0,
            "ignore_eos": true,
        });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let r = post(&s.base, "/v1/chat/completions", &ask(json!({}))).await;
    assert_eq!(r.json["choices"][0]["message"]["content"], "", "{}", r.text);
    for budget in [0, 4] {
        let r = post(
            &s.base,
            "/v1/chat/completions",
            &ask(json!({ "thinking_budget_tokens": budget })),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let m = &r.json["choices"][0]["message"];
        let thinking = m["reasoning_content"].as_str().unwrap_or("");
        let content = m["content"].as_str().unwrap();
        // At most `budget` tokens of thinking (byte tokens: at most so many characters), then
        // the forced closing, then the answer.
        assert!(thinking.chars().count() <= budget, "{budget}: {}", r.text);
        assert!(
            !content.is_empty() && !content.contains("</think>"),
            "{}",
            r.text
        );
        assert_eq!(r.json["usage"]["completion_tokens"], 30);
    }
    // Messages' thinking.budget_tokens: a thinking block, then text.
    let r = post(
        &s.base,
        "/v1/messages",
        &json!({"max_tokens": 30, "temperature": 0, "ignore_eos": true,
                "thinking": {"type": "enabled", "budget_tokens": 3},
                "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    let kinds: Vec<&str> = r.json["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["type"].as_str())
        .collect();
    assert_eq!(kinds.last(), Some(&"text"), "{}", r.text);
    // An unknown effort is a 400.
    let r = post(
        &s.base,
        "/v1/chat/completions",
        &ask(json!({ "reasoning_effort": "extreme" })),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error_param(), Some("reasoning_effort"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explained_tokens_say_whether_they_are_thinking() {
    let s = server(OPENED_TEMPLATE, ServerOptions::default()).await;
    let r = post(
        &s.base,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20,
                "temperature": 0, "ignore_eos": true, "explain": true,
                "thinking_budget_tokens": 4}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let parts: Vec<&str> = r.json["choices"][0]["rill"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["part"].as_str().unwrap())
        .collect();
    // Four sampled tokens of thinking, then (after the forced closing, which is not sampled)
    // the answer's.
    assert_eq!(parts[..4], ["reasoning"; 4], "{parts:?}");
    assert!(parts[4..].iter().all(|&p| p == "answer"), "{parts:?}");
    // A model without a thinking syntax has no `part`.
    let plain = server(
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        ServerOptions::default(),
    )
    .await;
    let r = post(
        &plain.base,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "explain": true}),
    )
    .await;
    assert!(
        r.json["choices"][0]["rill"]["tokens"][0]
            .get("part")
            .is_none(),
        "{}",
        r.text
    );
}
