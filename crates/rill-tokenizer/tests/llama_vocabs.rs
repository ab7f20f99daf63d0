//! Conformance with llama.cpp's own tokenizer test vectors.
//!
//! llama.cpp ships vocab-only GGUF files (`models/ggml-vocab-<name>.gguf`) with test texts
//! (`.inp`) and the ids its `tests/test-tokenizer-0` must produce for them (`.out`, written by
//! `convert_hf_to_gguf_update.py` from the HF tokenizer with `add_special_tokens=False`).
//! test-tokenizer-0 tokenizes each text with `add_special = false` (no BOS/EOS) and
//! `parse_special = false`; so does this test, with [`Tokenizer::encode`]`(text, false)`.
//!
//! The files come from the sdist of PyPI `llama-cpp-python==0.3.36` (its `vendor/llama.cpp`);
//! `tools/llama-vocabs.sh` fetches them (`.ci/run` runs it). The directory is `$RILL_LLAMA_VOCABS`,
//! else that script's `~/.cache/rill-peers/llama-vocabs-0.3.36`, else an unpacked sdist under
//! `~/.cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp/models`. With none present the test
//! runs the script itself (first use; it needs pip and PyPI; see `rill_testkit::peer_data`).
//!
//! What is asserted:
//! * every vocabulary rill accepts passes every case: a tokenizer model or pre-tokenizer that is
//!   only partly right must be refused, never used;
//! * a vocabulary rill refuses gets a one-line error naming what it does not implement;
//! * the vocabularies in [`SUPPORTED`] are all present and accepted (a regression fails).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use rill_tokenizer::Tokenizer;

/// The vocabularies rill passes in full. Keep in step with the README's Correctness section.
const SUPPORTED: &[&str] = &[
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// test-tokenizer-0's separator between two texts of a `.inp` file.
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

/// Reads the cases like test-tokenizer-0's `read_tests`: texts split at [`SEPARATOR`] (the last
/// one may lack it), one `.out` line of space-separated ids per text, and a map keyed by text (a
/// repeated text keeps its last ids).
fn read_cases(gguf: &Path) -> BTreeMap<String, Vec<u32>> {
    let with_ext = |ext: &str| PathBuf::from(format!("{}.{ext}", gguf.display()));
    let read = |p: &Path| {
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    };
    let inp = read(&with_ext("inp"));
    let out = read(&with_ext("out"));

    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEPARATOR) {
            Some(at) => {
                texts.push(&rest[..at]);
                rest = &rest[at + SEPARATOR.len()..];
            }
            None => {
                texts.push(rest);
                rest = "";
            }
        }
    }
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        texts.len(),
        lines.len(),
        "{}: {} texts but {} lines of ids",
        gguf.display(),
        texts.len(),
        lines.len()
    );
    texts
        .into_iter()
        .zip(lines)
        .map(|(text, line)| {
            let ids = line
                .split_whitespace()
                .map(|s| {
                    s.parse()
                        .unwrap_or_else(|e| panic!("{}: bad id {s:?}: {e}", gguf.display()))
                })
                .collect();
            (text.to_string(), ids)
        })
        .collect()
}

enum Outcome {
    /// `tokenizer.ggml.model` / `.pre` as stored, and the error `from_gguf` gave.
    Refused(String),
    /// Cases passed, cases in all, and a description of each failure.
    Ran {
        passed: usize,
        total: usize,
        failures: Vec<String>,
    },
    /// The GGUF has no `.inp`/`.out` pair: only whether rill accepts it is reported.
    NoVectors { accepted: Result<(), String> },
}

struct Row {
    name: String,
    model: String,
    pre: String,
    outcome: Outcome,
}

fn run_vocab(path: &Path, name: &str) -> Row {
    let gguf = rill_gguf::GgufFile::open(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let md = gguf.metadata();
    let meta = |key: &str| {
        md.get(key)
            .and_then(|v| v.as_str())
            .unwrap_or("-")
            .to_string()
    };
    let (model, pre) = (meta("tokenizer.ggml.model"), meta("tokenizer.ggml.pre"));
    let has_vectors = PathBuf::from(format!("{}.inp", path.display())).is_file()
        && PathBuf::from(format!("{}.out", path.display())).is_file();
    let built = Tokenizer::from_gguf(md);
    let outcome = if !has_vectors {
        Outcome::NoVectors {
            accepted: built.map(|_| ()).map_err(|e| e.to_string()),
        }
    } else {
        match built {
            Err(e) => Outcome::Refused(e.to_string()),
            Ok(tok) => {
                let cases = read_cases(path);
                let mut failures = Vec::new();
                for (text, want) in &cases {
                    let got = tok.encode(text, false);
                    if &got != want {
                        failures.push(format!("{name}: {text:?}\n   got {got:?}\n  want {want:?}"));
                    }
                }
                Outcome::Ran {
                    passed: cases.len() - failures.len(),
                    total: cases.len(),
                    failures,
                }
            }
        }
    };
    Row {
        name: name.to_string(),
        model,
        pre,
        outcome,
    }
}

fn table(rows: &[Row]) -> String {
    let mut s = format!("{:<16} {:<7} {:<16} result\n", "vocab", "model", "pre");
    for r in rows {
        let result = match &r.outcome {
            Outcome::Refused(e) => format!("unsupported: {e}"),
            Outcome::Ran { passed, total, .. } => format!("{passed}/{total} cases"),
            Outcome::NoVectors { accepted: Ok(()) } => "no test vectors (accepted)".to_string(),
            Outcome::NoVectors { accepted: Err(e) } => {
                format!("no test vectors (unsupported: {e})")
            }
        };
        let _ = writeln!(s, "{:<16} {:<7} {:<16} {result}", r.name, r.model, r.pre);
    }
    s
}

#[test]
fn llama_cpp_tokenizer_vectors() {
    let dir = rill_testkit::peer_data(rill_testkit::PeerData::TokenizerVectors);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ggml-vocab-") && n.ends_with(".gguf"))
        })
        .collect();
    paths.sort();
    assert!(
        !paths.is_empty(),
        "{} holds no ggml-vocab-*.gguf files",
        dir.display()
    );

    let rows: Vec<Row> = paths
        .iter()
        .map(|p| {
            let file = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let name = file
                .trim_start_matches("ggml-vocab-")
                .trim_end_matches(".gguf");
            run_vocab(p, name)
        })
        .collect();
    let table = table(&rows);
    println!(
        "llama.cpp tokenizer test vectors in {}:\n{table}",
        dir.display()
    );

    let mut problems = Vec::new();
    for r in &rows {
        match &r.outcome {
            Outcome::Ran { failures, .. } => problems.extend(failures.iter().cloned()),
            Outcome::Refused(e) | Outcome::NoVectors { accepted: Err(e) } => {
                // One line, naming the tokenizer model or pre-tokenizer that is not implemented.
                if e.contains('\n') || !(e.contains(&r.model) || e.contains(&r.pre)) {
                    problems.push(format!(
                        "{}: the error does not name {:?} or {:?} on one line: {e}",
                        r.name, r.model, r.pre
                    ));
                }
            }
            Outcome::NoVectors { accepted: Ok(()) } => {}
        }
    }
    for want in SUPPORTED {
        match rows.iter().find(|r| r.name == *want) {
            None => problems.push(format!("{want}: expected in {}", dir.display())),
            Some(Row {
                outcome: Outcome::Ran { .. },
                ..
            }) => {}
            Some(_) => problems.push(format!(
                "{want}: rill passed its vectors before but now refuses it (or its .inp/.out are gone)"
            )),
        }
    }
    let accepted: Vec<&str> = rows
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Ran { .. }))
        .map(|r| r.name.as_str())
        .collect();
    println!("accepted with test vectors: {accepted:?}");
    assert!(
        problems.is_empty(),
        "{} problem(s) with llama.cpp's tokenizer test vectors:\n{}\n\n{table}",
        problems.len(),
        problems.join("\n")
    );
}
