//! Lenient fields, the API key, prompts that cannot fit, the body limit, shutdown, batch invariance over HTTP and the metrics.

use super::*;

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
