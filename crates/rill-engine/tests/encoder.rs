//! BERT encoders against transformers (f32) on tiny random checkpoints converted by llama.cpp's
//! own converter (`tests/data/tiny/{bert,nomic-bert}-tiny/`, `tools/models/make_encoder.py`): the
//! WordPiece tokenizer gives the HF tokenizer's ids (with [CLS] and [SEP]); the exact path's last
//! hidden state of every position, and the CLS and mean poolings, within 1e-5 of transformers' in
//! every coordinate, whether the inputs share a pass or not; the fast path close to it and the
//! same for an input alone or packed with others; the file's pooling (bert: CLS, nomic: mean);
//! generation refused.

use std::path::PathBuf;

use rill_engine::{Engine, Pooling, Precision};
use rill_model::{Batch, KvCache, KvDtype};
use serde_json::Value;

/// The encoders and the pooling their files say.
const MODELS: [(&str, Pooling); 2] = [
    ("bert-tiny", Pooling::Cls),
    ("nomic-bert-tiny", Pooling::Mean),
];

fn folder(model: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/tiny")
        .join(model)
}

struct Case {
    id: String,
    text: Option<String>,
    ids: Vec<u32>,
    hidden: Vec<Vec<f64>>,
    cls: Vec<f64>,
    mean: Vec<f64>,
}

fn cases(model: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(folder(model).join("reference.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let floats = |v: &Value| -> Vec<f64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            id: c["id"].as_str().unwrap().to_string(),
            text: c["text"].as_str().map(str::to_string),
            ids: (c["token_ids"].as_array().unwrap().iter())
                .map(|t| t.as_u64().unwrap() as u32)
                .collect(),
            hidden: c["hidden"].as_array().unwrap().iter().map(floats).collect(),
            cls: floats(&c["cls"]),
            mean: floats(&c["mean"]),
        })
        .collect()
}

fn worst(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .fold(0.0, f64::max)
}

#[test]
fn wordpiece_gives_the_hf_tokenizers_ids() {
    for (model, _) in MODELS {
        let engine = Engine::load(folder(model).join("model.gguf"), 1, Precision::Exact).unwrap();
        let mut texts = 0;
        for case in cases(model) {
            let Some(text) = &case.text else { continue };
            let got = engine.tokenizer.encode_with_special(text, true, false);
            assert_eq!(got, case.ids, "{model} {}: {text:?}", case.id);
            texts += 1;
        }
        assert_eq!(texts, 4);
    }
}

#[test]
fn every_positions_hidden_state_matches_transformers() {
    for (name, _) in MODELS {
        hidden_states_match(name);
    }
}

fn hidden_states_match(name: &str) {
    let mut engine = Engine::load(folder(name).join("model.gguf"), 1, Precision::Exact).unwrap();
    let model = &mut engine.model;
    let d = model.config().d_model;
    for case in cases(name) {
        let mut kv = KvCache::for_model(model.config(), case.ids.len(), KvDtype::F32).unwrap();
        kv.add_sequence(0).unwrap();
        model.set_hidden_log(true);
        let batch = Batch::prompt(0, &case.ids, 0, false);
        let batch = Batch {
            rows: batch
                .rows
                .into_iter()
                .map(|r| rill_model::BatchRow { logits: false, ..r })
                .collect(),
        };
        model
            .forward(&batch, &mut kv, Precision::Exact, &mut Vec::new())
            .unwrap();
        let log = model.take_hidden_log();
        model.set_hidden_log(false);
        assert_eq!(log.rows.len(), case.ids.len());
        for (p, want) in case.hidden.iter().enumerate() {
            let off = worst(&log.data[p * d..(p + 1) * d], want);
            assert!(off <= 1e-5, "{name} {} position {p}: off by {off}", case.id);
        }
    }
}

#[test]
fn pooled_embeddings_match_transformers_in_any_packing() {
    for (name, pooling) in MODELS {
        pooled_match(name, pooling);
    }
}

fn pooled_match(name: &str, file_pooling: Pooling) {
    let mut engine = Engine::load(folder(name).join("model.gguf"), 1, Precision::Exact).unwrap();
    assert_eq!(engine.pooling(), file_pooling, "{name}: the file's pooling");
    let cases = cases(name);
    let inputs: Vec<Vec<u32>> = cases.iter().map(|c| c.ids.clone()).collect();
    for (pooling, pick) in [
        (Pooling::Cls, (|c: &Case| &c.cls) as fn(&Case) -> &Vec<f64>),
        (Pooling::Mean, |c: &Case| &c.mean),
    ] {
        // Every input in one pass; then passes of at most 20 rows of whole inputs (an encoder's
        // input is never cut: of 6, 12, 16, 14, 7, 33 and 70 tokens, 6 + 12 share one pass and
        // the 33- and 70-token ones go alone, past the limit).
        for (max_rows, passes) in [(4096, 1), (20, 6)] {
            let out = engine.embed(&inputs, pooling, max_rows).unwrap();
            assert_eq!(out.passes, passes, "{name} max_rows {max_rows}");
            for (case, got) in cases.iter().zip(&out.vectors) {
                let off = worst(got, pick(case));
                assert!(off <= 1e-5, "{name} {} {pooling:?}: off by {off}", case.id);
            }
        }
    }
}

#[test]
fn the_fast_path_is_close_and_batch_invariant() {
    for (name, pooling) in MODELS {
        let mut engine = Engine::load(folder(name).join("model.gguf"), 1, Precision::Fast).unwrap();
        let cases = cases(name);
        let inputs: Vec<Vec<u32>> = cases.iter().map(|c| c.ids.clone()).collect();
        let packed = engine.embed(&inputs, pooling, 4096).unwrap();
        for (i, (case, got)) in cases.iter().zip(&packed.vectors).enumerate() {
            let want = if pooling == Pooling::Cls {
                &case.cls
            } else {
                &case.mean
            };
            let cos: f64 = got.iter().zip(want).map(|(&g, &w)| f64::from(g) * w).sum();
            eprintln!("{name} {}: fast path cosine {cos:.7}", case.id);
            assert!(cos > 0.999, "{name} {}: cosine {cos}", case.id);
            let alone = engine
                .embed(std::slice::from_ref(&inputs[i]), pooling, 4096)
                .unwrap();
            assert_eq!(&alone.vectors[0], got, "{name} {}", case.id);
        }
    }
}

#[test]
fn an_encoder_refuses_to_generate_and_past_its_positions() {
    let mut engine =
        Engine::load(folder("bert-tiny").join("model.gguf"), 1, Precision::Fast).unwrap();
    assert!(!engine.model.config().output_head);
    let model = &mut engine.model;
    let mut kv = KvCache::for_model(model.config(), 256, KvDtype::F16).unwrap();
    kv.add_sequence(0).unwrap();
    let err = model
        .forward(
            &Batch::prompt(0, &[2, 40, 3], 0, false),
            &mut kv,
            Precision::Fast,
            &mut Vec::new(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("no output head"), "{err}");
    // An input continued in a second pass would have seen only part of itself: refused.
    let first = Batch {
        rows: (Batch::prompt(0, &[2, 40], 0, false).rows.into_iter())
            .map(|r| rill_model::BatchRow { logits: false, ..r })
            .collect(),
    };
    model
        .forward(&first, &mut kv, Precision::Fast, &mut Vec::new())
        .unwrap();
    let mut more = Batch::new();
    more.push(0, 3, 2, false);
    let err = model
        .forward(&more, &mut kv, Precision::Fast, &mut Vec::new())
        .unwrap_err();
    assert!(err.to_string().contains("whole input at once"), "{err}");
    let positions = engine.model.config().context_length;
    let err = engine
        .embed(&[vec![40; positions + 1]], Pooling::Cls, 4096)
        .unwrap_err();
    assert!(
        err.to_string().contains("longer than") || err.to_string().contains("context"),
        "{err}"
    );
}
