//! The glass-box API (docs/glass-box-api.md) over real loopback HTTP on the tiny synthetic
//! model: `explain` on both generation endpoints, forking from a step through the prefix cache,
//! the full distribution, beam search and speculative decoding traces, the model's shapes, and
//! the web page's files (embedded, self-contained, and safe to serve from a folder).

mod common;

use base64::Engine as _;
use common::*;
use rill_server::ServerOptions;
use serde_json::{json, Value};

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// The `rill` objects of a stream's token chunks.
fn explained(st: &Streamed) -> Vec<Value> {
    st.chunks()
        .filter_map(|c| c["choices"][0].get("rill").cloned())
        .collect()
}

const LONG_MESSAGE: &str = "tell me a story about a lighthouse keeper and the sea";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_streams_every_token_with_its_candidates_step_and_cost() {
    let s = TestServer::tiny().await;
    let body = json!({
        "messages": [{ "role": "user", "content": LONG_MESSAGE }],
        "max_tokens": 10, "temperature": 0.8, "top_k": 20, "seed": 3, "ignore_eos": true,
        "stream": true, "explain": true, "stream_options": { "include_usage": true },
    });
    let st = stream(&s.base, "/v1/chat/completions", &body).await;
    assert_eq!(st.status, 200);
    assert!(st.ended_with_done());
    let tokens = explained(&st);
    assert_eq!(tokens.len(), 10, "one rill object per token");
    let model = get(&s.base, "/v1/rill/model").await.json;
    let prompt = post(
        &s.base,
        "/tokenize",
        &json!({ "messages": [{ "role": "user", "content": LONG_MESSAGE }] }),
    )
    .await;
    let prompt_ids = ids(&prompt.json["tokens"]);
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(t["index"], i);
        assert_eq!(t["position"], prompt_ids.len() + i);
        assert_eq!(t["rule"], "sampled");
        let p = t["probability"].as_f64().unwrap();
        assert!(p > 0.0 && p <= 1.0, "{t}");
        // Why this token, literally: the uniform drawn fell in the token's cumulative interval.
        let draw = &t["draw"];
        let (u, from, to) = (
            draw["uniform"].as_f64().unwrap(),
            draw["from"].as_f64().unwrap(),
            draw["to"].as_f64().unwrap(),
        );
        assert!(from <= u && u < to, "{draw}");
        assert!((to - from - p).abs() < 1e-6, "{draw} {p}");
        // The chosen token is among the processed candidates, with the probability reported.
        let processed = t["processed_top"].as_array().unwrap();
        assert!(processed.len() <= 20 && !processed.is_empty());
        let chosen = processed
            .iter()
            .find(|c| c["token"] == t["token"])
            .unwrap_or_else(|| panic!("chosen token not among the candidates: {t}"));
        assert!((chosen["logprob"].as_f64().unwrap().exp() - p).abs() < 1e-5);
        assert_eq!(t["top"].as_array().unwrap().len(), 20);
        assert!(t["raw_entropy"].as_f64().unwrap() > 0.0);
        assert!(t["token_text"].is_string());
        let step = &t["step"];
        assert_eq!(
            step["rows"].as_u64().unwrap(),
            step["prefill_rows"].as_u64().unwrap() + step["decode_rows"].as_u64().unwrap()
        );
        assert!(step["requests"].as_u64().unwrap() >= 1);
        assert_eq!(t["kv"]["block_size"], model["kv_block_size"]);
        assert!(t["kv"]["bytes"].as_u64().unwrap() > 0);
        assert!(t["cost"]["flops"].as_u64().unwrap() > model["flops_per_token"].as_u64().unwrap());
        assert_eq!(t["cost"]["weight_bytes"], model["weight_bytes"]);
        // OpenAI's own field stays as asked: not at all.
        let choice = st
            .chunks()
            .filter(|c| c["choices"][0].get("rill").is_some())
            .nth(i)
            .unwrap();
        assert!(choice["choices"][0]["logprobs"].is_null());
    }
    let first = &tokens[0]["prompt"];
    assert_eq!(ids(&first["tokens"]), prompt_ids);
    assert_eq!(
        first["computed_tokens"].as_u64().unwrap() + first["cached_tokens"].as_u64().unwrap(),
        prompt_ids.len() as u64
    );
    assert!(tokens[1].get("prompt").is_none());

    // The whole response carries the same objects; without `explain`, none.
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    whole.as_object_mut().unwrap().remove("stream_options");
    let w = post(&s.base, "/v1/chat/completions", &whole).await;
    assert_eq!(w.status, 200, "{}", w.text);
    let wt = w.json["choices"][0]["rill"]["tokens"].as_array().unwrap();
    assert_eq!(wt.len(), 10);
    for (a, b) in wt.iter().zip(&tokens) {
        assert_eq!(a["token"], b["token"], "seeded: the same tokens");
        assert_eq!(a["top"], b["top"]);
    }
    whole.as_object_mut().unwrap().remove("explain");
    let plain = post(&s.base, "/v1/chat/completions", &whole).await;
    assert!(plain.json["choices"][0].get("rill").is_none());
    assert_eq!(
        plain.json["choices"][0]["message"],
        w.json["choices"][0]["message"]
    );
    let bad = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "x", "explain": "yes" }),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.error_param(), Some("explain"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_continues_from_the_chosen_alternative_reusing_the_cached_prefix() {
    let s = TestServer::tiny().await;
    let st = stream(
        &s.base,
        "/v1/chat/completions",
        &json!({
            "messages": [{ "role": "user", "content": LONG_MESSAGE }],
            "max_tokens": 8, "temperature": 0, "ignore_eos": true,
            "stream": true, "explain": true,
        }),
    )
    .await;
    let tokens = explained(&st);
    let prompt = ids(&tokens[0]["prompt"]["tokens"]);
    // Fork at step 3 with the second most likely raw candidate.
    let step = 3;
    let alt = tokens[step]["top"][1]["token"].as_u64().unwrap() as u32;
    assert_ne!(json!(alt), tokens[step]["token"]);
    let mut fork_prompt = prompt.clone();
    fork_prompt.extend(
        tokens[..step]
            .iter()
            .map(|t| t["token"].as_u64().unwrap() as u32),
    );
    fork_prompt.push(alt);
    let fork = stream(
        &s.base,
        "/v1/completions",
        &json!({
            "prompt": fork_prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true,
            "stream": true, "explain": true, "stream_options": { "include_usage": true },
        }),
    )
    .await;
    assert_eq!(fork.status, 200);
    let forked = explained(&fork);
    assert_eq!(forked.len(), 4);
    assert_eq!(forked[0]["position"], fork_prompt.len());
    let cached = forked[0]["prompt"]["cached_tokens"].as_u64().unwrap();
    // Every position of the shared prefix came from the cache (the last block's part-way).
    let block = forked[0]["kv"]["block_size"].as_u64().unwrap();
    assert!(prompt.len() as u64 >= block, "the prompt spans a block");
    assert_eq!(cached, fork_prompt.len() as u64 - 1);
    assert_eq!(
        fork.usage().unwrap()["prompt_tokens_details"]["cached_tokens"],
        cached
    );
    // The fork's first token is what the distribution after its prompt says (greedy).
    let d = post(
        &s.base,
        "/v1/rill/distribution",
        &json!({ "tokens": fork_prompt }),
    )
    .await;
    assert_eq!(d.json["top"][0]["token"], forked[0]["token"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_distribution_is_the_full_raw_softmax_after_a_prefix() {
    let s = TestServer::tiny().await;
    let prompt: Vec<u32> = "the keeper climbed the stairs at dusk"
        .bytes()
        .map(u32::from)
        .collect();
    let d = post(
        &s.base,
        "/v1/rill/distribution",
        &json!({ "tokens": prompt }),
    )
    .await;
    assert_eq!(d.status, 200, "{}", d.text);
    let vocab = d.json["vocab_size"].as_u64().unwrap() as usize;
    assert_eq!(d.json["tokens"], prompt.len());
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(d.json["logits"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes.len(), vocab * 4);
    let logits: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_z = max
        + logits
            .iter()
            .map(|&l| (l as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let top = d.json["top"].as_array().unwrap();
    assert_eq!(top.len(), 100);
    for w in top.windows(2) {
        assert!(w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64());
    }
    for t in top {
        let id = t["token"].as_u64().unwrap() as usize;
        let want = logits[id] as f64 - log_z;
        assert!((t["logprob"].as_f64().unwrap() - want).abs() < 1e-9, "{t}");
        assert!(t["text"].is_string());
    }
    // Greedy generation picks its top token.
    let g = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": true,
                 "logprobs": 1 }),
    )
    .await;
    let first = &g.json["choices"][0]["logprobs"]["top_logprobs"][0];
    let (text, lp) = first.as_object().unwrap().iter().next().unwrap();
    assert_eq!(text, top[0]["text"].as_str().unwrap());
    assert!((lp.as_f64().unwrap() - top[0]["logprob"].as_f64().unwrap()).abs() < 1e-6);
    // Asked again, the prefix comes from the cache.
    let again = post(
        &s.base,
        "/v1/rill/distribution",
        &json!({ "tokens": prompt }),
    )
    .await;
    assert_eq!(again.json["logits"], d.json["logits"]);
    assert!(again.json["cached_tokens"].as_u64().unwrap() > 0);
    // Text and messages are tokenized as the generation endpoints do.
    let text = post(
        &s.base,
        "/v1/rill/distribution",
        &json!({ "prompt": "the keeper" }),
    )
    .await;
    assert_eq!(text.json["tokens"], 10);
    let chat = post(
        &s.base,
        "/v1/rill/distribution",
        &json!({ "messages": [{ "role": "user", "content": "hi" }] }),
    )
    .await;
    assert_eq!(chat.status, 200, "{}", chat.text);

    for (body, param) in [
        (json!({ "tokens": [] }), "tokens"),
        (json!({ "tokens": [1, 99999] }), "tokens"),
        (json!({ "tokens": "abc" }), "tokens"),
        (json!({ "tokens": [1], "prompt": "x" }), "prompt"),
        (json!({}), "prompt"),
        (json!({ "tokens": vec![65; 400] }), "tokens"),
    ] {
        let r = post(&s.base, "/v1/rill/distribution", &body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text);
        r.assert_error_shape();
        assert_eq!(r.error_param(), Some(param), "{body}: {}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beam_search_returns_its_whole_tree() {
    let s = TestServer::tiny().await;
    let r = post(
        &s.base,
        "/v1/rill/beam",
        &json!({ "prompt": "the keeper", "width": 3, "max_tokens": 5, "ignore_eos": true }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let j = &r.json;
    assert_eq!(j["width"], 3);
    let hyps = j["hypotheses"].as_array().unwrap();
    assert_eq!(hyps.len(), 3);
    for w in hyps.windows(2) {
        assert!(w[0]["score"].as_f64() >= w[1]["score"].as_f64());
    }
    let nodes = j["nodes"].as_array().unwrap();
    assert!(nodes.len() >= 3 * 5);
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["id"], i);
        if let Some(p) = n["parent"].as_u64() {
            let parent = &nodes[p as usize];
            assert_eq!(
                parent["step"].as_u64().unwrap() + 1,
                n["step"].as_u64().unwrap()
            );
            assert_ne!(
                parent["status"], "pruned",
                "pruned nodes are never extended"
            );
        } else {
            assert_eq!(n["step"], 0);
        }
        assert!(["kept", "pruned", "finished"].contains(&n["status"].as_str().unwrap()));
    }
    // Each hypothesis is the path to its node.
    for h in hyps {
        let mut path = Vec::new();
        let mut at = h["node"].as_u64();
        while let Some(i) = at {
            path.push(nodes[i as usize]["token"].as_u64().unwrap() as u32);
            at = nodes[i as usize]["parent"].as_u64();
        }
        path.reverse();
        assert_eq!(path, ids(&h["tokens"]));
    }
    for (body, param) in [
        (json!({ "prompt": "x", "width": 17 }), "width"),
        (json!({ "prompt": "x", "max_tokens": 0 }), "max_tokens"),
        (
            json!({ "prompt": "x", "early_stopping": "soon" }),
            "early_stopping",
        ),
        (
            json!({ "prompt": "x", "length_penalty": "big" }),
            "length_penalty",
        ),
        (json!({ "width": 2 }), "prompt"),
    ] {
        let r = post(&s.base, "/v1/rill/beam", &body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text);
        assert_eq!(r.error_param(), Some(param), "{body}: {}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_rounds_retell_the_generation() {
    let s = TestServer::tiny().await;
    for draft in [
        json!({ "draft": "ngram" }),
        json!({ "draft": "layers", "draft_layers": 1 }),
    ] {
        let mut body = json!({
            "prompt": "abcabcabcabcabcabcabc", "max_tokens": 24, "draft_tokens": 3,
            "ignore_eos": true,
        });
        body.as_object_mut()
            .unwrap()
            .extend(draft.as_object().unwrap().clone());
        let r = post(&s.base, "/v1/rill/speculative", &body).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let j = &r.json;
        let tokens: Vec<Value> = j["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["token"].clone())
            .collect();
        assert_eq!(tokens.len(), 24);
        let mut retold = vec![tokens[0].clone()];
        let mut accepted = 0;
        for round in j["rounds"].as_array().unwrap() {
            let k = round["accepted"].as_u64().unwrap() as usize;
            accepted += k;
            let drafted = round["drafted"].as_array().unwrap();
            assert!(k <= drafted.len() && drafted.len() <= 3);
            retold.extend(drafted[..k].iter().map(|d| d["token"].clone()));
            if !round["next"].is_null() {
                retold.push(round["next"]["token"].clone());
                let rule = round["next"]["rule"].as_str().unwrap();
                assert_eq!(rule == "corrected", k < drafted.len());
            }
        }
        assert_eq!(retold, tokens, "{draft}");
        assert_eq!(j["accepted"], accepted);
        // Greedy: exactly what plain generation gives.
        let plain = post(
            &s.base,
            "/v1/completions",
            &json!({ "prompt": "abcabcabcabcabcabcabc", "max_tokens": 24, "temperature": 0,
                     "ignore_eos": true }),
        )
        .await;
        assert_eq!(j["text"], plain.json["choices"][0]["text"], "{draft}");
    }
    let m = get(&s.base, "/metrics").await;
    assert!(
        m.text.contains("rill_speculative_generations_total 2"),
        "{}",
        m.text
    );
    for (body, param) in [
        (json!({ "prompt": "x", "draft": "oracle" }), "draft"),
        (json!({ "prompt": "x", "draft_tokens": 0 }), "draft_tokens"),
        (
            json!({ "prompt": "x", "draft": "layers", "draft_layers": 99 }),
            "draft_layers",
        ),
        (json!({ "prompt": "x", "max_tokens": 100000 }), "max_tokens"),
        (json!({ "prompt": "x", "temperature": -1 }), "temperature"),
    ] {
        let r = post(&s.base, "/v1/rill/speculative", &body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.text);
        assert_eq!(r.error_param(), Some(param), "{body}: {}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_endpoint_and_the_api_key() {
    let s = TestServer::start(
        tiny(),
        small_config(),
        ServerOptions {
            api_key: Some("k".into()),
            ..ServerOptions::default()
        },
    )
    .await;
    let denied = get(&s.base, "/v1/rill/model").await;
    assert_eq!(denied.status, 401);
    let m = send(
        client()
            .get(s.url("/v1/rill/model"))
            .header("authorization", "Bearer k"),
    )
    .await;
    assert_eq!(m.status, 200, "{}", m.text);
    let c = s.handle.model_summary();
    assert_eq!(m.json["n_layers"], c.config.n_layers);
    assert_eq!(m.json["vocab_size"], c.config.vocab_size);
    assert_eq!(m.json["flops_per_token"], c.cost.flops_per_token);
    assert_eq!(m.json["kv_bytes_per_token"], c.kv_bytes_per_token);
    assert_eq!(m.json["architecture"], "llama");
    // The page itself needs no key (it asks for one when the API does).
    let page = get(&s.base, "/").await;
    assert_eq!(page.status, 200);
}

/// Every local file a page or module refers to (`src=`, `href=`, `import ... from`).
fn references(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for marker in [
        "src=\"",
        "href=\"",
        "from \"",
        "from '",
        "import(\"",
        "import('",
    ] {
        let mut rest = text;
        while let Some(i) = rest.find(marker) {
            rest = &rest[i + marker.len()..];
            let end = rest.find(['"', '\'']).unwrap_or(rest.len());
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_whole_and_self_contained() {
    let s = TestServer::tiny().await;
    let page = get(&s.base, "/").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.headers["content-type"].to_str().unwrap(),
        "text/html; charset=utf-8"
    );
    // Walk every reference from the page: all local, all served.
    let mut todo = vec![("/".to_string(), page.text.clone())];
    let mut seen = std::collections::BTreeSet::new();
    while let Some((from, text)) = todo.pop() {
        for r in references(&text) {
            assert!(
                !r.starts_with("http:") && !r.starts_with("https:") && !r.starts_with("//"),
                "{from} refers outside: {r}"
            );
            if r.starts_with('#') || r.starts_with("data:") || r.is_empty() {
                continue;
            }
            let base = if from.ends_with('/') {
                from.clone()
            } else {
                from[..=from.rfind('/').unwrap()].to_string()
            };
            let mut path = if r.starts_with('/') {
                r.clone()
            } else {
                format!("{base}{r}")
            };
            path = path.replace("/./", "/");
            if !seen.insert(path.clone()) {
                continue;
            }
            let got = get(&s.base, &path).await;
            assert_eq!(got.status, 200, "{from} refers to {path}");
            if path.ends_with(".js") {
                assert!(got.headers["content-type"]
                    .to_str()
                    .unwrap()
                    .starts_with("text/javascript"));
                todo.push((path, got.text));
            }
        }
    }
    assert!(seen.iter().any(|p| p.ends_with(".js")), "{seen:?}");
    assert!(seen.iter().any(|p| p.ends_with(".css")), "{seen:?}");
    // Unknown paths are still OpenAI-shaped 404s.
    let missing = get(&s.base, "/nope.js").await;
    assert_eq!(missing.status, 404);
    missing.assert_error_shape();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_folder_serves_only_its_own_files() {
    let dir = std::env::temp_dir().join(format!("rill-web-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("js")).unwrap();
    std::fs::write(dir.join("index.html"), "<p>dev page</p>").unwrap();
    std::fs::write(dir.join("js/a.js"), "export const a = 1;").unwrap();
    std::fs::write(dir.join("js/.hidden"), "HIDDEN-CONTENT").unwrap();
    std::fs::write(dir.with_extension("secret"), "OUTSIDE-CONTENT").unwrap();
    let s = TestServer::start(
        tiny(),
        small_config(),
        ServerOptions {
            web_dir: Some(dir.clone()),
            ..ServerOptions::default()
        },
    )
    .await;
    assert_eq!(get(&s.base, "/").await.text, "<p>dev page</p>");
    assert_eq!(get(&s.base, "/js/a.js").await.text, "export const a = 1;");
    let name = dir.with_extension("secret");
    let name = name.file_name().unwrap().to_str().unwrap();
    for path in [
        "/js/.hidden".to_string(),
        format!("/../{name}"),
        format!("/js/../../{name}"),
        format!("/%2e%2e/{name}"),
        "/js/sub/a.js".to_string(),
    ] {
        let (status, body) = raw_get(&s.base, &path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(
            !body.contains("HIDDEN-CONTENT") && !body.contains("OUTSIDE-CONTENT"),
            "{path}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_file(dir.with_extension("secret")).unwrap();
}

/// A GET with the path sent exactly as given (no client-side normalisation of `..`).
async fn raw_get(base: &str, path: &str) -> (u16, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let (_, reply) = raw_request(base, request.as_bytes(), |_| false).await;
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_logit_lens_reads_every_layer_and_ends_at_the_model_output() {
    let s = TestServer::tiny().await;
    let r = post(
        &s.base,
        "/v1/rill/lens",
        &json!({ "prompt": "the keeper", "top": 4 }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let j = &r.json;
    let layers = j["layers"].as_array().unwrap();
    let n_layers = s.handle.model_summary().config.n_layers;
    assert_eq!(layers.len(), n_layers + 1, "the embeddings and every block");
    for (i, l) in layers.iter().enumerate() {
        assert_eq!(l["layer"], i);
        assert_eq!(l["top"].as_array().unwrap().len(), 4);
        assert!(l["top"][0]["text"].is_string());
        assert!(l["residual_norm"].as_f64().unwrap() > 0.0);
    }
    let last = layers.last().unwrap();
    assert_eq!(last["chosen_rank"], 0);
    assert_eq!(last["top"][0]["token"], j["chosen"]);
    assert_eq!(last["kl_to_final"], 0.0);
    assert!(j.get("attention").is_none(), "attention only when asked");
    let a = post(
        &s.base,
        "/v1/rill/lens",
        &json!({ "prompt": "the keeper", "attention": true }),
    )
    .await;
    let att = a.json["attention"].as_array().unwrap();
    assert_eq!(att.len(), n_layers);
    let n_tokens = post(&s.base, "/tokenize", &json!({ "prompt": "the keeper" }))
        .await
        .json["count"]
        .as_u64()
        .unwrap() as usize;
    for heads in att {
        for w in heads.as_array().unwrap() {
            let w: Vec<f64> = w
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(w.len(), n_tokens);
            assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-4);
        }
    }
    // Value-weighted attention, per-head attribution and windows.
    let v = post(
        &s.base,
        "/v1/rill/lens",
        &json!({ "prompt": "the keeper", "attention": true, "value_weighted": true }),
    )
    .await;
    assert_eq!(v.status, 200, "{}", v.text);
    let n_heads = s.handle.model_summary().config.n_heads;
    let weighted = v.json["value_weighted"].as_array().unwrap();
    assert_eq!(weighted.len(), n_layers);
    assert_eq!(weighted[0].as_array().unwrap().len(), n_heads);
    assert_eq!(v.json["windows"].as_array().unwrap().len(), n_layers);
    for l in &v.json["layers"].as_array().unwrap()[1..] {
        let w = &l["writes"];
        let heads: f64 = w["head_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .sum();
        let sum = heads + w["attention_bias_logit"].as_f64().unwrap();
        let whole = w["attention_logit"].as_f64().unwrap();
        assert_eq!(w["head_logits"].as_array().unwrap().len(), n_heads);
        assert!(
            (sum - whole).abs() < 0.05 * (1.0 + whole.abs()),
            "{sum} vs {whole}"
        );
    }
    // The last layer is what the distribution endpoint computes for the same prompt.
    let d = post(
        &s.base,
        "/v1/rill/distribution",
        &json!({ "prompt": "the keeper" }),
    )
    .await;
    assert_eq!(d.json["top"][0]["token"], j["chosen"]);
    assert_eq!(j["most_likely"], j["chosen"]);
    // Following another token (a sampled one): its rank and logit, the most likely still named.
    let second = last["top"][1]["token"].clone();
    let f = post(
        &s.base,
        "/v1/rill/lens",
        &json!({ "prompt": "the keeper", "token": second }),
    )
    .await;
    assert_eq!(f.status, 200, "{}", f.text);
    assert_eq!(f.json["chosen"], second);
    assert_eq!(f.json["most_likely"], j["chosen"]);
    assert_eq!(f.json["most_likely_text"], j["chosen_text"]);
    let f_last = f.json["layers"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(f_last["chosen_rank"], 1);
    assert_eq!(f.json["settled_at"], layers.len());
    let vocab = s.handle.model_summary().config.vocab_size;
    let r = post(
        &s.base,
        "/v1/rill/lens",
        &json!({ "prompt": "x", "token": vocab }),
    )
    .await;
    assert_eq!(
        (r.status, r.error_param()),
        (400, Some("token")),
        "{}",
        r.text
    );
    // Bad input.
    let r = post(&s.base, "/v1/rill/lens", &json!({ "tokens": [] })).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let r = post(
        &s.base,
        "/v1/rill/lens",
        &json!({ "prompt": "x", "top": 99 }),
    )
    .await;
    assert_eq!(
        (r.status, r.error_param()),
        (400, Some("top")),
        "{}",
        r.text
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detokenize_gives_each_token_as_the_model_sees_it() {
    let s = TestServer::tiny().await;
    let t = post(&s.base, "/tokenize", &json!({ "prompt": "the keeper" })).await;
    let tokens = t.json["tokens"].clone();
    let r = post(
        &s.base,
        "/detokenize",
        &json!({ "tokens": tokens, "pieces": true }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let pieces = r.json["pieces"].as_array().unwrap();
    assert_eq!(pieces.len(), tokens.as_array().unwrap().len());
    let mut text = String::new();
    for (p, id) in pieces.iter().zip(tokens.as_array().unwrap()) {
        assert_eq!(&p["token"], id);
        assert!(p["special"].is_boolean());
        let bytes: Vec<u8> = p["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        text.push_str(&String::from_utf8_lossy(&bytes));
    }
    assert!(text.ends_with("the keeper"), "{text:?}");
    // Without the flag, the answer is as before.
    let r = post(&s.base, "/detokenize", &json!({ "tokens": [1, 2] })).await;
    assert!(r.json.get("pieces").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lens_on_a_generated_context_reads_the_prefix_cache() {
    let s = TestServer::tiny().await;
    let prompt = "the keeper of the lighthouse kept the light burning through the long night, \
                  and the ships passed safely by the rocks below the cliffs";
    let g = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1 }),
    )
    .await;
    assert_eq!(g.status, 200, "{}", g.text);
    let mut tokens: Vec<Value> = post(&s.base, "/tokenize", &json!({ "prompt": prompt }))
        .await
        .json["tokens"]
        .as_array()
        .unwrap()
        .clone();
    let n_prompt = tokens.len();
    let text = g.json["choices"][0]["text"].as_str().unwrap().to_string();
    let generated = post(
        &s.base,
        "/tokenize",
        &json!({ "prompt": text, "add_special_tokens": false }),
    )
    .await
    .json["tokens"]
        .clone();
    tokens.extend(generated.as_array().unwrap().iter().take(4).cloned());
    let first = post(&s.base, "/v1/rill/lens", &json!({ "tokens": tokens })).await;
    assert_eq!(first.status, 200, "{}", first.text);
    assert!(
        first.json["cached_tokens"].as_u64().unwrap() > 0,
        "the request published its prompt's blocks: {}",
        first.json["cached_tokens"]
    );
    assert!(first.json["cached_tokens"].as_u64().unwrap() as usize <= n_prompt + 4);
    // The same context again: everything but the last block is cached now, the same answer.
    let again = post(&s.base, "/v1/rill/lens", &json!({ "tokens": tokens })).await;
    assert_eq!(again.json["layers"], first.json["layers"]);
    assert!(again.json["cached_tokens"].as_u64() >= first.json["cached_tokens"].as_u64());
    // Nothing is left held: every block is free or cached-free once the lens ends.
    wait_all_blocks_free(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counterfactuals_drop_or_replace_a_token() {
    let s = TestServer::tiny().await;
    let tokens: Vec<u64> = post(
        &s.base,
        "/tokenize",
        &json!({ "prompt": "the keeper of the light" }),
    )
    .await
    .json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let n = tokens.len();
    let r = post(
        &s.base,
        "/v1/rill/counterfactual",
        &json!({
            "tokens": tokens,
            "top": 3,
            "edits": [
                { "position": n - 2 },
                { "position": 1, "replace_with": tokens[1] },
                { "position": 1, "replace_with": 5 },
            ],
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let j = &r.json;
    assert_eq!(j["top"].as_array().unwrap().len(), 3);
    assert_eq!(j["token"], j["top"][0]["token"]);
    let edits = j["edits"].as_array().unwrap();
    assert_eq!(edits.len(), 3);
    assert_eq!(edits[0]["edit"], "drop");
    assert_eq!(edits[0]["original"], tokens[n - 2]);
    assert!(edits[0]["original_text"].is_string());
    // Replacing a token by itself changes nothing.
    assert_eq!(edits[1]["kl"], 0.0);
    assert_eq!(edits[1]["tracked_logprob"], j["tracked_logprob"]);
    assert_eq!(edits[1]["top"], j["top"]);
    assert_eq!(edits[2]["replace_with"], 5);
    // What the distribution endpoint says after the dropped context.
    let mut dropped = tokens.clone();
    dropped.remove(n - 2);
    let d = post(
        &s.base,
        "/v1/rill/distribution",
        &json!({ "tokens": dropped }),
    )
    .await;
    assert_eq!(d.json["top"][0]["token"], edits[0]["top"][0]["token"]);
    // Bad edits name the field.
    for bad in [
        json!({ "tokens": tokens, "edits": [] }),
        json!({ "tokens": tokens, "edits": [{ "position": n }] }),
        json!({ "tokens": tokens, "edits": [{ "position": 0, "replace_with": -1 }] }),
        json!({ "tokens": tokens, "edits": [{ "position": 0, "swap": 1 }] }),
        json!({ "tokens": [tokens[0]], "edits": [{ "position": 0 }] }),
    ] {
        let r = post(&s.base, "/v1/rill/counterfactual", &bad).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text);
        assert!(r.error_param().unwrap().starts_with("edits"), "{}", r.text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multiverse_branches_where_the_top_two_are_close() {
    let s = TestServer::tiny().await;
    let prompt = "the keeper of the lighthouse kept the light burning through the long night";
    let r = post(
        &s.base,
        "/v1/rill/multiverse",
        &json!({ "prompt": prompt, "max_tokens": 8, "branch_tokens": 4, "threshold": 1.0,
                 "max_branches": 3, "temperature": 0, "ignore_eos": true }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let branches = r.json["branches"].as_array().unwrap();
    let main = &branches[0];
    let main_steps = main["steps"].as_array().unwrap();
    assert_eq!(main_steps.len(), 8);
    assert_eq!(
        branches.len(),
        4,
        "threshold 1 branches at the 3 closest steps"
    );
    let sum: f64 = main_steps
        .iter()
        .map(|st| st["logprob"].as_f64().unwrap())
        .sum();
    assert!((sum - main["logprob"].as_f64().unwrap()).abs() < 1e-4);
    let prompt_ids: Vec<Value> = post(&s.base, "/tokenize", &json!({ "prompt": prompt }))
        .await
        .json["tokens"]
        .as_array()
        .unwrap()
        .clone();
    for b in &branches[1..] {
        let at = b["at"].as_u64().unwrap() as usize;
        assert_eq!(b["parent"], 0);
        assert_eq!(b["instead_of"]["token"], main_steps[at]["token"]);
        assert_ne!(b["token"]["token"], main_steps[at]["token"]);
        assert_eq!(b["steps"].as_array().unwrap().len(), 4);
        assert!(b["logprob"].as_f64().unwrap() <= 0.0);
        assert!(
            b["cached_tokens"].as_u64().unwrap() > 0,
            "from the answer's blocks: {b}"
        );
        // The branch is what a lone greedy generation from its context gives (it ran batched
        // with the other branches).
        let mut context = prompt_ids.clone();
        context.extend(main_steps[..at].iter().map(|st| st["token"].clone()));
        context.push(b["token"]["token"].clone());
        let alone = post(
            &s.base,
            "/v1/rill/multiverse",
            &json!({ "tokens": context, "max_tokens": 4, "max_branches": 0, "temperature": 0,
                     "ignore_eos": true }),
        )
        .await;
        let alone_steps = alone.json["branches"][0]["steps"]
            .as_array()
            .unwrap()
            .clone();
        let ids = |steps: &[Value]| {
            steps
                .iter()
                .map(|st| st["token"].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&alone_steps), ids(b["steps"].as_array().unwrap()));
    }
    // Bad input.
    for bad in [
        json!({ "prompt": "x", "threshold": 2 }),
        json!({ "prompt": "x", "n": 2 }),
        json!({ "prompt": "x", "stream": true }),
        json!({ "prompt": "x", "max_branches": 99 }),
    ] {
        let r = post(&s.base, "/v1/rill/multiverse", &bad).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text);
    }
}
