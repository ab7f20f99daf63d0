//! JSONSchemaBench's MaskBench, all of it: every schema compiled for a model's vocabulary and
//! every instance replayed through it token by token; prints the conformance counts and the
//! mask and compile times.
//!
//! usage: cargo run --release -p rill-constrain --example maskbench -- DATA_DIR [MODEL] [--show N]
//!
//! DATA_DIR: `maskbench/data` of github.com/guidance-ai/jsonschemabench. MODEL: a built-in
//! model name (default smollm2-135m; gemma3-270m for a 262k vocabulary).

#[path = "../tests/common/replay.rs"]
mod replay;

use std::sync::Arc;

use rill_constrain::Constrainer;
use rill_tokenizer::Tokenizer;
use serde_json::Value;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args
        .first()
        .expect("usage: maskbench DATA_DIR [MODEL] [--show N]");
    let model = args
        .get(1)
        .filter(|a| !a.starts_with("--"))
        .map_or("smollm2-135m", |s| s);
    let show: usize = args
        .iter()
        .position(|a| a == "--show")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    // Approximate oneOf by anyOf (llguidance's `coerce_one_of`), as its own benchmark runs do:
    // more schemas compile, and an instance matching several branches is then accepted.
    let coerce = args.iter().any(|a| a == "--coerce-one-of");
    let path = rill_fetch::resolve(model, &rill_fetch::FetchOptions::default()).unwrap();
    let gguf = rill_gguf::GgufFile::open(&path).unwrap();
    let tokenizer = Arc::new(Tokenizer::from_gguf(gguf.metadata()).unwrap());
    let started = std::time::Instant::now();
    let constrainer = Arc::new(Constrainer::new(tokenizer.clone()).unwrap());
    eprintln!(
        "{model}: {} tokens, constrainer built in {:.0} ms",
        tokenizer.vocab_size(),
        started.elapsed().as_secs_f64() * 1e3
    );
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut counts = replay::Counts::default();
    let mut without_tests = 0;
    for (i, p) in files.iter().enumerate() {
        let doc: Value = match std::fs::read_to_string(p)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
        {
            Some(d) => d,
            None => continue,
        };
        let tests: Vec<(bool, String)> = doc["tests"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .map(|t| {
                        (
                            t["valid"].as_bool().unwrap_or(false),
                            rill_constrain::layout_json(&t["data"]),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        if tests.is_empty() {
            without_tests += 1;
        }
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        let mut schema = doc["schema"].clone();
        if let (true, Some(map)) = (coerce, schema.as_object_mut()) {
            map.entry("x-guidance").or_insert_with(|| {
                serde_json::json!({"whitespace_flexible": false, "item_separator": ", ",
                    "key_separator": ": ", "coerce_one_of": true})
            });
        }
        replay::replay(
            &constrainer,
            &tokenizer,
            &name,
            &schema,
            &tests,
            &mut counts,
        );
        if (i + 1) % 1000 == 0 {
            eprintln!("{} / {}", i + 1, files.len());
        }
    }
    println!(
        "{model}: {} files ({without_tests} without instances)",
        files.len()
    );
    print!("{}", counts.report());
    for w in counts.wrong_accepts.iter() {
        println!("WRONG ACCEPT {}", &w[..w.len().min(400)]);
    }
    for w in counts.wrong_rejects.iter().take(show) {
        println!("wrong reject {}", &w[..w.len().min(400)]);
    }
}
