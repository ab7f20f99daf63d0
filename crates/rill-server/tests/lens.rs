//! The glass box's layer views over loopback HTTP on the tiny synthetic model: the logit lens
//! at every layer, detokenizing, a lens over a cached generated context, counterfactuals that
//! drop or replace a token, and the multiverse of close alternatives.

mod common;

use common::*;
use serde_json::{json, Value};

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
