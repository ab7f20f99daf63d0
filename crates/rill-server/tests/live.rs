//! `/v1/rill/server`: the KV arena's blocks and the loop's steps, read while the test holds the
//! engine loop between steps (no timing decides anything).

mod common;

use common::*;
use serde_json::{json, Value};

async fn view(s: &TestServer) -> Value {
    let r = get(&s.base, "/v1/rill/server?steps=256").await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json
}

fn running(v: &Value) -> Vec<&Value> {
    v["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "running")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_view_shows_each_requests_blocks_and_shared_prefixes() {
    let s = TestServer::tiny().await;
    let prompt = "the keeper of the lighthouse kept the light burning through the long night";
    let body = json!({ "prompt": prompt, "max_tokens": 24, "ignore_eos": true });
    s.handle.pause().unwrap();
    let first = tokio::spawn({
        let (base, body) = (s.base.clone(), body.clone());
        async move { post(&base, "/v1/completions", &body).await }
    });
    // Step until the first request's prompt is in the cache (its blocks published).
    let mut v = view(&s).await;
    while running(&v).is_empty() || running(&v)[0]["computed"].as_u64().unwrap() < 2 {
        s.handle.next_step().unwrap().await.unwrap();
        v = view(&s).await;
    }
    let second = tokio::spawn({
        let (base, body) = (s.base.clone(), body.clone());
        async move { post(&base, "/v1/completions", &body).await }
    });
    while running(&v).len() < 2 {
        s.handle.next_step().unwrap().await.unwrap();
        v = view(&s).await;
    }
    let seqs = running(&v);
    let (a, b) = (seqs[0], seqs[1]);
    assert_ne!(a["request"], b["request"]);
    let refs = v["kv"]["refs"].as_array().unwrap();
    for s in [a, b] {
        let blocks = s["blocks"].as_array().unwrap();
        assert!(!blocks.is_empty(), "{s}");
        for blk in blocks {
            assert!(refs[blk.as_u64().unwrap() as usize].as_u64().unwrap() >= 1);
        }
    }
    // The second started from the first's cached prompt: their first block is one block,
    // referenced twice and in the prefix cache.
    assert!(b["cached_prompt_tokens"].as_u64().unwrap() > 0, "{b}");
    let shared = a["blocks"][0].as_u64().unwrap() as usize;
    assert_eq!(b["blocks"][0].as_u64().unwrap() as usize, shared);
    assert_eq!(refs[shared], 2);
    assert_eq!(v["kv"]["published"][shared], 1);
    // The steps so far: the first request's prompt rows, then rows of both.
    let steps = v["steps"].as_array().unwrap();
    assert!(steps.iter().any(|st| st["parts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["decode"] == false)));
    let admitted = |v: &Value| {
        v["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "admitted")
            .count()
    };
    assert_eq!(admitted(&v), 2);

    s.handle.resume().unwrap();
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    wait_all_blocks_free(&s).await;
    let v = view(&s).await;
    assert!(running(&v).is_empty());
    assert!(v["kv"]["refs"].as_array().unwrap().iter().all(|r| r == 0));
    let finished = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "finished")
        .count();
    assert_eq!(finished, 2, "{}", v["events"]);
    // Every decode step of the two requests is on record, both sharing steps.
    let both = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|st| st["parts"].as_array().unwrap().len() == 2)
        .count();
    assert!(both > 0);
    let r = get(&s.base, "/v1/rill/server?steps=100000").await;
    assert_eq!(r.status, 400, "{}", r.text);
}

/// A beam search runs in the loop's arena beside an ordinary request, one pass of its beams per
/// loop iteration: its beams show as sequences sharing the prompt's blocks, with the blocks it
/// keeps for their growth, and all of it is freed when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_beam_search_shows_its_beams_and_steps_between_requests() {
    let s = TestServer::tiny().await;
    let prompt = "the keeper of the lighthouse kept the light burning through the long night";
    s.handle.pause().unwrap();
    let beam = tokio::spawn({
        let base = s.base.clone();
        let body = json!({ "prompt": prompt, "width": 3, "max_tokens": 12, "ignore_eos": true });
        async move { post(&base, "/v1/rill/beam", &body).await }
    });
    let plain = tokio::spawn({
        let base = s.base.clone();
        let body = json!({ "prompt": "a different story", "max_tokens": 24, "ignore_eos": true });
        async move { post(&base, "/v1/completions", &body).await }
    });
    let with_state = |v: &Value, state: &str| -> Vec<Value> {
        v["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["state"] == state)
            .cloned()
            .collect()
    };
    let mut v = view(&s).await;
    let mut iterations = 0;
    while with_state(&v, "beam").len() < 3 || running(&v).is_empty() {
        iterations += 1;
        assert!(iterations < 200, "no three beams beside a request: {v}");
        s.handle.next_step().unwrap().await.unwrap();
        v = view(&s).await;
    }
    let beams = with_state(&v, "beam");
    let id = beams[0]["request"].clone();
    assert!(beams.iter().all(|b| b["request"] == id));
    assert_ne!(running(&v)[0]["request"], id);
    // The beams share the prompt's first block; the search keeps blocks for their growth.
    let refs = v["kv"]["refs"].as_array().unwrap();
    let first = beams[0]["blocks"][0].as_u64().unwrap();
    assert!(beams.iter().all(|b| b["blocks"][0].as_u64() == Some(first)));
    assert!(refs[first as usize].as_u64().unwrap() >= 3);
    let reserved = with_state(&v, "reserved");
    assert_eq!(reserved.len(), 1);
    assert_eq!(reserved[0]["request"], id);
    assert!(!reserved[0]["blocks"].as_array().unwrap().is_empty());
    // Its passes are on the timeline as decode rows of its beams.
    let beam_rows: usize = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|st| st["parts"].as_array().unwrap().iter())
        .filter(|p| p["request"] == id && p["decode"] == true)
        .count();
    assert!(beam_rows >= 3, "{}", v["steps"]);

    s.handle.resume().unwrap();
    let beam = beam.await.unwrap();
    assert_eq!(beam.status, 200, "{}", beam.text);
    assert_eq!(beam.json["hypotheses"].as_array().unwrap().len(), 3);
    assert_eq!(plain.await.unwrap().status, 200);
    wait_all_blocks_free(&s).await;
    let v = view(&s).await;
    assert!(with_state(&v, "beam").is_empty() && with_state(&v, "reserved").is_empty());
    assert!(v["events"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["request"] == id && e["kind"] == "finished"));
}

/// With a sliding-window model, the view shows the window layers' own arena: a long request
/// holds about one window of its blocks, the global blocks before that are marked as let go
/// there, and when it ends its last window stays with the prefix cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_request_on_a_window_model_shows_the_window_it_let_go() {
    let mut spec = rill_model::synthetic::SyntheticSpec::gemma3_tiny();
    spec.context_length = 1024;
    spec.sliding_window = Some(16);
    let engine = load(&spec.build().unwrap());
    let config = rill_engine::serve::ServeConfig {
        max_running: 4,
        max_batch_tokens: 64,
        ..small_config()
    };
    let s = TestServer::start(engine, config, rill_server::ServerOptions::default()).await;
    let prompt: String = (0..300)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let body = json!({ "prompt": prompt, "max_tokens": 20, "ignore_eos": true });
    s.handle.pause().unwrap();
    let request = tokio::spawn({
        let base = s.base.clone();
        async move { post(&base, "/v1/completions", &body).await }
    });
    let mut v = view(&s).await;
    while running(&v).is_empty() || running(&v)[0]["computed"].as_u64().unwrap() < 200 {
        s.handle.next_step().unwrap().await.unwrap();
        v = view(&s).await;
    }
    let window = &v["kv"]["window"];
    assert_eq!(window["size"], 16);
    assert_eq!(
        (window["layers"].as_u64(), window["global_layers"].as_u64()),
        (Some(2), Some(1))
    );
    let seq = running(&v)[0];
    let from = seq["window_from"].as_u64().unwrap() as usize;
    let computed = seq["computed"].as_u64().unwrap() as usize;
    // It holds what its next query reads (the last 16 positions) and has let go of the rest.
    assert!(
        from <= computed + 1 - 16 && from + 16 + 64 >= computed,
        "{seq}"
    );
    let table = seq["window_blocks"].as_array().unwrap();
    assert_eq!(table.len(), seq["blocks"].as_array().unwrap().len());
    let held: Vec<u64> = table.iter().filter_map(Value::as_u64).collect();
    assert!(held.len() <= 16 / 16 + 2 + 64 / 16, "{table:?}");
    assert!(table[..from / 16].iter().all(Value::is_null), "{table:?}");
    for w in &held {
        assert!(window["refs"][*w as usize].as_u64().unwrap() >= 1);
    }
    s.handle.resume().unwrap();
    assert_eq!(request.await.unwrap().status, 200);
    wait_all_blocks_free(&s).await;
    let v = view(&s).await;
    let window = &v["kv"]["window"];
    // Nothing is held now; the last window stays with the published blocks, reclaimable.
    let kept = window["refs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.as_u64() == Some(1))
        .count();
    let companions = window["companions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.as_u64() == Some(1))
        .count();
    assert!(kept >= 1 && kept == companions, "{window}");
}

/// With a hybrid model (Qwen3.5's kind), the view shows the fixed notepad: which layers keep a
/// state instead of keys and values, its size against what keys and values would take, each
/// sequence's snapshot, and the snapshots the prefix cache keeps once a request ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hybrid_models_view_shows_its_fixed_notepad() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/tiny/qwen35-tiny/model.gguf");
    let engine = rill_engine::Engine::load(&path, 2, rill_engine::Precision::Fast).unwrap();
    let config = rill_engine::serve::ServeConfig {
        max_running: 4,
        max_batch_tokens: 64,
        ..small_config()
    };
    let s = TestServer::start(engine, config, rill_server::ServerOptions::default()).await;
    let prompt: String = (0..120)
        .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
        .collect();
    let body = json!({ "prompt": prompt, "max_tokens": 20, "ignore_eos": true });
    s.handle.pause().unwrap();
    let request = tokio::spawn({
        let base = s.base.clone();
        async move { post(&base, "/v1/completions", &body).await }
    });
    let mut v = view(&s).await;
    while running(&v).is_empty() || running(&v)[0]["computed"].as_u64().unwrap() < 64 {
        s.handle.next_step().unwrap().await.unwrap();
        v = view(&s).await;
    }
    let rec = &v["kv"]["recurrent"];
    assert_eq!(
        (rec["layers"].as_u64(), rec["attention_layers"].as_u64()),
        (Some(3), Some(1))
    );
    assert_eq!(rec["kinds"]["gated_deltanet"], 3);
    // Three DeltaNet layers: a conv window of 3 × 128 and a state of 4 × 16 × 16 each, in f32.
    assert_eq!(rec["state_bytes"], 3 * (3 * 128 + 4 * 16 * 16) * 4);
    // Keys and values of three more layers like the attention one (f16): 3 × 2 × 32 × 2 bytes.
    assert_eq!(rec["kv_equivalent_bytes_per_token"], 3 * 2 * 32 * 2);
    let seq = running(&v)[0];
    let computed = seq["computed"].as_u64().unwrap();
    let snapshot = seq["state_snapshot"].as_u64().unwrap();
    assert_eq!(snapshot, computed / 16 * 16, "{seq}");
    assert_eq!(
        rec["free_sequences"].as_u64().unwrap() + 1,
        rec["max_sequences"].as_u64().unwrap()
    );
    s.handle.resume().unwrap();
    assert_eq!(request.await.unwrap().status, 200);
    wait_all_blocks_free(&s).await;
    let v = view(&s).await;
    assert!(
        v["kv"]["recurrent"]["stored_snapshots"].as_u64().unwrap() >= 1,
        "{}",
        v["kv"]
    );
}

/// The page on a hybrid model (qwen35-tiny) in headless Chromium (`browser/hybrid.mjs`): the
/// lens marks the recurrent layers, the attention view says what a recurrent layer keeps, the
/// server view shows a request's fixed state and its snapshot. The page holds the engine loop
/// through its stdin and stdout, as the SmolLM2 page test does.
#[test]
fn the_page_shows_a_hybrid_models_fixed_notepad_in_headless_chromium() {
    let (viewer, chromium) = rill_testkit::browser_tools();
    let script = viewer.with_file_name("hybrid.mjs");
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/tiny/qwen35-tiny/model.gguf");
    let engine = rill_engine::Engine::load(&path, 2, rill_engine::Precision::Fast).unwrap();
    let handle = rill_engine::serve::spawn(engine, small_config()).unwrap();
    let server = rill_server::Server::new(rill_server::ServerOptions::default());
    server.set_ready(handle.clone());
    let base = format!("http://{}", server.serve_in_background(2).unwrap());
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/browser-artifacts");
    std::fs::create_dir_all(&out).unwrap();
    let url = format!("{base}/");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--url".as_ref(),
        url.as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ];
    let (success, stdout, stderr) = run_page_script(&script, &args, &chromium, &handle);
    eprintln!("{stdout}{stderr}");
    assert!(success, "the hybrid page test failed:\n{stdout}\n{stderr}");
    handle.shutdown();
}

/// The page on a model that thinks (`browser/thinking.mjs`): a tiny synthetic model whose chat
/// template opens `<think>` in the prompt (DeepSeek-R1's and Qwen3.5's kind), so its whole
/// answer is thinking: the chips and the viewer mark it apart from the answer.
#[test]
fn the_page_marks_a_models_thinking_in_headless_chromium() {
    const OPENED_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n\
{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n\
{% else %}<think>\n{% endif %}{% endif %}";
    let (viewer, chromium) = rill_testkit::browser_tools();
    let script = viewer.with_file_name("thinking.mjs");
    let mut model = rill_model::synthetic::SyntheticSpec::llama_tiny()
        .build()
        .unwrap();
    model.set_metadata(
        "tokenizer.chat_template",
        rill_gguf::Value::String(OPENED_TEMPLATE.into()),
    );
    let handle = rill_engine::serve::spawn(load(&model), small_config()).unwrap();
    let server = rill_server::Server::new(rill_server::ServerOptions::default());
    server.set_ready(handle.clone());
    let base = format!("http://{}", server.serve_in_background(2).unwrap());
    let out =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/browser-artifacts");
    std::fs::create_dir_all(&out).unwrap();
    let url = format!("{base}/");
    let args: Vec<&std::ffi::OsStr> = vec![
        "--url".as_ref(),
        url.as_ref(),
        "--out".as_ref(),
        out.as_os_str(),
    ];
    let (success, stdout, stderr) = run_page_script(&script, &args, &chromium, &handle);
    eprintln!("{stdout}{stderr}");
    assert!(
        success,
        "the thinking page test failed:\n{stdout}\n{stderr}"
    );
    handle.shutdown();
}
