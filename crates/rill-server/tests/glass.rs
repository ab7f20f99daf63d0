//! The glass-box API (docs/glass-box-api.md) over real loopback HTTP on the tiny synthetic
//! model: `explain` on both generation endpoints, forking from a step through the prefix cache,
//! the full distribution, beam search and speculative decoding traces, the model's shapes and
//! the API key. The page's files are in `page_files.rs`, the lens and counterfactuals in
//! `lens.rs`.

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
