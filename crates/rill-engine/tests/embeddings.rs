//! Embeddings against transformers (f32) on the tiny random models' checkpoints
//! (`tests/data/tiny/<model>/embeddings.json`, `tools/models/embedding_reference.py`): each
//! pooling of the exact path within 1e-5 of the reference in every coordinate (f32 against
//! f32; the 2-layer models agree to 2e-7, the reference's 7 decimals), whether the
//! inputs share one pass or are cut into passes of a few rows; and the fast path gives an input
//! the same vector alone or packed with others.

use std::path::PathBuf;

use rill_engine::{Engine, Pooling, Precision};
use serde_json::Value;

fn folder(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/tiny")
        .join(model)
}

fn reference(model: &str) -> Vec<(Vec<u32>, Value)> {
    let text = std::fs::read_to_string(folder(model).join("embeddings.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let ids = c["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            (ids, c.clone())
        })
        .collect()
}

#[test]
fn pooled_hidden_states_match_transformers() {
    for model in ["qwen3-tiny", "llama-tiny", "gemma3-27b-shape"] {
        let mut engine =
            Engine::load(folder(model).join("model.gguf"), 1, Precision::Exact).unwrap();
        let cases = reference(model);
        let inputs: Vec<Vec<u32>> = cases.iter().map(|(ids, _)| ids.clone()).collect();
        for (pooling, key) in [
            (Pooling::Mean, "mean"),
            (Pooling::Cls, "cls"),
            (Pooling::Last, "last"),
        ] {
            // One pass for everything, then passes of 5 rows (inputs cut across passes).
            for max_rows in [4096, 5] {
                let out = engine.embed(&inputs, pooling, max_rows).unwrap();
                assert_eq!(out.vectors.len(), inputs.len());
                let total: usize = inputs.iter().map(Vec::len).sum();
                assert_eq!(out.passes, total.div_ceil(max_rows.min(total)), "{model}");
                for ((_, case), got) in cases.iter().zip(&out.vectors) {
                    let want: Vec<f64> = case[key]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap())
                        .collect();
                    assert_eq!(got.len(), want.len());
                    let worst = got
                        .iter()
                        .zip(&want)
                        .map(|(&g, &w)| (f64::from(g) - w).abs())
                        .fold(0.0, f64::max);
                    // f32 through up to 62 layers (gemma3-27b-shape) against f32: a few ulps.
                    assert!(
                        worst <= 1e-5,
                        "{model} {key} {} (max_rows {max_rows}): off by {worst}",
                        case["id"]
                    );
                    let norm: f64 = got.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>();
                    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
                }
            }
        }
    }
}

#[test]
fn an_input_embeds_the_same_alone_or_packed_with_others() {
    let mut engine =
        Engine::load(folder("qwen3-tiny").join("model.gguf"), 1, Precision::Fast).unwrap();
    let inputs: Vec<Vec<u32>> = reference("qwen3-tiny")
        .into_iter()
        .map(|(ids, _)| ids)
        .collect();
    let packed = engine.embed(&inputs, Pooling::Mean, 4096).unwrap();
    assert_eq!(packed.passes, 1);
    for (i, input) in inputs.iter().enumerate() {
        let alone = engine
            .embed(std::slice::from_ref(input), Pooling::Mean, 4096)
            .unwrap();
        assert_eq!(alone.vectors[0], packed.vectors[i], "input {i}");
    }
}

#[test]
fn bad_inputs_are_errors() {
    let mut engine =
        Engine::load(folder("qwen3-tiny").join("model.gguf"), 1, Precision::Fast).unwrap();
    assert!(engine.embed(&[vec![]], Pooling::Mean, 16).is_err());
    assert!(engine
        .embed(&[vec![1, 100_000]], Pooling::Mean, 16)
        .is_err());
    let context = engine.model.config().context_length;
    assert!(engine
        .embed(&[vec![1; context + 1]], Pooling::Mean, 16)
        .is_err());
    // A model without `pooling_type` pools by the mean.
    assert_eq!(engine.pooling(), Pooling::Mean);
}
