//! JSON Schema conformance on a committed subset of JSONSchemaBench's MaskBench (300 schemas of
//! every source, 1,114 instances; `tools/constrain/maskbench_subset.py`): every instance,
//! tokenized by SmolLM2's tokenizer, is replayed through its schema's constraint token by token.
//! No invalid instance may be accepted; coverage (schemas compiled, valid instances accepted)
//! may not fall below what it is.

mod common;

use std::path::PathBuf;

use common::replay::{replay, Counts};
use serde_json::Value;

#[test]
fn maskbench_subset_replays_without_a_wrong_accept() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/maskbench/subset.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let (tokenizer, constrainer) = common::smollm2();
    let mut counts = Counts::default();
    for s in doc["schemas"].as_array().unwrap() {
        let tests: Vec<(bool, String)> = s["tests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["valid"].as_bool().unwrap(),
                    t["text"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        replay(
            constrainer,
            tokenizer,
            s["file"].as_str().unwrap(),
            &s["schema"],
            &tests,
            &mut counts,
        );
    }
    eprintln!("{}", counts.report());
    for w in counts.wrong_rejects.iter().take(20) {
        eprintln!("wrong reject: {}", &w[..w.len().min(300)]);
    }
    assert_eq!(counts.schemas, 300);
    assert!(
        counts.wrong_accepts.is_empty(),
        "{:#?}",
        counts.wrong_accepts
    );
}
