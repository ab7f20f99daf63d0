//! Encoders (BERT, nomic-bert) served: `/v1/embeddings` and Ollama's `/api/embed` embed texts
//! through the WordPiece tokenizer and the bidirectional model, pooled as the file says (bert:
//! CLS, nomic-bert: mean), close to transformers' vectors (`tests/data/tiny/*/reference.json`, the
//! fast path: cosine above 0.999); every generating endpoint refuses them with a 400 in its
//! dialect's shape.

mod common;

use std::path::PathBuf;

use common::*;
use rill_engine::{Engine, Precision};
use rill_server::ServerOptions;
use serde_json::{json, Value};

fn folder(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/tiny")
        .join(model)
}

async fn server(model: &str) -> TestServer {
    let engine = Engine::load(folder(model).join("model.gguf"), 1, Precision::Fast).unwrap();
    TestServer::start(engine, small_config(), ServerOptions::default()).await
}

fn vector(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn texts_embed_as_transformers_does() {
    for (model, pooling) in [("bert-tiny", "cls"), ("nomic-bert-tiny", "mean")] {
        texts_embed(model, pooling).await;
    }
}

async fn texts_embed(model: &str, pooling: &str) {
    let s = server(model).await;
    let reference = std::fs::read_to_string(folder(model).join("reference.json")).unwrap();
    let doc: Value = serde_json::from_str(&reference).unwrap();
    let cases: Vec<&Value> = (doc["cases"].as_array().unwrap().iter())
        .filter(|c| c["text"].is_string())
        .collect();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let r = post(&s.base, "/v1/embeddings", &json!({"input": texts})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let tokens: usize = cases
        .iter()
        .map(|c| c["token_ids"].as_array().unwrap().len())
        .sum();
    assert_eq!(
        r.json["usage"]["prompt_tokens"], tokens,
        "[CLS] ... [SEP] each"
    );
    for (i, case) in cases.iter().enumerate() {
        let got = vector(&r.json["data"][i]["embedding"]);
        let cos = cosine(&got, &vector(&case[pooling]));
        assert!(cos > 0.999, "{model} {}: cosine {cos}", case["id"]);
    }
    let r = post(&s.base, "/api/embed", &json!({"input": [texts[0]]})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let got = vector(&r.json["embeddings"][0]);
    assert!(cosine(&got, &vector(&cases[0][pooling])) > 0.999);
    // Past the context (bert-tiny: the 128 positions it learned; nomic-bert-tiny: 2,048): each
    // dialect's 400 (Ollama truncates).
    let long = "fox ".repeat(s.handle.model_info().context + 10);
    let r = post(&s.base, "/v1/embeddings", &json!({"input": long})).await;
    assert_eq!(r.status, 400, "{}", r.text);
    r.assert_error_shape();
    let r = post(&s.base, "/api/embed", &json!({"input": long})).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generating_endpoints_refuse_an_encoder_in_their_own_shape() {
    let s = server("bert-tiny").await;
    let user = json!([{"role": "user", "content": "hi"}]);
    for (path, body) in [
        ("/v1/completions", json!({"prompt": "hi"})),
        ("/v1/chat/completions", json!({"messages": user})),
        ("/v1/responses", json!({"input": "hi"})),
    ] {
        let r = post(&s.base, path, &body).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text);
        r.assert_error_shape();
        assert_eq!(r.json["error"]["code"], "model_not_generative", "{path}");
        assert!(r.error_message().contains("/v1/embeddings"), "{path}");
    }
    let r = post(
        &s.base,
        "/v1/messages",
        &json!({"max_tokens": 5, "messages": user}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.json["type"], "error");
    assert_eq!(r.json["error"]["type"], "invalid_request_error");
    for (path, body) in [
        ("/api/generate", json!({"prompt": "hi"})),
        ("/api/chat", json!({"messages": user})),
    ] {
        let r = post(&s.base, path, &body).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text);
        assert!(
            r.json["error"].as_str().unwrap().contains("encoder"),
            "{path}"
        );
    }
}
