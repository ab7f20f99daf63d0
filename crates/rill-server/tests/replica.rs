//! rill as a replica behind a router, over loopback: the probes (`/health` for liveness, `/ready`
//! for readiness), the drain on shutdown, model names as routers send them, the replica header,
//! vLLM-compatible metrics read with the selectors routers use, the render endpoints, sglang's
//! worker-info endpoints and the KV-event stream decoded as llm-d's subscriber decodes it.

mod common;

use common::*;
use rill_server::{MetricsCompat, ServerOptions};
use serde_json::{json, Value};

fn user(text: &str) -> Value {
    json!([{ "role": "user", "content": text }])
}

/// Polls `path` until it answers `status` (something the test set in motion: the server's drain
/// starting on its own task). `HANG_GUARD` only bounds a hang.
async fn until_status(base: &str, path: &str, status: u16) -> Reply {
    let wait = async {
        loop {
            let r = get(base, path).await;
            if r.status == status {
                return r;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(HANG_GUARD, wait)
        .await
        .unwrap_or_else(|_| panic!("{path} never answered {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_live_while_ready_follows_loading() {
    let server = rill_server::Server::new(ServerOptions::default());
    let (base, stop, task) = listen(&server).await;
    let h = get(&base, "/health").await;
    assert_eq!(h.status, 200, "{}", h.text);
    assert_eq!(h.json["status"], "loading");
    let r = get(&base, "/ready").await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json["status"], "loading");
    assert!(r.headers.contains_key("retry-after"));
    r.assert_error_shape();
    assert_eq!(get(&base, "/v1/models").await.status, 503);
    let r = post(&base, "/v1/completions", &json!({ "prompt": "x" })).await;
    assert_eq!(r.status, 503);
    r.assert_error_shape();
    assert_eq!(get(&base, "/metrics").await.status, 200);

    let handle = rill_engine::serve::spawn(tiny(), small_config()).unwrap();
    server.set_ready(handle.clone());
    let r = get(&base, "/ready").await;
    assert_eq!((r.status, r.json["status"].as_str()), (200, Some("ready")));
    let h = get(&base, "/health").await;
    assert_eq!(h.json["status"], "ok");
    assert_eq!(h.json["requests_in_flight"], 0);
    assert_eq!(h.json["kv_cache"]["block_size"], 16);
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    handle.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_refuses_new_work_and_lets_running_streams_finish() {
    let options = ServerOptions {
        shutdown_timeout: HANG_GUARD,
        ..ServerOptions::default()
    };
    let mut s = TestServer::start(slow(), slow_config(), options).await;
    let body = json!({ "messages": user("go"), "max_tokens": 150, "ignore_eos": true,
                       "stream": true, "stream_options": { "include_usage": true } });
    let request = http_post("/v1/chat/completions", body.to_string().as_bytes());
    let (mut conn, mut got) = raw_request(&s.base, &request, events(3)).await;
    // Held between two steps: the stream is mid-way when the drain starts.
    s.handle.pause().unwrap();
    let _ = s.stop.take().unwrap().send(());
    let r = until_status(&s.base, "/ready", 503).await;
    assert_eq!(r.json["status"], "draining");
    assert_eq!(r.json["error"]["code"], "draining");
    // New work gets 503 (a router retries it elsewhere); liveness stays 200.
    let n = post(&s.base, "/v1/completions", &json!({ "prompt": "a" })).await;
    assert_eq!(n.status, 503, "{}", n.text);
    n.assert_error_shape();
    let h = get(&s.base, "/health").await;
    assert_eq!(
        (h.status, h.json["status"].as_str()),
        (200, Some("draining"))
    );
    assert_eq!(h.json["requests_in_flight"], 1);
    // The running stream finishes normally once the loop runs again.
    s.handle.resume().unwrap();
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
    assert_eq!(st.finish_reason(0).as_deref(), Some("length"));
    assert_eq!(st.usage().unwrap()["completion_tokens"], 150);
    // Then the server stops by itself.
    let task = s.task.take().unwrap();
    tokio::time::timeout(HANG_GUARD, task)
        .await
        .expect("the server did not stop after the drain")
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_placeholders_and_aliases_reach_the_model() {
    let options = ServerOptions {
        model_aliases: vec!["org/tiny-instruct".into()],
        replica_id: Some("replica-7".into()),
        ..ServerOptions::default()
    };
    let s = TestServer::start(tiny(), small_config(), options).await;
    let ask = |model: Value| json!({ "model": model, "messages": user("hi"), "max_tokens": 2 });
    // sglang-router's "unknown", an absent, null or empty name, the name and an alias.
    for model in [
        json!("unknown"),
        json!("default"),
        json!(""),
        json!("tiny"),
        json!("org/tiny-instruct"),
    ] {
        let r = post(&s.base, "/v1/chat/completions", &ask(model.clone())).await;
        assert_eq!(r.status, 200, "{model}: {}", r.text);
        assert_eq!(r.json["model"], "tiny");
        assert_eq!(r.headers["x-rill-replica"], "replica-7");
    }
    let r = post(
        &s.base,
        "/v1/chat/completions",
        &json!({ "messages": user("hi"), "max_tokens": 2 }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Another model's name is still a 404 (and still names the replica).
    let r = post(&s.base, "/v1/chat/completions", &ask(json!("gpt-4o"))).await;
    assert_eq!(r.status, 404, "{}", r.text);
    assert_eq!(r.headers["x-rill-replica"], "replica-7");
    assert_eq!(
        get(&s.base, "/health").await.headers["x-rill-replica"],
        "replica-7"
    );

    let any = ServerOptions {
        accept_any_model: true,
        ..ServerOptions::default()
    };
    let s = TestServer::start(tiny(), small_config(), any).await;
    let r = post(&s.base, "/v1/chat/completions", &ask(json!("gpt-4o"))).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(!r.headers.contains_key("x-rill-replica"));
}

/// One series: its labels and value.
type Series = (Vec<(String, String)>, f64);

/// A metric family as a router's selector reads it: every series of `name` whose labels include
/// `want` (`label=value` pairs), with its labels and value; and the family's `# TYPE`.
fn select(text: &str, name: &str, want: &[(&str, &str)]) -> (Option<String>, Vec<Series>) {
    let kind = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("# TYPE {name} ")))
        .map(str::to_string);
    let mut series = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (head, value) = line.rsplit_once(' ').unwrap();
        let (metric, labels) = match head.split_once('{') {
            Some((m, rest)) => (m, rest.strip_suffix('}').unwrap()),
            None => (head, ""),
        };
        if metric != name {
            continue;
        }
        let labels: Vec<(String, String)> = labels
            .split(',')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap();
                (k.to_string(), v.trim_matches('"').to_string())
            })
            .collect();
        if want
            .iter()
            .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        {
            series.push((labels, value.parse().unwrap()));
        }
    }
    (kind, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_metrics_read_as_the_routers_read_them() {
    let options = ServerOptions {
        metrics_compat: MetricsCompat::Vllm,
        ..ServerOptions::default()
    };
    let s = TestServer::start(tiny(), small_config(), options).await;
    // The same prompt twice: the second finds the first's blocks cached.
    for _ in 0..2 {
        let r = post(
            &s.base,
            "/v1/completions",
            &json!({ "prompt": "a".repeat(40), "max_tokens": 3 }),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let text = until_engine(&s, "metrics settle", |m| {
        metric(m, "rill_requests_running") == Some(0.0)
    })
    .await;
    let blocks = s.handle.kv_stats().blocks_total;
    // llm-d's default engine config (and the Gateway API Inference Extension's protocol): one
    // series each, integer queue sizes, a 0-1 KV usage, integer cache-config labels.
    for (name, kind) in [
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:num_requests_running", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:gpu_cache_usage_perc", "gauge"),
    ] {
        let (k, series) = select(&text, name, &[("model_name", "tiny")]);
        assert_eq!(k.as_deref(), Some(kind), "{name}");
        assert_eq!(series.len(), 1, "{name}");
        let v = series[0].1;
        assert!((0.0..=1.0).contains(&v), "{name} = {v}");
    }
    let (k, info) = select(&text, "vllm:cache_config_info", &[]);
    assert_eq!(k.as_deref(), Some("gauge"));
    assert_eq!(info.len(), 1);
    let label = |l: &str| {
        info[0]
            .0
            .iter()
            .find(|(k, _)| k == l)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(label("block_size").unwrap().parse::<usize>().unwrap(), 16);
    assert_eq!(
        label("num_gpu_blocks").unwrap().parse::<usize>().unwrap(),
        blocks
    );
    let (_, rill_info) = select(&text, "rill_cache_config_info", &[("block_size", "16")]);
    assert_eq!(rill_info.len(), 1);
    // Counters in tokens, with vLLM's _total names; the second prompt hit the first's blocks.
    let (k, q) = select(
        &text,
        "vllm:prefix_cache_queries_total",
        &[("model_name", "tiny")],
    );
    assert_eq!(k.as_deref(), Some("counter"));
    let (_, h) = select(
        &text,
        "vllm:prefix_cache_hits_total",
        &[("model_name", "tiny")],
    );
    assert!(
        h[0].1 >= 32.0 && q[0].1 >= h[0].1,
        "queries {q:?} hits {h:?}"
    );
    let (_, ok) = select(
        &text,
        "vllm:request_success_total",
        &[("finished_reason", "length")],
    );
    assert_eq!(ok[0].1, 2.0);
    for hist in [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    ] {
        let (k, _) = select(&text, hist, &[]);
        assert_eq!(k.as_deref(), Some("histogram"), "{hist}");
        let (_, count) = select(&text, &format!("{hist}_count"), &[("model_name", "tiny")]);
        assert!(count[0].1 >= 2.0, "{hist}");
        let (_, inf) = select(&text, &format!("{hist}_bucket"), &[("le", "+Inf")]);
        assert_eq!(inf[0].1, count[0].1, "{hist}");
    }
    // Without the flag, only rill's names.
    let s = TestServer::tiny().await;
    let text = get(&s.base, "/metrics").await.text;
    assert!(!text.contains("vllm:"));
    assert!(text.contains("rill_cache_config_info{"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_endpoints_give_the_ids_generation_would_use() {
    let s = TestServer::tiny().await;
    let messages = user("render me");
    let r = post(
        &s.base,
        "/v1/chat/completions/render",
        &json!({ "model": "tiny", "messages": messages, "max_tokens": 5, "temperature": 0.5 }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let t = post(&s.base, "/tokenize", &json!({ "messages": messages })).await;
    assert_eq!(r.json["token_ids"], t.json["tokens"]);
    assert!(r.json["request_id"]
        .as_str()
        .unwrap()
        .starts_with("chatcmpl-"));
    assert_eq!(r.json["model"], "tiny");
    assert_eq!(r.json["features"], Value::Null);
    assert_eq!(r.json["sampling_params"]["max_tokens"], 5);
    assert_eq!(r.json["sampling_params"]["temperature"], 0.5);
    // The usage of a real generation counts the same prompt.
    let g = post(
        &s.base,
        "/v1/chat/completions",
        &json!({ "messages": messages, "max_tokens": 1 }),
    )
    .await;
    assert_eq!(
        g.json["usage"]["prompt_tokens"],
        r.json["token_ids"].as_array().unwrap().len()
    );

    let r = post(
        &s.base,
        "/v1/completions/render",
        &json!({ "prompt": ["ab", "cde"] }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let a = r.json.as_array().unwrap();
    assert_eq!(a.len(), 2);
    for (item, text) in a.iter().zip(["ab", "cde"]) {
        let t = post(&s.base, "/tokenize", &json!({ "prompt": text })).await;
        assert_eq!(item["token_ids"], t.json["tokens"]);
        assert!(item["request_id"].as_str().unwrap().starts_with("cmpl-"));
    }
    let r = post(
        &s.base,
        "/v1/completions/render",
        &json!({ "prompt": [1, 2, 3] }),
    )
    .await;
    assert_eq!(r.json[0]["token_ids"], json!([1, 2, 3]));
    // Errors as generation gives them.
    let r = post(
        &s.base,
        "/v1/chat/completions/render",
        &json!({ "model": "other", "messages": messages }),
    )
    .await;
    assert_eq!(r.status, 404);
    r.assert_error_shape();
    let r = post(
        &s.base,
        "/v1/completions/render",
        &json!({ "prompt": "x", "temperature": -1 }),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error_param(), Some("temperature"));

    // sglang-router's registration reads the model's name here.
    let i = get(&s.base, "/server_info").await;
    assert_eq!(i.json["served_model_name"], "tiny");
    assert_eq!(
        get(&s.base, "/get_model_info").await.json["model_path"],
        "tiny"
    );
}

/// An event as llm-d's vLLM adapter decodes it (`pkg/kvevents/engineadapter/vllm_adapter.go`).
#[derive(Debug, Clone, PartialEq)]
enum Decoded {
    Stored {
        hashes: Vec<u64>,
        parent: u64,
        tokens: Vec<u32>,
        block_size: i64,
    },
    Removed {
        hashes: Vec<u64>,
    },
    AllCleared,
}

/// A hash as llm-d reads one: an unsigned or signed integer, or bytes (their last 8, big-endian).
fn hash_of(v: &rmpv::Value) -> Result<u64, String> {
    match v {
        rmpv::Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|x| x as u64))
            .ok_or_else(|| format!("bad hash {v}")),
        rmpv::Value::Binary(b) => {
            let mut x = [0u8; 8];
            let tail = &b[b.len().saturating_sub(8)..];
            x[8 - tail.len()..].copy_from_slice(tail);
            Ok(u64::from_be_bytes(x))
        }
        _ => Err(format!("bad hash {v}")),
    }
}

/// One ZMQ message as llm-d's subscriber takes it apart: exactly three frames, a topic split on
/// `@` into pod and model, an 8-byte big-endian sequence number, and a MessagePack batch
/// `[ts, [events], rank?]` whose events are arrays with their tag first.
fn decode_like_llmd(
    frames: &[bytes::Bytes],
) -> Result<(String, String, u64, Vec<Decoded>), String> {
    if frames.len() != 3 || frames[1].len() < 8 {
        return Err(format!("{} frames", frames.len()));
    }
    let topic = std::str::from_utf8(&frames[0]).map_err(|e| e.to_string())?;
    let parts: Vec<&str> = topic.split('@').collect();
    let (pod, model) = if parts.len() == 3 {
        (parts[1].to_string(), parts[2].to_string())
    } else {
        (topic.to_string(), String::new())
    };
    let seq = u64::from_be_bytes(frames[1][..8].try_into().unwrap());
    let batch = rmpv::decode::read_value(&mut &frames[2][..]).map_err(|e| e.to_string())?;
    let batch = batch.as_array().ok_or("the batch is not an array")?;
    if !(2..=3).contains(&batch.len()) || batch[0].as_f64().is_none() {
        return Err(format!("bad batch {batch:?}"));
    }
    if let Some(rank) = batch.get(2) {
        if !rank.is_nil() && rank.as_i64().is_none() {
            return Err("bad rank".into());
        }
    }
    let mut events = Vec::new();
    for e in batch[1].as_array().ok_or("events are not an array")? {
        let fields = e.as_array().ok_or("an event is not an array")?;
        let tag = fields.first().and_then(|t| t.as_str()).ok_or("no tag")?;
        let hashes = |v: &rmpv::Value| -> Result<Vec<u64>, String> {
            v.as_array().ok_or("hashes")?.iter().map(hash_of).collect()
        };
        events.push(match tag {
            "BlockStored" => {
                if fields.len() < 5 {
                    return Err("BlockStored needs 4 fields".into());
                }
                let parent = if fields[2].is_nil() {
                    0
                } else {
                    hash_of(&fields[2])?
                };
                let tokens = fields[3]
                    .as_array()
                    .ok_or("tokens")?
                    .iter()
                    .map(|t| t.as_u64().map(|t| t as u32).ok_or("token"))
                    .collect::<Result<_, _>>()?;
                if let Some(medium) = fields.get(6) {
                    if !medium.is_nil() && !medium.is_str() {
                        return Err("medium".into());
                    }
                }
                Decoded::Stored {
                    hashes: hashes(&fields[1])?,
                    parent,
                    tokens,
                    block_size: fields[4].as_i64().ok_or("block_size")?,
                }
            }
            "BlockRemoved" => Decoded::Removed {
                hashes: hashes(&fields[1])?,
            },
            "AllBlocksCleared" => Decoded::AllCleared,
            other => return Err(format!("unknown tag {other}: the whole batch is dropped")),
        });
    }
    Ok((pod, model, seq, events))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_events_decode_as_llm_d_decodes_them() {
    use zeromq::{Socket, SocketRecv};
    let config = rill_engine::serve::ServeConfig {
        kv_cache_bytes: 1 << 20,
        kv_events: true,
        ..small_config()
    };
    let s = TestServer::start(tiny(), config, ServerOptions::default()).await;
    let publisher = rill_server::kv_events::KvEventPublisher::bind(
        "tcp://127.0.0.1:0",
        "kv@127.0.0.1:8000@tiny".into(),
    )
    .await
    .unwrap();
    let endpoint = publisher.endpoint().to_string();
    tokio::spawn(publisher.run(s.handle.take_kv_events().unwrap()));
    assert!(s.handle.take_kv_events().is_none(), "taken once");
    let mut sub = zeromq::SubSocket::new();
    sub.connect(&endpoint).await.unwrap();
    sub.subscribe("kv@").await.unwrap();

    // A subscription reaches a PUB socket some time after connecting, and PUB drops what no one
    // subscribed to: send distinct prompts until one's blocks arrive (counting events, not time).
    let blocks = s.handle.kv_stats().blocks_total;
    let prompt = |i: usize| format!("{i:04}") + &"x".repeat(44);
    // The first message is taken by a task of its own; the test sends a request at a time and
    // checks after each whether it came.
    let (first_tx, mut first_rx) = tokio::sync::oneshot::channel();
    let receiver = tokio::spawn(async move {
        let m = sub.recv().await.unwrap();
        let _ = first_tx.send(m.into_vec());
        sub
    });
    let mut sent: Vec<Value> = Vec::new();
    let frames = loop {
        if let Ok(frames) = first_rx.try_recv() {
            break frames;
        }
        let i = sent.len();
        assert!(i < 10_000, "no KV event came");
        let r = post(
            &s.base,
            "/v1/completions",
            &json!({ "prompt": prompt(i), "max_tokens": 1 }),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let ids = post(&s.base, "/tokenize", &json!({ "prompt": prompt(i) })).await;
        sent.push(ids.json["tokens"].clone());
    };
    let mut sub = receiver.await.unwrap();
    let i = sent.len();
    let (pod, model, mut last_seq, events) = decode_like_llmd(&frames).unwrap();
    assert_eq!((pod.as_str(), model.as_str()), ("127.0.0.1:8000", "tiny"));
    // One of the prompts sent: its full blocks (16 positions each), with no parent.
    let sent: Vec<Vec<u32>> = sent
        .iter()
        .map(|ids| {
            ids.as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    assert!(
        events.iter().any(
            |e| matches!(e, Decoded::Stored { hashes, parent: 0, tokens, block_size: 16 }
            if sent.iter().any(|ids| {
                let full = ids.len() / 16 * 16;
                hashes.len() == full / 16 && tokens[..] == ids[..full]
            }))
        ),
        "{events:?}"
    );

    // Fill the cache several times over: evictions come as BlockRemoved naming blocks stored
    // before, and sequence numbers count up by one.
    let mut known: std::collections::HashSet<u64> = std::collections::HashSet::new();
    for e in &events {
        if let Decoded::Stored { hashes, .. } = e {
            known.extend(hashes);
        }
    }
    let mut removed = 0;
    for j in 0..blocks {
        let r = post(
            &s.base,
            "/v1/completions",
            &json!({ "prompt": prompt(i + j), "max_tokens": 1 }),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    // The last request's batch has been sent once the loop ran past it.
    s.handle.next_step().unwrap().await.unwrap();
    loop {
        let m = tokio::time::timeout(HANG_GUARD, sub.recv())
            .await
            .expect("the KV events stopped")
            .unwrap();
        let (_, _, seq, events) = decode_like_llmd(&m.into_vec()).unwrap();
        assert_eq!(seq, last_seq + 1);
        last_seq = seq;
        for e in events {
            match e {
                Decoded::Stored { hashes, .. } => known.extend(hashes),
                Decoded::Removed { hashes } => {
                    for h in hashes {
                        assert!(known.remove(&h), "removed {h} was never stored");
                        removed += 1;
                    }
                }
                Decoded::AllCleared => known.clear(),
            }
        }
        if removed > 0 && known.len() <= blocks {
            break;
        }
    }
    assert!(removed > 0, "no eviction reported");
    assert!(
        known.len() <= blocks,
        "{} blocks known, {blocks} in the cache",
        known.len()
    );
}
