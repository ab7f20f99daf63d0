//! Structured output over HTTP on SmolLM2-135M-Instruct: every family of fields (OpenAI's
//! `response_format`, vLLM's `structured_outputs` and `guided_*`, llama.cpp's `json_schema`
//! and `grammar`) constrains the answer, whole and streamed; constraints that cannot be enforced
//! are 400s naming the field; compiling is bounded in time.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use rill_engine::serve::{self, ServeConfig};
use rill_engine::{Engine, Precision};
use rill_server::{Server, ServerOptions};
use serde_json::{json, Value};

fn engine() -> Engine {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::resolve("smollm2-135m", &opts)
        .unwrap_or_else(|e| panic!("{e} (run `cargo run --release -- pull smollm2-135m`)"));
    Engine::load(&path, 2, Precision::Fast).unwrap()
}

fn start(options: ServerOptions) -> String {
    let config = ServeConfig {
        kv_cache_bytes: 64 << 20,
        context: 2048,
        model_name: "smollm2-135m".into(),
        ..ServeConfig::default()
    };
    let handle = serve::spawn(engine(), config).unwrap();
    let server = Server::new(options);
    server.set_ready(handle);
    format!("http://{}", server.serve_in_background(2).unwrap())
}

/// One server for the binary's tests.
fn server() -> &'static str {
    static BASE: OnceLock<String> = OnceLock::new();
    BASE.get_or_init(|| start(ServerOptions::default()))
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "skills": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3}
        },
        "required": ["name", "age", "skills"],
        "additionalProperties": false
    })
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let o = v.as_object().unwrap();
    assert_eq!(
        o.keys().collect::<Vec<_>>(),
        ["name", "age", "skills"],
        "{text}"
    );
    assert!((0..=150).contains(&o["age"].as_i64().unwrap()), "{text}");
    let skills = o["skills"].as_array().unwrap();
    assert!((1..=3).contains(&skills.len()), "{text}");
}

fn ask(question: &str, extra: Value) -> Value {
    let mut body = json!({
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 120,
        "temperature": 0,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn content(r: &Reply) -> &str {
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["choices"][0]["message"]["content"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_format_json_schema_whole_and_streamed() {
    let base = server();
    let body = ask(
        "Describe a software engineer as JSON.",
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema(), "strict": true}}}),
    );
    let r = post(base, "/v1/chat/completions", &body).await;
    let whole = content(&r).to_string();
    check_person(&whole);
    assert_eq!(r.json["choices"][0]["finish_reason"], "stop");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let s = stream(base, "/v1/chat/completions", &streamed).await;
    assert_eq!(s.text(0), whole);
    assert_eq!(s.finish_reason(0).as_deref(), Some("stop"));
    // The schema sent as `json_schema` itself, and under `response_format.schema`.
    for rf in [
        json!({"type": "json_schema", "json_schema": person_schema()}),
        json!({"type": "json_schema", "schema": person_schema()}),
    ] {
        let r = post(
            base,
            "/v1/chat/completions",
            &ask(
                "Describe a software engineer as JSON.",
                json!({ "response_format": rf }),
            ),
        )
        .await;
        assert_eq!(content(&r), whole);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_of_fields_constrains_the_answer() {
    let base = server();
    let q = "Name a fruit.";
    let r = post(
        base,
        "/v1/chat/completions",
        &ask(
            "Give a JSON object with the name and color of a fruit.",
            json!({"response_format": {"type": "json_object"}}),
        ),
    )
    .await;
    let v: Value = serde_json::from_str(content(&r)).unwrap();
    assert!(v.is_object());

    let r = post(
        base,
        "/v1/chat/completions",
        &ask(
            q,
            json!({"structured_outputs": {"choice": ["apple", "banana", "cherry"]}}),
        ),
    )
    .await;
    assert!(
        ["apple", "banana", "cherry"].contains(&content(&r)),
        "{}",
        content(&r)
    );

    let r = post(
        base,
        "/v1/chat/completions",
        &ask(
            "What is 7 times 6?",
            json!({"structured_outputs": {"regex": "[0-9]{1,3}"}}),
        ),
    )
    .await;
    assert!(
        content(&r).chars().all(|c| c.is_ascii_digit()),
        "{}",
        content(&r)
    );

    let lark = "start: \"Fruit: \" NAME \".\"\nNAME: /[A-Z][a-z]{2,12}/\n";
    let r = post(
        base,
        "/v1/chat/completions",
        &ask(q, json!({"structured_outputs": {"grammar": lark}})),
    )
    .await;
    let text = content(&r);
    assert!(text.starts_with("Fruit: ") && text.ends_with('.'), "{text}");

    let r = post(
        base,
        "/v1/chat/completions",
        &ask(q, json!({"guided_choice": ["red", "green"]})),
    )
    .await;
    assert!(["red", "green"].contains(&content(&r)));

    // llama.cpp's fields, on the completions endpoint too.
    let gbnf = "root ::= \"Answer: \" (\"yes\" | \"no\")\n";
    let r = post(
        base,
        "/v1/completions",
        &json!({"prompt": "Is water wet?", "max_tokens": 10, "temperature": 0, "grammar": gbnf}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let text = r.json["choices"][0]["text"].as_str().unwrap();
    assert!(text == "Answer: yes" || text == "Answer: no", "{text}");
    assert_eq!(r.json["choices"][0]["finish_reason"], "stop");

    let r = post(base, "/v1/completions", &json!({"prompt": "A person:", "max_tokens": 120, "temperature": 0, "json_schema": person_schema()})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    check_person(r.json["choices"][0]["text"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_choices_all_match() {
    let base = server();
    let mut body = ask(
        "Describe a software engineer as JSON.",
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person_schema()}}, "n": 3, "temperature": 1.0, "seed": 11}),
    );
    body["max_tokens"] = json!(160);
    let r = post(base, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for c in r.json["choices"].as_array().unwrap() {
        check_person(c["message"]["content"].as_str().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraints_that_cannot_be_enforced_are_400s_naming_the_field() {
    let base = server();
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}),
            "response_format",
            "strin",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
            "required",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
            "xml",
        ),
        (
            json!({"structured_outputs": {"regex": "a(b"}}),
            "structured_outputs.regex",
            "regex",
        ),
        (
            json!({"structured_outputs": {"choice": []}}),
            "structured_outputs.choice",
            "no choices",
        ),
        (
            json!({"structured_outputs": {"choice": "a"}}),
            "structured_outputs.choice",
            "array",
        ),
        (
            json!({"grammar": "root ::= \"a\" | b"}),
            "grammar",
            "`b`, which is not defined",
        ),
        (
            json!({"grammar": "root ::= [a-"}),
            "grammar",
            "line 1 column 10",
        ),
        (
            json!({"json_schema": "{not json"}),
            "json_schema",
            "not JSON",
        ),
        (
            json!({"json_schema": {"$ref": "http://example.com/x.json"}}),
            "json_schema",
            "example.com",
        ),
        (
            json!({"json_schema": {"type": "object"}, "grammar": "root ::= \"a\""}),
            "grammar",
            "both constrain",
        ),
    ];
    for (extra, param, message) in cases {
        let r = post(base, "/v1/chat/completions", &ask("Hi", extra.clone())).await;
        assert_eq!(r.status, 400, "{extra}: {}", r.text);
        r.assert_error_shape();
        assert_eq!(r.error_param(), Some(param), "{extra}: {}", r.text);
        assert!(r.error_message().contains(message), "{extra}: {}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiling_is_bounded_in_time() {
    let base = start(ServerOptions {
        constraint_limits: rill_constrain::CompileLimits {
            timeout: Duration::ZERO,
            ..Default::default()
        },
        ..ServerOptions::default()
    });
    let r = post(
        &base,
        "/v1/chat/completions",
        &ask("Hi", json!({"json_schema": person_schema()})),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.json["error"]["code"], "constraint_timeout", "{}", r.text);
    // Unconstrained requests are unaffected.
    let r = post(
        &base,
        "/v1/chat/completions",
        &ask("Hi", json!({"max_tokens": 4})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

fn weather() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    }})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_whole_and_streamed_agree() {
    let base = server();
    for choice in [json!("auto"), json!("required")] {
        let body = ask(
            "What is the weather in Paris?",
            json!({"tools": [weather()], "tool_choice": choice}),
        );
        let r = post(base, "/v1/chat/completions", &body).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let c = &r.json["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{}", r.text);
        assert!(c["message"]["content"].is_null());
        let call = &c["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather");
        let args = call["function"]["arguments"].as_str().unwrap();
        let parsed: Value = serde_json::from_str(args).unwrap();
        assert!(parsed["city"].is_string(), "{args}");
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        let s = stream(base, "/v1/chat/completions", &streamed).await;
        let mut name = String::new();
        let mut arguments = String::new();
        let mut ids = 0;
        for chunk in s.chunks() {
            for call in chunk["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                ids += usize::from(call["id"].is_string());
                name.push_str(call["function"]["name"].as_str().unwrap_or(""));
                arguments.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        assert_eq!(
            (name.as_str(), arguments.as_str(), ids),
            ("get_weather", args, 1)
        );
        assert_eq!(s.finish_reason(0).as_deref(), Some("tool_calls"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tools_are_400s_naming_the_field() {
    let base = server();
    let cases = [
        (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [weather(), weather()]}),
            "tools[1].function.name",
        ),
        (
            json!({"tools": [weather()], "tool_choice": "always"}),
            "tool_choice",
        ),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "x"}}}),
            "tool_choice.function.name",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"functions": [{"name": "f"}]}), "functions"),
        (
            json!({"tools": [weather()], "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}], "tool_choice": "required"}),
            "tools",
        ),
    ];
    for (extra, param) in cases {
        let r = post(base, "/v1/chat/completions", &ask("Hi", extra.clone())).await;
        assert_eq!(r.status, 400, "{extra}: {}", r.text);
        r.assert_error_shape();
        assert_eq!(r.error_param(), Some(param), "{extra}: {}", r.text);
    }
}
