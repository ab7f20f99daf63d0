//! Bad input gets a 400 naming the field, in OpenAI's error shape, and changes nothing.

use super::*;

/// Every kind of bad input gets a 4xx with an OpenAI-shaped error naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_400_naming_the_field() {
    let s = TestServer::tiny().await;
    let chat = |extra: Value| {
        let mut b = json!({ "messages": user("hi"), "max_tokens": 4 });
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let cmpl = |extra: Value| {
        let mut b = json!({ "prompt": "hi", "max_tokens": 4 });
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let long_stop = "x".repeat(2000);
    let many_stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    // (endpoint, body, status, param)
    let cases: Vec<(&str, Value, u16, Option<&str>)> = vec![
        (
            "/v1/chat/completions",
            chat(json!({"temperature": -0.1})),
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"temperature": 2.5})),
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"temperature": "hot"})),
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"temperature": true})),
            400,
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_p": 0})),
            400,
            Some("top_p"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_p": 1.5})),
            400,
            Some("top_p"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"n": 0})),
            400,
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"n": 65})),
            400,
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"n": 1.5})),
            400,
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"n": "2"})),
            400,
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 0})),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": -1})),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": "10"})),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_completion_tokens": 0})),
            400,
            Some("max_completion_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"seed": "abc"})),
            400,
            Some("seed"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"seed": 1.5})),
            400,
            Some("seed"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stop": 5})),
            400,
            Some("stop"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stop": [1]})),
            400,
            Some("stop[0]"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stop": [""]})),
            400,
            Some("stop"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stop": long_stop})),
            400,
            Some("stop"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stop": many_stops})),
            400,
            Some("stop"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"presence_penalty": 3})),
            400,
            Some("presence_penalty"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"frequency_penalty": -2.5})),
            400,
            Some("frequency_penalty"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": []})),
            400,
            Some("logit_bias"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"x": 1}})),
            400,
            Some("logit_bias"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"99999": 1}})),
            400,
            Some("logit_bias"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"1": 101}})),
            400,
            Some("logit_bias"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"1": "a"}})),
            400,
            Some("logit_bias"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": "yes"})),
            400,
            Some("logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": 3})),
            400,
            Some("logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 21})),
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": -1})),
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": 3})),
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_k": -2})),
            400,
            Some("top_k"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_k": "a"})),
            400,
            Some("top_k"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"min_p": 1.5})),
            400,
            Some("min_p"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"typical_p": 0})),
            400,
            Some("typical_p"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"repetition_penalty": 0})),
            400,
            Some("repetition_penalty"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"repetition_penalty": -1})),
            400,
            Some("repetition_penalty"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"repeat_last_n": -2})),
            400,
            Some("repeat_last_n"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"min_tokens": -1})),
            400,
            Some("min_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"min_tokens": 10})),
            400,
            Some("min_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"ignore_eos": "yes"})),
            400,
            Some("ignore_eos"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stop_token_ids": [999999]})),
            400,
            Some("stop_token_ids"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"user": 5})),
            400,
            Some("user"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stream": "true"})),
            400,
            Some("stream"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stream_options": {"include_usage": true}})),
            400,
            Some("stream_options"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stream": true, "stream_options": {"include_usage": "x"}})),
            400,
            Some("stream_options.include_usage"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stream": true, "stream_options": 3})),
            400,
            Some("stream_options"),
        ),
        (
            "/v1/chat/completions",
            json!({"max_tokens": 4}),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": []})),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": "hi"})),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [5]})),
            400,
            Some("messages[0]"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user"}]})),
            400,
            Some("messages[0].content"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"content": "x"}]})),
            400,
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "robot", "content": "x"}]})),
            400,
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": 5}]})),
            400,
            Some("messages[0].content"),
        ),
        (
            "/v1/chat/completions",
            chat(
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            ),
            400,
            Some("messages[0].content[0].type"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]})),
            400,
            Some("messages[0].content[0].text"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"model": 5})),
            400,
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"model": "gpt-4o"})),
            404,
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tools": [{"type": "function", "function": {"description": "f"}}]})),
            400,
            Some("tools[0].function.name"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"tool_choice": "required"})),
            400,
            Some("tool_choice"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "xml"}})),
            400,
            Some("response_format.type"),
        ),
        (
            "/v1/completions",
            json!({"max_tokens": 4}),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": 5})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": ""})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": []})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": ["a", ""]})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": ["a", 1]})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": [1, "a"]})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": [[1], [999999]]})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": [[]]})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": {"a": 1}})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": [null]})),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"logprobs": 21})),
            400,
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"logprobs": true})),
            400,
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"echo": "x"})),
            400,
            Some("echo"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"echo": true, "logprobs": 1})),
            400,
            Some("echo"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"best_of": 3})),
            400,
            Some("best_of"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"suffix": "x"})),
            400,
            Some("suffix"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"prompt": vec!["a"; 40], "n": 2})),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            cmpl(json!({"max_tokens": 4_294_967_296u64})),
            400,
            Some("max_tokens"),
        ),
        ("/tokenize", json!({}), 400, Some("prompt")),
        ("/tokenize", json!({"prompt": 5}), 400, Some("prompt")),
        (
            "/tokenize",
            json!({"prompt": "a", "add_special": 1}),
            400,
            Some("add_special"),
        ),
        ("/tokenize", json!({"messages": "x"}), 400, Some("messages")),
        (
            "/tokenize",
            json!({"messages": user("x"), "prompt": "x"}),
            400,
            Some("prompt"),
        ),
        ("/detokenize", json!({}), 400, Some("tokens")),
        ("/detokenize", json!({"tokens": "x"}), 400, Some("tokens")),
        ("/detokenize", json!({"tokens": [1.5]}), 400, Some("tokens")),
        (
            "/detokenize",
            json!({"tokens": [999999]}),
            400,
            Some("tokens"),
        ),
        ("/detokenize", json!({"tokens": [-1]}), 400, Some("tokens")),
    ];
    for (path, body, status, param) in &cases {
        let r = post(&s.base, path, body).await;
        assert_eq!(r.status, *status, "{path} {body}: {}", r.text);
        r.assert_error_shape();
        assert_eq!(r.error_param(), *param, "{path} {body}: {}", r.text);
        if *status == 400 {
            assert_eq!(r.json["error"]["type"], "invalid_request_error");
        }
    }

    // Range errors say what is allowed.
    let r = post(
        &s.base,
        "/v1/chat/completions",
        &chat(json!({"temperature": 9})),
    )
    .await;
    assert!(r.error_message().contains("[0, 2]"), "{}", r.text);
    let r = post(&s.base, "/v1/chat/completions", &chat(json!({"n": 99}))).await;
    assert!(r.error_message().contains("[1, 64]"), "{}", r.text);

    // Bodies that are not JSON objects.
    let mut raw: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"   ".to_vec(),
        b"{".to_vec(),
        b"[]".to_vec(),
        b"null".to_vec(),
        b"\"text\"".to_vec(),
        b"{\"messages\": [}".to_vec(),
        b"{} trailing".to_vec(),
        b"{\"prompt\": \"\xff\xfe\"}".to_vec(),
        b"{\"prompt\": \"\\x41\"}".to_vec(),
        b"{\"prompt\": \"\\ud800\"}".to_vec(),
        b"{\"prompt\": \"\\u12\"}".to_vec(),
        b"{\"prompt\": \"a\", \"max_tokens\": 1e999}".to_vec(),
        b"{\"prompt\": \"a\", \"temperature\": NaN}".to_vec(),
        b"{\"prompt\": 'a'}".to_vec(),
    ];
    let mut deep = b"{\"prompt\": ".to_vec();
    deep.extend(std::iter::repeat_n(b'[', 500));
    deep.extend(std::iter::repeat_n(b']', 500));
    deep.push(b'}');
    raw.push(deep);
    for path in [
        "/v1/completions",
        "/v1/chat/completions",
        "/tokenize",
        "/detokenize",
    ] {
        for body in &raw {
            let r = post_raw(&s.base, path, body.clone()).await;
            assert_eq!(
                r.status,
                400,
                "{path} {:?}: {}",
                String::from_utf8_lossy(body),
                r.text
            );
            r.assert_error_shape();
            assert_eq!(r.json["error"]["code"], "invalid_json");
        }
    }
    // Without a content type, or with another one, JSON is still read.
    let r = send(
        client()
            .post(s.url("/v1/completions"))
            .header("content-type", "text/plain")
            .body(r#"{"prompt": "a", "max_tokens": 1}"#),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);

    // Unknown routes and methods.
    let r = get(&s.base, "/v2/nothing").await;
    assert_eq!(r.status, 404);
    r.assert_error_shape();
    let r = get(&s.base, "/v1/chat/completions").await;
    assert_eq!(r.status, 405);
    r.assert_error_shape();
    let r = post(&s.base, "/health", &json!({})).await;
    assert_eq!(r.status, 405);
    r.assert_error_shape();

    // After all that, the server still serves.
    let m = get(&s.base, "/metrics").await.text;
    assert!(!m.contains("status=\"500\""), "{m}");
    let r = post(&s.base, "/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(r.status, 200, "{}", r.text);
}
