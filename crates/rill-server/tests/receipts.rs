//! Reproducibility receipts of server responses: recorded for every plain completion, named by
//! the `x-rill-receipt` header, and replayed bit for bit through the serving loop.

mod common;

use common::*;
use serde_json::json;

fn receipt_header(r: &Reply) -> String {
    r.headers
        .get("x-rill-receipt")
        .unwrap_or_else(|| panic!("no receipt header: {}", r.text))
        .to_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampled_response_replays_bit_for_bit() {
    let s = TestServer::tiny().await;
    let r = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "the keeper", "max_tokens": 12, "temperature": 0.9, "n": 2, "seed": 7 }),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let path = receipt_header(&r);
    let id = r.json["id"].as_str().unwrap();
    assert_eq!(path, format!("/v1/rill/receipts/{id}"));
    let receipt = get(&s.base, &path).await;
    assert_eq!(receipt.status, 200, "{}", receipt.text);
    let doc = &receipt.json;
    assert_eq!(doc["rill_receipt"], 1);
    assert_eq!(doc["response_id"], id);
    assert_eq!(doc["model"]["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(doc["params"]["seed"], 7);
    assert_eq!(doc["params"]["max_tokens"], 12);
    assert_eq!(doc["n"], 2);
    let choices = doc["choices"].as_array().unwrap();
    let tokens: usize = choices
        .iter()
        .map(|c| c["tokens"].as_array().unwrap().len())
        .sum();
    assert_eq!(
        tokens as u64,
        r.json["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for (c, choice) in choices.iter().enumerate() {
        assert_eq!(
            choice["text"], r.json["choices"][c]["text"],
            "choice {c}'s text"
        );
    }

    // Replayed by id, and from the receipt itself, beside another request.
    let other = tokio::spawn({
        let base = s.base.clone();
        async move {
            post(
                &base,
                "/v1/completions",
                &json!({ "prompt": "another", "max_tokens": 16 }),
            )
            .await
        }
    });
    let replay = post(&s.base, "/v1/rill/replay", &json!({ "id": id })).await;
    assert_eq!(replay.status, 200, "{}", replay.text);
    assert_eq!(replay.json["identical"], true, "{}", replay.text);
    assert_eq!(replay.json["tokens"], tokens);
    other.await.unwrap();
    let again = post(&s.base, "/v1/rill/replay", &json!({ "receipt": doc })).await;
    assert_eq!(again.json["identical"], true, "{}", again.text);

    // A changed token is found where it was changed.
    let mut changed = doc.clone();
    let first = changed["choices"][1]["tokens"][2].as_u64().unwrap();
    changed["choices"][1]["tokens"][2] = json!((first + 1) % 50);
    let diff = post(&s.base, "/v1/rill/replay", &json!({ "receipt": changed })).await;
    assert_eq!(diff.status, 200, "{}", diff.text);
    assert_eq!(diff.json["identical"], false);
    assert_eq!(diff.json["first_difference"]["choice"], 1);
    assert_eq!(diff.json["first_difference"]["index"], 2);
    // Another model's receipt, or another precision's, is refused.
    let mut other_model = doc.clone();
    other_model["model"]["sha256"] = json!("0".repeat(64));
    let r = post(
        &s.base,
        "/v1/rill/replay",
        &json!({ "receipt": other_model }),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.text);
    let mut other_path = doc.clone();
    let flipped = if doc["precision"] == "fast" {
        "exact"
    } else {
        "fast"
    };
    other_path["precision"] = json!(flipped);
    let r = post(
        &s.base,
        "/v1/rill/replay",
        &json!({ "receipt": other_path }),
    )
    .await;
    assert_eq!(r.status, 409, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chats_have_receipts_and_constrained_ones_do_not() {
    let s = TestServer::tiny().await;
    let body = json!({
        "messages": [{ "role": "user", "content": "hello there" }],
        "max_tokens": 8,
        "stream": true,
        "temperature": 0.7,
    });
    let r = post(&s.base, "/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let path = receipt_header(&r);
    let id = path.rsplit('/').next().unwrap();
    let replay = post(&s.base, "/v1/rill/replay", &json!({ "id": id })).await;
    assert_eq!(replay.json["identical"], true, "{}", replay.text);
    assert!(replay.json["tokens"].as_u64().unwrap() > 0);

    let constrained = post(
        &s.base,
        "/v1/completions",
        &json!({ "prompt": "x", "max_tokens": 4, "structured_outputs": { "choice": ["yes", "no"] } }),
    )
    .await;
    assert_eq!(constrained.status, 200, "{}", constrained.text);
    assert!(constrained.headers.get("x-rill-receipt").is_none());

    // Unknown ids and bad bodies.
    let r = get(&s.base, "/v1/rill/receipts/cmpl-nothing").await;
    assert_eq!(r.status, 404, "{}", r.text);
    for bad in [
        json!({}),
        json!({ "receipt": { "rill_receipt": 9 } }),
        json!({ "receipt": [1] }),
    ] {
        let r = post(&s.base, "/v1/rill/replay", &bad).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text);
    }
}
