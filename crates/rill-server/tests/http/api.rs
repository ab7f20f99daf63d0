//! Health, models, tokenize, chat and completions whole and streamed, stop strings, concurrent clients, disconnects and the queue.

use super::*;

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

/// One log line per request, written when its body is done: method, path, status, client and
/// time, and for generations the model, tokens, time to first token and finish reasons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_gets_one_log_line() {
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let options = ServerOptions {
        request_log: Some(rill_server::RequestLog {
            format: rill_server::RequestLogFormat::Json,
            sink: std::sync::Arc::new(move |line| sink.lock().unwrap().push(line)),
        }),
        ..ServerOptions::default()
    };
    let mut s = TestServer::start(tiny(), small_config(), options).await;
    let c = client();
    let body = json!({ "messages": user("hi"), "max_tokens": 3, "ignore_eos": true });
    let r = c
        .post(s.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = c
        .post(s.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(streamed.to_string())
        .send()
        .await
        .unwrap();
    r.text().await.unwrap();
    let r = c.get(s.url("/v1/nothing")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // The server stops after every connection is done: every line is written by then.
    s.shutdown().await;
    let lines = lines.lock().unwrap().clone();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for (v, (method, path, status)) in parsed.iter().zip([
        ("POST", "/v1/chat/completions", 200),
        ("POST", "/v1/chat/completions", 200),
        ("GET", "/v1/nothing", 404),
    ]) {
        assert_eq!(v["method"], method, "{v}");
        assert_eq!(v["path"], path, "{v}");
        assert_eq!(v["status"], status, "{v}");
        assert!(
            v["client"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{v}"
        );
        assert!(v["seconds"].as_f64().unwrap() >= 0.0, "{v}");
    }
    for v in &parsed[..2] {
        assert_eq!(v["output_tokens"], 3, "{v}");
        assert!(v["prompt_tokens"].as_u64().unwrap() > 0, "{v}");
        assert!(v["ttft_seconds"].as_f64().is_some(), "{v}");
        assert_eq!(v["finish"], json!(["length"]), "{v}");
        assert!(v["model"].is_string(), "{v}");
    }
    assert!(parsed[2].get("model").is_none(), "{}", parsed[2]);
}
