//! The server on the real SmolLM2-135M-Instruct (fetched on first use), loaded once for every
//! test of this binary: the official `openai` Python client driving it, and seeded sampling that
//! gives the same tokens alone or among 15 concurrent requests.

mod common;

use std::process::Command;
use std::sync::OnceLock;

use common::*;
use rill_engine::serve::{self, ServeConfig, ServeHandle};
use rill_engine::{Engine, Precision};
use rill_server::{Server, ServerOptions};
use serde_json::{json, Value};

const KEY: &str = "rill-test-key";
const SYSTEM: &str =
    "You are a concise assistant. Answer in one short sentence, without any preamble.";

/// The server's base URL; it runs on a thread of its own for the whole test binary.
fn server() -> &'static str {
    static BASE: OnceLock<String> = OnceLock::new();
    BASE.get_or_init(|| start_server().0)
}

/// A server of its own on SmolLM2, with the handle of its engine loop.
fn start_server() -> (String, ServeHandle) {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::resolve("smollm2-135m", &opts)
        .unwrap_or_else(|e| panic!("{e} (run `cargo run --release -- pull smollm2-135m`)"));
    let engine = Engine::load(&path, 2, Precision::Fast).unwrap();
    let config = ServeConfig {
        kv_cache_bytes: 128 << 20,
        context: 2048,
        model_name: "smollm2-135m".into(),
        ..ServeConfig::default()
    };
    let handle = serve::spawn(engine, config).unwrap();
    let server = Server::new(ServerOptions {
        api_key: Some(KEY.into()),
        model_aliases: vec!["SmolLM2-135M-Instruct".into()],
        ..ServerOptions::default()
    });
    server.set_ready(handle.clone());
    let base = format!("http://{}", server.serve_in_background(2).unwrap());
    (base, handle)
}

async fn chat(body: &Value) -> Reply {
    send(
        client()
            .post(format!("{}/v1/chat/completions", server()))
            .bearer_auth(KEY)
            .body(body.to_string()),
    )
    .await
}

/// Runs `tests/<script>` with the `openai` client (a Python made on first use by rill-testkit)
/// against the shared server; it must succeed and end with "ok".
fn run_openai_script(script: &str) {
    run_client_script("openai", script);
}

/// Runs `tests/<script>` with the Python client `module` against the shared server.
fn run_client_script(module: &str, script: &str) {
    let python = rill_testkit::python(&[module]);
    let base = server();
    let path = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&python)
        .args([path.as_str(), base, KEY])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
}

#[test]
fn openai_python_client_drives_the_server() {
    run_openai_script("openai_client.py");
}

#[test]
fn openai_python_client_parses_structured_output_and_calls_tools() {
    run_openai_script("openai_structured.py");
}

#[test]
fn openai_python_client_speaks_the_responses_api() {
    run_openai_script("openai_responses.py");
}

#[test]
fn anthropic_python_client_speaks_the_messages_api() {
    run_client_script("anthropic", "anthropic_client.py");
}

#[test]
fn ollama_python_client_speaks_ollamas_api() {
    run_client_script("ollama", "ollama_client.py");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_is_the_same_alone_or_with_15_concurrent_others() {
    let request = |seed: u64, question: &str| {
        json!({
            "model": "smollm2-135m",
            "messages": [{ "role": "user", "content": question }],
            "max_tokens": 32,
            "temperature": 0.8,
            "top_p": 0.95,
            "seed": seed,
            "logprobs": true,
        })
    };
    let tokens = |r: &Reply| -> Vec<String> {
        r.json["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap_or_else(|| panic!("{}", r.text))
            .iter()
            .map(|e| e["token"].as_str().unwrap().to_string())
            .collect()
    };
    let question = "Write a short poem about the sea.";
    let alone = chat(&request(2024, question)).await;
    assert_eq!(alone.status, 200, "{}", alone.text);
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let body = if i == 5 {
            request(2024, question)
        } else {
            request(i, &format!("Tell me fact number {i} about rivers."))
        };
        tasks.push(tokio::spawn(async move { chat(&body).await }));
    }
    let mut replies = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text);
        replies.push(r);
    }
    assert_eq!(tokens(&replies[5]), tokens(&alone));
    assert_eq!(
        replies[5].json["choices"][0]["message"]["content"],
        alone.json["choices"][0]["message"]["content"]
    );
    // Another seed samples something else.
    let other = chat(&request(2025, question)).await;
    assert_ne!(tokens(&other), tokens(&alone));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_greedy_streams_equal_their_answers_alone() {
    let questions = [
        "What is the capital of France?",
        "Name three primary colors.",
        "What is 12 times 12?",
        "Write a haiku about rain.",
    ];
    let body = |q: &str, stream: bool| {
        json!({
            "model": "SmolLM2-135M-Instruct",
            "messages": [
                { "role": "system", "content": SYSTEM },
                { "role": "user", "content": q },
            ],
            "max_tokens": 40,
            "temperature": 0,
            "stream": stream,
        })
    };
    let mut alone = Vec::new();
    for q in questions {
        let r = chat(&body(q, false)).await;
        assert_eq!(r.status, 200, "{}", r.text);
        alone.push(
            r.json["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    assert!(alone[0].contains("Paris"), "{}", alone[0]);
    let mut tasks = Vec::new();
    for (i, q) in questions.iter().cycle().take(12).enumerate() {
        let b = body(q, true);
        tasks.push(tokio::spawn(async move {
            let r = client()
                .post(format!("{}/v1/chat/completions", server()))
                .bearer_auth(KEY)
                .body(b.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let st = Streamed {
                status: 200,
                events: parse_sse(&r.text().await.unwrap()),
            };
            (i, st)
        }));
    }
    for t in tasks {
        let (i, st) = t.await.unwrap();
        assert!(st.ended_with_done());
        assert_eq!(st.text(0), alone[i % questions.len()], "question {i}");
    }
}

#[test]
fn the_web_page_works_in_headless_chromium() {
    // Node.js and Chromium from the system, playwright-core from npm on first use.
    let (script, chromium) = rill_testkit::browser_tools();
    // A server of its own: the page holds its engine loop between steps (`--control stdio`)
    // to act mid-generation, which must not hold this binary's other tests.
    let (base, handle) = start_server();
    // Screenshots of every view at both sizes, kept as artifacts.
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/browser-artifacts");
    std::fs::create_dir_all(&out).unwrap();
    let url = format!("{base}/");
    let args: Vec<&std::ffi::OsStr> = [
        "--url".as_ref(),
        url.as_ref(),
        "--api-key".as_ref(),
        KEY.as_ref(),
        "--control".as_ref(),
        "stdio".as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ]
    .to_vec();
    let (success, stdout, stderr) = run_page_script(&script, &args, &chromium, &handle);
    eprintln!("{stdout}{stderr}");
    assert!(success, "the browser test failed:\n{stdout}\n{stderr}");
    handle.shutdown();
    for view in ["generate", "tooltip", "tree", "beam", "speculative", "cost"] {
        for width in [1280, 390] {
            let shot = out.join(format!("{view}-{width}.png"));
            assert!(shot.exists(), "no screenshot {}", shot.display());
        }
    }
}
