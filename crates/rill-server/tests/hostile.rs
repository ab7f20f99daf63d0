//! Hostile requests over loopback, each a known way to take a server down: a body of a gigabyte,
//! a prompt of a million tokens, JSON nested a hundred thousand deep, invalid UTF-8 and lone
//! surrogates in every string field, thousands of idle and half-sent connections. Each gets a
//! clear 4xx (or is ignored) and the server keeps serving.

mod common;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// After an attack, an ordinary request is still served.
async fn assert_still_serves(s: &TestServer) {
    let r = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "a", "max_tokens": 1 }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// Status of a raw response's first line.
fn status_of(response: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(response);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_body_is_refused_without_being_read() {
    let s = TestServer::tiny().await;
    let addr = s.base.strip_prefix("http://").unwrap().to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let gigabyte: u64 = 1 << 30;
    conn.write_all(
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {gigabyte}\r\n\r\n{{\"prompt\": \""
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    // Write until the server answers and stops reading: it must not take the whole gigabyte.
    let (mut rd, mut wr) = conn.into_split();
    let writer = tokio::spawn(async move {
        let chunk = vec![b'a'; 64 << 10];
        let mut sent: u64 = 0;
        while sent < gigabyte {
            if wr.write_all(&chunk).await.is_err() {
                break;
            }
            sent += chunk.len() as u64;
        }
        sent
    });
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !String::from_utf8_lossy(&response).contains("\r\n\r\n") {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(HANG_GUARD, read).await.unwrap();
    assert_eq!(
        status_of(&response),
        413,
        "{}",
        String::from_utf8_lossy(&response)
    );
    drop(rd);
    let sent = tokio::time::timeout(HANG_GUARD, writer)
        .await
        .unwrap()
        .unwrap();
    assert!(
        sent < gigabyte / 4,
        "the client sent {sent} bytes before the server stopped reading"
    );
    // And the server serves the next request.
    assert_still_serves(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_token_prompt_gets_400_naming_the_context() {
    let s = TestServer::tiny().await;
    let ids: Vec<u32> = vec![97; 1_000_000];
    let r = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": ids, "max_tokens": 1 }),
    )
    .await;
    assert_eq!(r.status, 400, "{}", &r.text[..r.text.len().min(300)]);
    assert_eq!(r.json["error"]["code"], "context_length_exceeded");
    assert!(
        r.error_message().contains("1000000"),
        "{}",
        r.error_message()
    );
    // As text (3.5 MB, under the body limit): tokenized, then refused the same way.
    let text = "ab ".repeat(1_150_000);
    for (path, body) in [
        ("/v1/completions", json!({ "prompt": text })),
        (
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "user", "content": text }] }),
        ),
    ] {
        let r = post(&s.base, path, &body).await;
        assert_eq!(
            r.status,
            400,
            "{path}: {}",
            &r.text[..r.text.len().min(300)]
        );
        assert_eq!(r.json["error"]["code"], "context_length_exceeded", "{path}");
    }
    assert_still_serves(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_json_gets_400() {
    let s = TestServer::tiny().await;
    let depth = 100_000;
    let mut bodies = Vec::new();
    // Nested anywhere: the whole body, a message's content, a schema, logit_bias.
    bodies.push(format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
    let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    bodies.push(format!(
        r#"{{"messages": [{{"role": "user", "content": {nested}}}]}}"#
    ));
    bodies.push(format!(
        r#"{{"messages": [{{"role": "user", "content": "x"}}], "response_format": {{"type": "json_schema", "json_schema": {{"name": "n", "schema": {nested}}}}}}}"#
    ));
    let obj = format!("{}{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
    bodies.push(format!(r#"{{"prompt": "x", "logit_bias": {obj}}}"#));
    for body in bodies {
        for path in ["/v1/chat/completions", "/v1/completions", "/tokenize"] {
            let r = post_raw(&s.base, path, body.clone().into_bytes()).await;
            assert_eq!(r.status, 400, "{path}: {}", r.text);
            r.assert_error_shape();
        }
    }
    // A schema nested less deeply than JSON's limit but more than a grammar should take.
    let mut schema = json!({ "type": "string" });
    for _ in 0..120 {
        schema = json!({ "type": "array", "items": schema });
    }
    let r = post(&s.base, "/v1/chat/completions", &json!({
        "messages": [{ "role": "user", "content": "x" }], "max_tokens": 2,
        "response_format": { "type": "json_schema", "json_schema": { "name": "n", "schema": schema } } })).await;
    assert!(matches!(r.status, 200 | 400), "{}", r.text);
    assert_still_serves(&s).await;
}

/// `body` with the string value `marker` replaced by invalid UTF-8 (a lone 0xFF byte).
fn with_invalid_utf8(body: &Value, marker: &str) -> Vec<u8> {
    let text = body.to_string();
    let at = text.find(marker).unwrap();
    let mut bytes = text.as_bytes()[..at].to_vec();
    bytes.extend_from_slice(b"\xff\xfe");
    bytes.extend_from_slice(&text.as_bytes()[at + marker.len()..]);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_and_lone_surrogates_in_every_string_field_get_400() {
    let s = TestServer::tiny().await;
    const M: &str = "MARKER";
    let chat = |f: &dyn Fn(&str) -> Value| f(M);
    let cases: Vec<(&str, Value)> = vec![
        (
            "/v1/chat/completions",
            chat(&|m| json!({ "model": m, "messages": [{ "role": "user", "content": "x" }] })),
        ),
        (
            "/v1/chat/completions",
            chat(&|m| json!({ "messages": [{ "role": m, "content": "x" }] })),
        ),
        (
            "/v1/chat/completions",
            chat(&|m| json!({ "messages": [{ "role": "user", "content": m }] })),
        ),
        (
            "/v1/chat/completions",
            chat(
                &|m| json!({ "messages": [{ "role": "user", "content": [{ "type": "text", "text": m }] }] }),
            ),
        ),
        (
            "/v1/chat/completions",
            chat(&|m| json!({ "messages": [{ "role": "user", "content": "x" }], "stop": [m] })),
        ),
        (
            "/v1/chat/completions",
            chat(&|m| json!({ "messages": [{ "role": "user", "content": "x" }], "user": m })),
        ),
        (
            "/v1/chat/completions",
            chat(&|m| {
                json!({ "messages": [{ "role": "user", "content": "x" }],
            "tools": [{ "type": "function", "function": { "name": m, "parameters": { "type": "object" } } }] })
            }),
        ),
        (
            "/v1/chat/completions",
            chat(&|m| {
                json!({ "messages": [{ "role": "user", "content": "x" }],
            "response_format": { "type": "json_schema", "json_schema": { "name": "n", "schema": { "type": "string", "pattern": m } } } })
            }),
        ),
        (
            "/v1/chat/completions",
            chat(
                &|m| json!({ "messages": [{ "role": "user", "content": "x" }], "logit_bias": { m: 1 } }),
            ),
        ),
        ("/v1/completions", chat(&|m| json!({ "prompt": m }))),
        ("/v1/completions", chat(&|m| json!({ "prompt": ["a", m] }))),
        (
            "/v1/completions",
            chat(&|m| json!({ "prompt": "a", "guided_regex": m })),
        ),
        ("/tokenize", chat(&|m| json!({ "prompt": m }))),
        (
            "/v1/chat/completions/render",
            chat(&|m| json!({ "messages": [{ "role": "user", "content": m }] })),
        ),
    ];
    for (path, body) in &cases {
        let r = post_raw(&s.base, path, with_invalid_utf8(body, M)).await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text);
        r.assert_error_shape();
        assert_eq!(r.json["error"]["code"], "invalid_json", "{path} {body}");
        // A lone surrogate escape is no text either.
        let escaped = body.to_string().replace(M, "\\ud800");
        let r = post_raw(&s.base, path, escaped.into_bytes()).await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text);
    }
    assert_still_serves(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_and_half_sent_connections_do_not_stop_service() {
    let s = TestServer::tiny().await;
    let addr = s.base.strip_prefix("http://").unwrap().to_string();
    let mut held = Vec::new();
    for i in 0..2000 {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        // Idle, a request line only, headers cut short, or a body promised and never sent.
        let part: &[u8] = match i % 4 {
            0 => b"",
            1 => b"POST /v1/completions HTTP/1.1\r\n",
            2 => b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-ty",
            _ => b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"pro",
        };
        c.write_all(part).await.unwrap();
        held.push(c);
    }
    for i in 0..5 {
        let r = post(
            &s.base,
            "/v1/completions",
            &json!({ "prompt": format!("a{i}"), "max_tokens": 2 }),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let h = get(&s.base, "/health").await;
    assert_eq!(h.json["status"], "ok");
    drop(held);
    assert_still_serves(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_clients_are_disconnected() {
    let options = rill_server::ServerOptions {
        header_read_timeout: std::time::Duration::from_millis(300),
        ..rill_server::ServerOptions::default()
    };
    let s = TestServer::start(tiny(), small_config(), options).await;
    let addr = s.base.strip_prefix("http://").unwrap().to_string();
    for part in [
        &b""[..],
        b"POST /v1/completions HTTP/1.1\r\n",
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-ty",
    ] {
        let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
        c.write_all(part).await.unwrap();
        // The server closes the connection (with a 408 or without a word); only a hang fails.
        let mut rest = Vec::new();
        tokio::time::timeout(HANG_GUARD, c.read_to_end(&mut rest))
            .await
            .expect("a slow client was held open")
            .ok();
        let status = status_of(&rest);
        assert!(
            matches!(status, 0 | 408),
            "{}",
            String::from_utf8_lossy(&rest)
        );
    }
    // A client that sends its request in full is served as always.
    assert_still_serves(&s).await;
}
