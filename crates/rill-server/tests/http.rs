//! The HTTP server over real loopback connections, on synthetic models: response and chunk
//! formats, streaming, concurrency, cancellation on disconnect, backpressure, validation of every
//! field, authentication, body limits and graceful shutdown.

mod common;

use common::*;
use rill_engine::serve::ServeConfig;
use rill_server::ServerOptions;
use serde_json::{json, Value};

fn user(text: &str) -> Value {
    json!([{ "role": "user", "content": text }])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_models_tokenize_and_detokenize() {
    let s = TestServer::tiny().await;
    let h = get(&s.base, "/health").await;
    assert_eq!(h.status, 200, "{}", h.text);
    assert_eq!(h.json["status"], "ok");
    assert!(h.json["kv_cache"]["blocks_total"].as_u64().unwrap() > 0);

    let m = get(&s.base, "/v1/models").await;
    assert_eq!(m.status, 200);
    assert_eq!(m.json["object"], "list");
    assert_eq!(m.json["data"][0]["id"], "tiny");
    assert_eq!(m.json["data"][0]["object"], "model");
    assert_eq!(get(&s.base, "/v1/models/tiny").await.json["id"], "tiny");
    let missing = get(&s.base, "/v1/models/other").await;
    assert_eq!(missing.status, 404);
    missing.assert_error_shape();

    let t = post(&s.base, "/tokenize", &json!({ "prompt": "hello" })).await;
    assert_eq!(t.status, 200, "{}", t.text);
    let tokens: Vec<u64> = t.json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    // Byte tokens: one per byte, no BOS for this vocabulary.
    assert_eq!(
        tokens,
        b"hello".iter().map(|&b| u64::from(b)).collect::<Vec<_>>()
    );
    assert_eq!(t.json["count"], 5);
    let d = post(&s.base, "/detokenize", &json!({ "tokens": tokens })).await;
    assert_eq!(d.status, 200);
    assert_eq!(d.json["prompt"], "hello");

    // Messages go through the chat template, as the chat endpoint does.
    let chat = post(&s.base, "/tokenize", &json!({ "messages": user("hi") })).await;
    assert_eq!(chat.status, 200, "{}", chat.text);
    let ids: Vec<u32> = chat.json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let text = s.handle.tokenizer().decode_with(&ids, true);
    assert!(text.contains("<|im_start|>user\nhi<|im_end|>"), "{text}");
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");

    // Usage of a chat request counts exactly those tokens.
    let r = post(
        &s.base,
        "/v1/chat/completions",
        &json!({ "messages": user("hi"), "max_tokens": 3, "ignore_eos": true }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["usage"]["prompt_tokens"], ids.len());
    assert_eq!(r.json["usage"]["completion_tokens"], 3);
    assert_eq!(r.json["usage"]["total_tokens"], ids.len() + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_whole_and_streamed_agree() {
    let s = TestServer::tiny().await;
    let body = json!({
        "model": "tiny",
        "messages": [
            { "role": "system", "content": "be brief" },
            { "role": "user", "content": [{ "type": "text", "text": "tell" }, { "type": "text", "text": "me" }] },
        ],
        "max_completion_tokens": 12,
        "temperature": 0.9,
        "seed": 7,
        "ignore_eos": true,
        "logprobs": true,
        "top_logprobs": 3,
        "n": 2,
    });
    let whole = post(&s.base, "/v1/chat/completions", &body).await;
    assert_eq!(whole.status, 200, "{}", whole.text);
    let j = &whole.json;
    assert_eq!(j["object"], "chat.completion");
    assert!(j["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(j["model"], "tiny");
    assert!(j["created"].as_u64().unwrap() > 1_600_000_000);
    let choices = j["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["role"], "assistant");
        assert_eq!(c["finish_reason"], "length");
        let content = c["logprobs"]["content"].as_array().unwrap();
        assert_eq!(content.len(), 12);
        for e in content {
            let lp = e["logprob"].as_f64().unwrap();
            assert!(lp <= 0.0);
            assert!(e["bytes"].is_array());
            let top = e["top_logprobs"].as_array().unwrap();
            assert_eq!(top.len(), 3);
            assert!(top
                .windows(2)
                .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
            // The processed distribution (temperature 0.9) is reported beside the raw one.
            assert!(e["processed_logprob"].as_f64().unwrap() <= 0.0);
            assert!(e["processed_top_logprobs"].is_array());
            assert!(e["raw_entropy"].as_f64().unwrap() >= 0.0);
        }
    }
    assert_eq!(j["usage"]["completion_tokens"], 24);
    // Choices are seeded seed + index: they differ.
    assert_ne!(choices[0]["logprobs"], choices[1]["logprobs"]);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({ "include_usage": true });
    let st = stream(&s.base, "/v1/chat/completions", &sbody).await;
    assert_eq!(st.status, 200);
    assert!(st.ended_with_done());
    let first: Vec<&Value> = st.chunks().take(2).collect();
    for (i, c) in first.iter().enumerate() {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["choices"][0]["index"], i);
        assert_eq!(c["choices"][0]["delta"]["role"], "assistant");
        assert!(c["usage"].is_null());
    }
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(st.text(i), choice["message"]["content"].as_str().unwrap());
        assert_eq!(st.finish_reason(i).as_deref(), Some("length"));
        let streamed_lp: Vec<Value> = st
            .chunks()
            .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
            .filter(|c| c["index"] == i && c["logprobs"].is_object())
            .flat_map(|c| c["logprobs"]["content"].as_array().cloned().unwrap())
            .collect();
        assert_eq!(
            streamed_lp,
            *choice["logprobs"]["content"].as_array().unwrap()
        );
    }
    // The usage chunk comes last, with no choices.
    let last = st.chunks().last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 24);
    assert_eq!(st.usage().unwrap()["completion_tokens"], 24);

    // Without include_usage no chunk has a usage field.
    let mut plain = body.clone();
    plain["stream"] = json!(true);
    let st = stream(&s.base, "/v1/chat/completions", &plain).await;
    assert!(st.chunks().all(|c| c.get("usage").is_none()));
    assert!(st.ended_with_done());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_formats() {
    let s = TestServer::tiny().await;
    // Several prompts, text and token ids, with n = 2 each: choices prompt-major.
    let r = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": ["ab", "cd"], "n": 2, "max_tokens": 5, "temperature": 0,
                 "ignore_eos": true, "logprobs": 2 }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["object"], "text_completion");
    assert!(r.json["id"].as_str().unwrap().starts_with("cmpl-"));
    let choices = r.json["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    // Greedy: both choices of a prompt agree.
    assert_eq!(choices[0]["text"], choices[1]["text"]);
    assert_eq!(choices[2]["text"], choices[3]["text"]);
    assert_eq!(r.json["usage"]["prompt_tokens"], 4);
    assert_eq!(r.json["usage"]["completion_tokens"], 20);
    let lp = &choices[0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    assert_eq!(lp["text_offset"][0], 0);
    let top = lp["top_logprobs"].as_array().unwrap();
    assert!(top.iter().all(|d| d.as_object().unwrap().len() <= 2));
    // Greedy picks the most likely raw token: its log-probability is the top one.
    for (t, d) in lp["token_logprobs"].as_array().unwrap().iter().zip(top) {
        let best = d
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((t.as_f64().unwrap() - best).abs() < 1e-6);
    }

    // A token-id prompt is the same as its text.
    let ids: Vec<u32> = b"ab".iter().map(|&b| u32::from(b)).collect();
    let t = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": ids, "max_tokens": 5, "temperature": 0, "ignore_eos": true }),
    )
    .await;
    assert_eq!(t.json["choices"][0]["text"], choices[0]["text"]);
    // Default max_tokens is 16.
    let d = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "ab", "temperature": 0, "ignore_eos": true }),
    )
    .await;
    assert_eq!(d.json["usage"]["completion_tokens"], 16);

    // Echo puts the prompt first, whole and streamed.
    let e = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "ab", "max_tokens": 5, "temperature": 0, "ignore_eos": true, "echo": true }),
    )
    .await;
    let expected = format!("ab{}", choices[0]["text"].as_str().unwrap());
    assert_eq!(e.json["choices"][0]["text"], expected);
    let st = stream(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "ab", "max_tokens": 5, "temperature": 0, "ignore_eos": true,
                 "echo": true, "stream": true }),
    )
    .await;
    assert!(st.ended_with_done());
    assert_eq!(st.text(0), expected);
    assert_eq!(st.finish_reason(0).as_deref(), Some("length"));
    assert!(st.chunks().all(|c| c["object"] == "text_completion"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_cut_the_text() {
    let s = TestServer::tiny().await;
    let base = json!({ "prompt": "hello", "max_tokens": 40, "temperature": 0, "ignore_eos": true });
    let full = post(&s.base, "/v1/completions", &base).await;
    let text = full.json["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() > 12, "{text:?}");
    let stop: String = chars[8..10].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    for streamed in [false, true] {
        let mut body = base.clone();
        body["stop"] = json!(stop);
        body["stream"] = json!(streamed);
        if streamed {
            let st = stream(&s.base, "/v1/completions", &body).await;
            assert_eq!(st.text(0), cut);
            assert_eq!(st.finish_reason(0).as_deref(), Some("stop"));
            let last = st
                .chunks()
                .flat_map(|c| c["choices"].as_array().cloned().unwrap())
                .last()
                .unwrap();
            assert_eq!(last["stop_reason"], json!(stop));
        } else {
            let r = post(&s.base, "/v1/completions", &body).await;
            assert_eq!(r.json["choices"][0]["text"], cut);
            assert_eq!(r.json["choices"][0]["finish_reason"], "stop");
            assert_eq!(r.json["choices"][0]["stop_reason"], json!(stop));
        }
    }
    // A list of stop strings, the first to complete wins.
    let mut body = base.clone();
    body["stop"] = json!(["\u{10ffff}never", stop]);
    let r = post(&s.base, "/v1/completions", &body).await;
    assert_eq!(r.json["choices"][0]["text"], cut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streaming_clients_all_complete() {
    let s = TestServer::tiny().await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let base = s.base.clone();
        tasks.push(tokio::spawn(async move {
            let body = json!({
                "messages": user(&format!("client {i}")),
                "max_tokens": 20 + i,
                "min_tokens": 20 + i,
                "ignore_eos": true,
                "seed": i,
                "stream": true,
                "stream_options": { "include_usage": true },
            });
            (i, stream(&base, "/v1/chat/completions", &body).await)
        }));
    }
    for t in tasks {
        let (i, st) = t.await.unwrap();
        assert_eq!(st.status, 200);
        assert!(st.ended_with_done(), "client {i}");
        assert_eq!(st.finish_reason(0).as_deref(), Some("length"));
        assert_eq!(st.usage().unwrap()["completion_tokens"], 20 + i);
    }
    wait_all_blocks_free(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_stream_cancels_and_frees_every_block() {
    let s = TestServer::start(slow(), slow_config(), ServerOptions::default()).await;
    let body = json!({ "messages": user("go"), "max_tokens": 3000, "ignore_eos": true,
                       "stream": true, "n": 2 });
    let request = http_post("/v1/chat/completions", body.to_string().as_bytes());
    // Two opening chunks (one per choice), then tokens.
    let (conn, got) = raw_request(&s.base, &request, events(6)).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    // Held between two steps: the request is still running whatever the machine's speed.
    s.handle.pause().unwrap();
    s.handle.next_step().unwrap().await.unwrap();
    let h = get(&s.base, "/health").await;
    assert!(
        h.json["kv_cache"]["blocks_used"].as_u64().unwrap() > 0,
        "{}",
        h.text
    );
    // The server notices the closed connection when it next writes a token to it.
    s.handle.resume().unwrap();
    drop(conn);
    wait_all_blocks_free(&s).await;

    // A whole (non-streamed) request whose client leaves is cancelled too.
    let whole = json!({ "prompt": "go", "max_tokens": 3000, "ignore_eos": true });
    let request = http_post("/v1/completions", whole.to_string().as_bytes());
    let (conn, _) = raw_request(&s.base, &request, |_| true).await;
    until_engine(&s, "the whole request running", |m| {
        metric(m, "rill_requests_running") == Some(1.0)
    })
    .await;
    drop(conn);
    wait_all_blocks_free(&s).await;

    let m = get(&s.base, "/metrics").await.text;
    // Both choices of the stream and the whole request: cancelled, not run to the end.
    assert!(
        m.contains("rill_requests_finished_total{finish_reason=\"cancelled\"} 3"),
        "{m}"
    );
    assert_eq!(metric(&m, "rill_http_client_disconnects_total"), Some(2.0));
    assert_eq!(metric(&m, "rill_http_streams_active"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_overflow_gets_429_with_retry_after() {
    let config = ServeConfig {
        max_running: 1,
        max_queue: 1,
        ..slow_config()
    };
    let s = TestServer::start(slow(), config, ServerOptions::default()).await;
    let body = json!({ "prompt": "go", "max_tokens": 400, "ignore_eos": true, "stream": true });
    // One running, one waiting: the queue is full.
    let request = http_post("/v1/completions", body.to_string().as_bytes());
    let (running, _) = raw_request(&s.base, &request, events(2)).await;
    // Held between two steps: the first cannot finish and make room, however fast it runs.
    s.handle.pause().unwrap();
    let (waiting, got) = raw_request(&s.base, &request, |t| t.contains("\r\n\r\n")).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert_eq!(s.handle.queued(), 1);
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let body = json!({ "prompt": "x", "messages": user("x"), "max_tokens": 2 });
        let r = post(&s.base, path, &body).await;
        assert_eq!(r.status, 429, "{}", r.text);
        r.assert_error_shape();
        assert_eq!(r.json["error"]["code"], "rate_limit_exceeded");
        let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(retry >= 1);
    }
    let m = get(&s.base, "/metrics").await.text;
    assert!(
        m.contains("rill_http_responses_total{route=\"/v1/completions\",status=\"429\"} 1"),
        "{m}"
    );
    s.handle.resume().unwrap();
    drop(running);
    drop(waiting);
    wait_all_blocks_free(&s).await;
    // Room again.
    let r = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "x", "max_tokens": 2 }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_ignored_and_nulls_are_defaults() {
    let s = TestServer::tiny().await;
    let body = json!({
        "messages": [{ "role": "developer", "content": "x", "name": "dev" },
                     { "role": "user", "content": "hi", "some_future_field": [1, 2] },
                     { "role": "assistant", "content": null },
                     { "role": "user", "content": "again" }],
        "max_tokens": 3,
        "frobnicate": { "deep": [1, 2, 3] },
        "metadata": { "k": "v" },
        "store": false,
        "parallel_tool_calls": true,
        "temperature": null,
        "top_p": null,
        "stop": null,
        "n": null,
        "seed": null,
        "user": "someone",
        "tools": [],
        "tool_choice": "none",
        "response_format": { "type": "text" },
        "model": "tiny",
        "min_p": 0.05,
        "top_k": 40,
        "repetition_penalty": 1.1,
        "repeat_last_n": -1,
        "typical_p": 0.9,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "logit_bias": { "65": -100, "66": 5.5 },
        "stop_token_ids": [0],
        "min_tokens": 1,
    });
    let r = post(&s.base, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Negative and huge seeds are integers too.
    for seed in [json!(-5), json!(u64::MAX)] {
        let r = post(
            &s.base,
            "/v1/completions",
            &json!({ "prompt": "a", "max_tokens": 2, "seed": seed, "suffix": "", "best_of": 1 }),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_api_key_gets_401() {
    let options = ServerOptions {
        api_key: Some("sekrit".into()),
        ..ServerOptions::default()
    };
    let s = TestServer::start(tiny(), small_config(), options).await;
    let body = json!({ "prompt": "a", "max_tokens": 2 });
    for (path, get_req) in [
        ("/v1/completions", false),
        ("/v1/chat/completions", false),
        ("/v1/models", true),
        ("/tokenize", false),
        ("/detokenize", false),
        ("/metrics", true),
    ] {
        for auth in [
            None,
            Some("Bearer wrong"),
            Some("Bearer sekri"),
            Some("sekrit"),
            Some("Basic sekrit"),
        ] {
            let mut r = if get_req {
                client().get(s.url(path))
            } else {
                client().post(s.url(path)).body(body.to_string())
            };
            if let Some(a) = auth {
                r = r.header("authorization", a);
            }
            let r = send(r).await;
            assert_eq!(r.status, 401, "{path} {auth:?}: {}", r.text);
            r.assert_error_shape();
            assert_eq!(r.json["error"]["code"], "invalid_api_key");
        }
    }
    let r = send(
        client()
            .post(s.url("/v1/completions"))
            .header("authorization", "Bearer sekrit")
            .body(body.to_string()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = send(client().get(s.url("/metrics")).bearer_auth("sekrit")).await;
    assert_eq!(r.status, 200);
    // Health needs no key.
    assert_eq!(get(&s.base, "/health").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_that_cannot_fit_names_both_numbers() {
    let s = TestServer::tiny().await;
    let prompt: Vec<u32> = (0..250).map(|i| 97 + i % 26).collect();
    let r = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": prompt, "max_tokens": 10 }),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text);
    r.assert_error_shape();
    assert_eq!(
        r.json["error"]["code"], "context_length_exceeded",
        "{}",
        r.text
    );
    let msg = r.error_message();
    for n in ["256", "250", "10", "260"] {
        assert!(msg.contains(n), "{msg}");
    }
    // It fits with fewer tokens.
    let r = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": prompt, "max_tokens": 6, "ignore_eos": true }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // A huge text prompt, and a chat whose default max_tokens leaves no room.
    let big = "abcdefgh ".repeat(50_000);
    let r = post(&s.base, "/v1/completions", &json!({ "prompt": big })).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.json["error"]["code"], "context_length_exceeded");
    let r = post(
        &s.base,
        "/v1/chat/completions",
        &json!({ "messages": user(&big) }),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.json["error"]["param"], "messages");
    // Chat's default max_tokens is what the context leaves.
    let r = post(
        &s.base,
        "/v1/chat/completions",
        &json!({ "messages": user("hi"), "ignore_eos": true }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let u = &r.json["usage"];
    assert_eq!(u["total_tokens"], 256, "{u}");
    assert_eq!(r.json["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_over_the_limit_gets_413() {
    let options = ServerOptions {
        max_body_bytes: 1000,
        ..ServerOptions::default()
    };
    let s = TestServer::start(tiny(), small_config(), options).await;
    let r = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "a".repeat(2000) }),
    )
    .await;
    assert_eq!(r.status, 413, "{}", r.text);
    r.assert_error_shape();
    assert_eq!(r.json["error"]["code"], "request_too_large");
    // Chunked, with no content length.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..20).map(|_| Ok(vec![b' '; 100])).collect();
    let r = send(
        client()
            .post(s.url("/v1/completions"))
            .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks))),
    )
    .await;
    assert_eq!(r.status, 413, "{}", r.text);
    let r = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "a", "max_tokens": 1 }),
    )
    .await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_running_streams_with_a_final_event() {
    // No drain: running requests end at once.
    let options = ServerOptions {
        shutdown_timeout: std::time::Duration::ZERO,
        ..ServerOptions::default()
    };
    let mut s = TestServer::start(slow(), slow_config(), options).await;
    let body = json!({ "messages": user("go"), "max_tokens": 3000, "ignore_eos": true,
                       "stream": true, "stream_options": { "include_usage": true } });
    let request = http_post("/v1/chat/completions", body.to_string().as_bytes());
    let (mut conn, mut got) = raw_request(&s.base, &request, events(3)).await;
    // Held between two steps: still running when the shutdown comes, however fast it runs.
    s.handle.pause().unwrap();
    s.shutdown().await;
    // The rest of the stream: a final chunk, usage and [DONE].
    use tokio::io::AsyncReadExt;
    let mut rest = Vec::new();
    tokio::time::timeout(HANG_GUARD, conn.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    got.push_str(&String::from_utf8_lossy(&rest));
    let st = Streamed {
        status: 200,
        events: parse_sse(&dechunk(&got)),
    };
    assert!(st.ended_with_done(), "{got}");
    assert_eq!(st.finish_reason(0).as_deref(), Some("cancelled"));
    assert!(st.usage().is_some());
    // Nothing listens any more.
    assert!(reqwest::get(s.url("/health")).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_during_shutdown_get_503() {
    let s = TestServer::tiny().await;
    s.server.begin_shutdown();
    let r = post(&s.base, "/v1/completions", &json!({ "prompt": "a" })).await;
    assert_eq!(r.status, 503, "{}", r.text);
    r.assert_error_shape();
    let h = get(&s.base, "/health").await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json["status"], "shutting_down");
    assert_eq!(get(&s.base, "/ready").await.status, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_request_is_the_same_alone_or_with_15_others() {
    let s = TestServer::tiny().await;
    let request = |seed: u64, text: &str| {
        json!({ "messages": user(text), "max_tokens": 40, "ignore_eos": true,
                "temperature": 1.0, "top_p": 0.95, "seed": seed, "logprobs": true })
    };
    let tokens = |r: &Reply| -> Vec<Value> {
        r.json["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["bytes"].clone())
            .collect()
    };
    let alone = post(&s.base, "/v1/chat/completions", &request(1234, "the same")).await;
    assert_eq!(alone.status, 200);
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let base = s.base.clone();
        let body = if i == 7 {
            request(1234, "the same")
        } else {
            request(i, &format!("another prompt {i}"))
        };
        tasks.push(tokio::spawn(async move {
            post(&base, "/v1/chat/completions", &body).await
        }));
    }
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    assert_eq!(tokens(&replies[7]), tokens(&alone));
    assert_eq!(
        replies[7].json["choices"][0]["message"],
        alone.json["choices"][0]["message"]
    );
    // A different seed gives different tokens.
    assert_ne!(tokens(&replies[3]), tokens(&alone));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_prometheus_text() {
    let s = TestServer::tiny().await;
    post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "a", "max_tokens": 2 }),
    )
    .await;
    post(&s.base, "/v1/completions", &json!({ "prompt": 5 })).await;
    let r = get(&s.base, "/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    for line in r
        .text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (name, value) = line.rsplit_once(' ').unwrap();
        assert!(name.starts_with("rill_"), "{line}");
        assert!(value.parse::<f64>().is_ok(), "{line}");
    }
    assert!(r
        .text
        .contains("rill_http_responses_total{route=\"/v1/completions\",status=\"200\"} 1"));
    assert!(r
        .text
        .contains("rill_http_responses_total{route=\"/v1/completions\",status=\"400\"} 1"));
    assert!(metric(&r.text, "rill_kv_blocks_total").unwrap() > 0.0);
}
