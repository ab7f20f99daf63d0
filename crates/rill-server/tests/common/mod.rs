//! What the HTTP tests share: servers on loopback ports, and a small client.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rill_engine::serve::{self, ServeConfig, ServeHandle};
use rill_engine::{Engine, Precision};
use rill_model::synthetic::{SyntheticModel, SyntheticSpec};
use rill_server::{Server, ServerOptions};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Writes a model to a temp file of its own, loads it and deletes the file.
pub fn load(model: &SyntheticModel) -> Engine {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path: PathBuf =
        std::env::temp_dir().join(format!("rill-server-{}-{n}.gguf", std::process::id()));
    model.write_to_path(&path).unwrap();
    let engine = Engine::load(&path, 1, Precision::Fast).unwrap();
    std::fs::remove_file(&path).unwrap();
    engine
}

/// The tiny synthetic llama (context 256, ChatML template, 256 byte tokens + control tokens).
pub fn tiny() -> Engine {
    load(&SyntheticSpec::llama_tiny().build().unwrap())
}

pub fn small_config() -> ServeConfig {
    ServeConfig {
        kv_cache_bytes: 8 << 20,
        max_batch_tokens: 256,
        max_running: 32,
        max_queue: 64,
        model_name: "tiny".into(),
        ..ServeConfig::default()
    }
}

/// A synthetic llama big enough that generating takes a while (~25M parameters, context 4096),
/// so a request is still running when a test acts on it.
pub fn slow() -> rill_engine::Engine {
    let spec = SyntheticSpec {
        n_layers: 8,
        d_model: 512,
        n_heads: 8,
        n_kv_heads: 4,
        head_dim: 64,
        ffn_dim: 1536,
        context_length: 4096,
        ..SyntheticSpec::llama_tiny()
    };
    load(&spec.build().unwrap())
}

pub fn slow_config() -> ServeConfig {
    ServeConfig {
        kv_cache_bytes: 96 << 20,
        max_batch_tokens: 256,
        max_running: 8,
        max_queue: 16,
        model_name: "slow".into(),
        ..ServeConfig::default()
    }
}

/// A server on a loopback port, run by the test's runtime.
pub struct TestServer {
    pub base: String,
    pub server: Server,
    pub handle: ServeHandle,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    pub async fn start(engine: Engine, config: ServeConfig, options: ServerOptions) -> TestServer {
        let handle = serve::spawn(engine, config).unwrap();
        let server = Server::new(options);
        server.set_ready(handle.clone());
        let (base, stop, task) = listen(&server).await;
        TestServer {
            base,
            server,
            handle,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn tiny() -> TestServer {
        TestServer::start(tiny(), small_config(), ServerOptions::default()).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Triggers the graceful shutdown and waits for the server to return.
    pub async fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            tokio::time::timeout(HANG_GUARD, t)
                .await
                .expect("the server did not stop")
                .unwrap()
                .unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.handle.shutdown();
    }
}

/// Serves `server` on a free loopback port until the sender fires.
pub async fn listen(
    server: &Server,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let s = server.clone();
    let task = tokio::spawn(async move {
        s.run(listener, async {
            let _ = rx.await;
        })
        .await
    });
    (base, tx, task)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap()
}

/// A response: status, headers, body parsed as JSON (`Value::Null` if it is not JSON).
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
    pub json: Value,
}

impl Reply {
    pub fn error_param(&self) -> Option<&str> {
        self.json.pointer("/error/param").and_then(Value::as_str)
    }

    pub fn error_message(&self) -> &str {
        self.json
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// Asserts an OpenAI-shaped error body.
    pub fn assert_error_shape(&self) {
        let e = self
            .json
            .get("error")
            .unwrap_or_else(|| panic!("not an error body: {}", self.text));
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}",
            self.text
        );
        assert!(e["type"].is_string(), "{}", self.text);
        assert!(e.get("param").is_some(), "{}", self.text);
        assert!(e.get("code").is_some(), "{}", self.text);
        assert_eq!(
            self.headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{}",
            self.text
        );
    }
}

pub async fn send(request: reqwest::RequestBuilder) -> Reply {
    let r = request.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        text,
        json,
    }
}

pub async fn post(base: &str, path: &str, body: &Value) -> Reply {
    send(
        client()
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string()),
    )
    .await
}

pub async fn post_raw(base: &str, path: &str, body: Vec<u8>) -> Reply {
    send(
        client()
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body),
    )
    .await
}

pub async fn get(base: &str, path: &str) -> Reply {
    send(client().get(format!("{base}{path}"))).await
}

/// A streamed response's `data:` payloads, in order (`[DONE]` as a JSON string).
pub struct Streamed {
    pub status: u16,
    pub events: Vec<Value>,
}

impl Streamed {
    /// The chunks (every event but `[DONE]`).
    pub fn chunks(&self) -> impl Iterator<Item = &Value> {
        self.events.iter().filter(|e| e.is_object())
    }

    pub fn ended_with_done(&self) -> bool {
        self.events.last() == Some(&Value::String("[DONE]".into()))
    }

    /// The concatenated text of choice `i` (chat deltas or completion texts).
    pub fn text(&self, i: usize) -> String {
        let mut s = String::new();
        for c in self.chunks() {
            for ch in c["choices"].as_array().into_iter().flatten() {
                if ch["index"] == i {
                    if let Some(t) = ch
                        .pointer("/delta/content")
                        .or_else(|| ch.get("text"))
                        .and_then(Value::as_str)
                    {
                        s.push_str(t);
                    }
                }
            }
        }
        s
    }

    /// The finish reason of choice `i`.
    pub fn finish_reason(&self, i: usize) -> Option<String> {
        self.chunks()
            .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
            .find(|ch| ch["index"] == i && ch["finish_reason"].is_string())
            .map(|ch| ch["finish_reason"].as_str().unwrap().to_string())
    }

    pub fn usage(&self) -> Option<&Value> {
        self.chunks()
            .filter_map(|c| c.get("usage"))
            .find(|u| u.is_object())
    }
}

pub async fn stream(base: &str, path: &str, body: &Value) -> Streamed {
    let r = client()
        .post(format!("{base}{path}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    Streamed {
        status,
        events: parse_sse(&text),
    }
}

/// The `data:` payloads of server-sent events (named events' `event:` lines skipped).
pub fn parse_sse(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| {
            if d == "[DONE]" {
                Value::String(d.into())
            } else {
                serde_json::from_str(d).unwrap_or_else(|e| panic!("bad chunk {d:?}: {e}"))
            }
        })
        .collect()
}

/// Sends a raw HTTP/1.1 request on a fresh connection and returns it, with what has come back
/// once `until` holds for the response so far (or the connection closes).
pub async fn raw_request(
    base: &str,
    request: &[u8],
    until: impl Fn(&str) -> bool,
) -> (tokio::net::TcpStream, String) {
    let addr = base.strip_prefix("http://").unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while !until(&String::from_utf8_lossy(&got)) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("no answer in time")
            .unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    (s, String::from_utf8_lossy(&got).into_owned())
}

/// The body of a raw HTTP/1.1 response with chunked transfer encoding, as far as it came.
pub fn dechunk(response: &str) -> String {
    let Some((_, mut rest)) = response.split_once("\r\n\r\n") else {
        return String::new();
    };
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        body.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    body
}

/// `until` for [`raw_request`]: `n` server-sent events have come.
pub fn events(n: usize) -> impl Fn(&str) -> bool {
    move |t: &str| t.matches("data: ").count() >= n
}

/// A POST with a JSON body as raw HTTP/1.1 bytes.
pub fn http_post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// The value of an unlabelled metric in Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.rsplit_once(' ')?;
        (n == name).then(|| v.parse().ok()).flatten()
    })
}

/// How long a wait for something the test has set in motion may take before the test calls it
/// a hang. Never what decides a result: only a guard, far beyond any machine's speed.
pub const HANG_GUARD: Duration = Duration::from_secs(300);

/// Lets the engine loop run an iteration at a time until `done` holds for `/metrics` (an event the
/// test set in motion outside the engine, such as the server noticing a closed connection, which
/// it does when it next writes to it), and returns that text. It counts loop iterations, not time;
/// `HANG_GUARD` only bounds a hang.
pub async fn until_engine(s: &TestServer, what: &str, done: impl Fn(&str) -> bool) -> String {
    let wait = async {
        loop {
            let m = get(&s.base, "/metrics").await.text;
            if done(&m) {
                return m;
            }
            s.handle.next_step().unwrap().await.unwrap();
        }
    };
    tokio::time::timeout(HANG_GUARD, wait)
        .await
        .unwrap_or_else(|_| panic!("hung: {what}"))
}

/// Waits until no KV block is used by a sequence (cached free blocks are fine), and returns
/// `/health`'s answer then.
pub async fn wait_all_blocks_free(s: &TestServer) -> Value {
    until_engine(s, "every KV block back", |m| {
        metric(m, "rill_kv_blocks_used") == Some(0.0)
    })
    .await;
    let h = get(&s.base, "/health").await;
    assert_eq!(h.json["kv_cache"]["blocks_used"], 0, "{}", h.text);
    h.json
}

/// Runs a page script (`node SCRIPT ARGS`, Chromium from `chromium`) that holds `handle`'s engine
/// loop through its stdout and stdin (`@engine pause|step|resume`, answered `ok <blocks used>`);
/// returns whether it succeeded, with its stdout (less the engine commands) and stderr.
pub fn run_page_script(
    script: &std::path::Path,
    args: &[&std::ffi::OsStr],
    chromium: &std::path::Path,
    handle: &ServeHandle,
) -> (bool, String, String) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let mut child = Command::new("node")
        .arg(script)
        .args(args)
        .env("CHROMIUM", chromium)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let mut to_page = child.stdin.take().unwrap();
    let mut stdout = String::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(command) = line.strip_prefix("@engine ") {
            let stats = match command {
                "pause" => handle.pause().map(|()| handle.kv_stats()),
                "resume" => handle.resume().map(|()| handle.kv_stats()),
                "step" => handle.next_step().map(|rx| rx.blocking_recv().unwrap()),
                other => panic!("unknown engine command {other:?}"),
            };
            let reply = match stats {
                Ok(kv) => format!("ok {}", kv.blocks_used),
                Err(e) => format!("error {e}"),
            };
            writeln!(to_page, "{reply}").unwrap();
        } else {
            stdout.push_str(&line);
            stdout.push('\n');
        }
    }
    drop(to_page);
    let status = child.wait().unwrap();
    (status.success(), stdout, stderr.join().unwrap())
}
