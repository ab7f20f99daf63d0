//! The `rill` binary end to end: every command on a tiny synthetic model (fast) and, where it
//! matters, on SmolLM2; and every bad input gives one line on stderr naming the problem, a
//! non-zero exit, and no panic.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};

use rill_gguf::{GgmlType, Value};
use rill_model::synthetic::{SyntheticModel, SyntheticSpec, IM_START_ID, VOCAB_SIZE};
use serde_json::Value as Json;

// ---------------------------------------------------------------------------------------------
// Fixtures.

/// A private directory for this test process.
fn tmp() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("rill-cli-test-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

fn tmp_path(name: &str) -> PathBuf {
    tmp().join(name)
}

/// Writes bytes to a fresh file in the temp dir and returns its path as a string.
fn write_tmp(name: &str, bytes: &[u8]) -> String {
    let p = tmp_path(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_string()
}

fn synthetic_bytes() -> &'static [u8] {
    static B: OnceLock<Vec<u8>> = OnceLock::new();
    B.get_or_init(|| SyntheticSpec::llama_tiny().to_bytes().unwrap())
}

/// The synthetic llama, written once.
fn synthetic() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| write_tmp("synthetic-llama.gguf", synthetic_bytes()))
}

fn synthetic_gemma() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| {
        write_tmp(
            "synthetic-gemma3.gguf",
            &SyntheticSpec::gemma3_tiny().to_bytes().unwrap(),
        )
    })
}

/// A synthetic llama with one change, written to `name`.
fn edited(name: &str, edit: impl FnOnce(&mut SyntheticModel)) -> String {
    let mut m = SyntheticSpec::llama_tiny().build().unwrap();
    edit(&mut m);
    write_tmp(name, &m.to_bytes().unwrap())
}

/// SmolLM2-135M-Instruct (fetched on first use).
fn smollm2() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| {
        let opts = rill_fetch::FetchOptions {
            progress: true,
            ..Default::default()
        };
        rill_fetch::resolve("smollm2-135m", &opts)
            .unwrap_or_else(|e| panic!("{e} (run `cargo run --release -- pull smollm2-135m`)"))
            .to_str()
            .unwrap()
            .to_string()
    })
}

fn reference_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/reference")
}

fn read_json(path: &Path) -> Json {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Commands on the real model run one at a time, so they do not fight over the two cores.
fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Running the binary.

fn rill_with(args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rill"));
    cmd.args(args)
        .env("RILL_HOME", tmp().join("home"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("the rill binary runs");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn rill(args: &[&str]) -> Output {
    rill_with(args, None, &[])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Success: returns stdout.
fn ok(args: &[&str], out: &Output) -> String {
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "rill {args:?} failed ({}): {stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "rill {args:?}: {stderr}");
    text(&out.stdout)
}

/// Failure: a non-zero exit (not a crash), no panic, and one line on stderr that names the
/// problem: it contains every one of `needles` (case-insensitive).
fn fails(args: &[&str], out: &Output, needles: &[&str]) -> String {
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "rill {args:?} succeeded; stderr: {stderr}"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "rill {args:?} crashed: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "rill {args:?} panicked: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "rill {args:?}: expected one line on stderr, got: {stderr}"
    );
    assert!(lines[0].starts_with("error: "), "rill {args:?}: {stderr}");
    let lower = lines[0].to_lowercase();
    for n in needles {
        assert!(
            lower.contains(&n.to_lowercase()),
            "rill {args:?}: stderr does not mention {n:?}: {stderr}"
        );
    }
    stderr
}

/// `rill probe -m FILE --token-ids 1`: loads the whole model.
fn load_fails(file: &str, needles: &[&str]) {
    let args = ["probe", "-m", file, "-t", "1", "--token-ids", "1"];
    fails(&args, &rill(&args), needles);
}

fn ids_of(v: &Json) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Bad files.

#[test]
fn truncated_real_model() {
    let real = std::fs::read(smollm2()).unwrap();
    let first_mb = write_tmp("smollm2-1mb.gguf", &real[..1 << 20]);
    // The cut falls inside the metadata (the merges array): either the array's count is seen to
    // be impossible for what is left, or a read runs past the end.
    let truncated = |stderr: String| {
        assert!(
            stderr.contains("file is truncated") || stderr.contains("bytes remain in the file"),
            "{stderr}"
        )
    };
    let args = ["probe", "-m", &first_mb, "-t", "1", "--token-ids", "1"];
    truncated(fails(&args, &rill(&args), &["smollm2-1mb.gguf"]));
    let args = ["tokenize", "-m", &first_mb, "hello"];
    truncated(fails(&args, &rill(&args), &[]));
    let args = ["inspect", &first_mb];
    truncated(fails(&args, &rill(&args), &[]));

    // Cut inside the tensor data: the directory is intact, the last tensors are not there.
    let file = rill_gguf::GgufFile::open(smollm2()).unwrap();
    assert!(file.data_start() < real.len() as u64 / 2);
    let cut = write_tmp("smollm2-cut.gguf", &real[..real.len() / 2]);
    load_fails(&cut, &["outside the file"]);
    let args = ["run", "-m", &cut, "-n", "1", "hi"];
    fails(&args, &rill(&args), &["outside the file"]);
    // Half a real model is too big to leave behind in the temp dir.
    std::fs::remove_file(&cut).unwrap();
}

#[test]
fn not_a_gguf_file() {
    let f = write_tmp("not-gguf.gguf", b"this is a text file, not a model\n");
    load_fails(&f, &["not a GGUF file"]);
    let args = ["tokenize", "-m", &f, "hello"];
    fails(&args, &rill(&args), &["not a GGUF file"]);
    let empty = write_tmp("empty.gguf", b"");
    load_fails(&empty, &["truncated"]);
    let mut v4 = synthetic_bytes().to_vec();
    v4[4..8].copy_from_slice(&4u32.to_le_bytes());
    load_fails(&write_tmp("v4.gguf", &v4), &["version 4"]);
}

/// Offset of the tensor directory entry of `name` just after its name (at its dimension count).
fn entry_of(bytes: &[u8], name: &str) -> usize {
    let needle = name.as_bytes();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor name in file");
    at + needle.len()
}

fn patched(name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> String {
    let mut b = synthetic_bytes().to_vec();
    edit(&mut b);
    write_tmp(name, &b)
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn corrupted_counts_lengths_offsets_and_dimensions() {
    const T: &str = "blk.0.attn_q.weight";
    type Patch = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Patch, &[&str])> = vec![
        (
            "tensor-count",
            Box::new(|b| put_u64(b, 8, u64::MAX / 3)),
            &["tensor count"],
        ),
        (
            "kv-count",
            Box::new(|b| put_u64(b, 16, 1 << 50)),
            &["metadata entry count"],
        ),
        (
            "key-length",
            Box::new(|b| put_u64(b, 24, 1 << 40)),
            &["truncated"],
        ),
        // The dimension count, a dimension, the type, the offset of one directory entry.
        (
            "n-dims",
            Box::new(|b| {
                let at = entry_of(b, T);
                put_u32(b, at, 9)
            }),
            &["9 dimensions"],
        ),
        (
            "dim-overflow",
            Box::new(|b| {
                let at = entry_of(b, T) + 4;
                put_u64(b, at, u64::MAX / 2)
            }),
            &[T, "overflow"],
        ),
        (
            "dim-zero",
            Box::new(|b| {
                let at = entry_of(b, T) + 12;
                put_u64(b, at, 0)
            }),
            &[T, "zero"],
        ),
        (
            "dim-beyond-data",
            Box::new(|b| {
                let at = entry_of(b, T) + 12;
                put_u64(b, at, 1 << 30)
            }),
            &[T, "outside the file"],
        ),
        (
            "type",
            Box::new(|b| {
                let at = entry_of(b, T) + 20;
                put_u32(b, at, 200)
            }),
            &[T, "type id 200"],
        ),
        (
            "offset",
            Box::new(|b| {
                let at = entry_of(b, T) + 24;
                put_u64(b, at, 1 << 40)
            }),
            &[T, "outside the file"],
        ),
        (
            "offset-misaligned",
            Box::new(|b| {
                let at = entry_of(b, T) + 24;
                let off = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
                put_u64(b, at, off + 2)
            }),
            &[T, "alignment"],
        ),
        (
            "offset-overflow",
            Box::new(|b| {
                let at = entry_of(b, T) + 24;
                put_u64(b, at, u64::MAX - 31)
            }),
            &[T, "outside the file"],
        ),
    ];
    for (name, edit, needles) in cases {
        let f = patched(&format!("patched-{name}.gguf"), edit);
        load_fails(&f, needles);
    }
    // The same file unpatched loads: the patches are what break it.
    let args = ["probe", "-m", synthetic(), "-t", "1", "--token-ids", "1"];
    ok(&args, &rill(&args));
}

#[test]
fn bad_metadata_and_tensors_made_with_the_writer() {
    let f = edited("meta-zero-layers.gguf", |m| {
        m.set_metadata("llama.block_count", Value::U32(0));
    });
    load_fails(&f, &["llama.block_count", "outside"]);
    let f = edited("meta-kv-heads.gguf", |m| {
        m.set_metadata("llama.attention.head_count_kv", Value::U32(3));
    });
    load_fails(&f, &["head_count_kv", "does not divide"]);
    let f = edited("meta-wrong-type.gguf", |m| {
        m.set_metadata("llama.embedding_length", Value::String("64".into()));
    });
    load_fails(&f, &["llama.embedding_length"]);
    let f = edited("meta-no-arch.gguf", |m| {
        m.remove_metadata("general.architecture");
    });
    load_fails(&f, &["general.architecture", "missing"]);
    let f = edited("meta-huge-context.gguf", |m| {
        m.set_metadata("llama.embedding_length", Value::U64(u64::MAX));
    });
    load_fails(&f, &["llama.embedding_length"]);
    // A matrix of the wrong shape (with the right number of bytes for that shape).
    let f = edited("tensor-shape.gguf", |m| {
        let t = m.tensor_mut("blk.1.attn_k.weight").unwrap();
        t.dims = vec![64, 64];
        t.data = vec![0; GgmlType::Q8_0.bytes_for(64 * 64).unwrap() as usize];
    });
    load_fails(&f, &["blk.1.attn_k.weight", "shape"]);
    // The tokenizer without its tokens: the model loads, the tokenizer cannot be built.
    let f = edited("no-tokens.gguf", |m| {
        m.remove_metadata("tokenizer.ggml.tokens");
    });
    let args = ["tokenize", "-m", &f, "hi"];
    fails(&args, &rill(&args), &["tokenizer.ggml.tokens"]);
}

#[test]
fn unsupported_architecture() {
    let f = edited("mamba.gguf", |m| {
        m.set_metadata("general.architecture", Value::String("mamba".into()));
    });
    load_fails(
        &f,
        &[
            "unsupported architecture",
            "mamba",
            "supported: llama, gemma2, gemma3, qwen2",
        ],
    );
    let args = ["run", "-m", &f, "-n", "1", "hi"];
    fails(&args, &rill(&args), &["mamba"]);
    // inspect still shows the file, and says why it cannot run it.
    let args = ["inspect", &f];
    let out = ok(&args, &rill(&args));
    assert!(out.contains("mamba"), "{out}");
    assert!(out.contains("cannot run"), "{out}");
}

/// A tiny model whose rows are 256 long, with `blk.0.ffn_up.weight` of type `ty` (zeros), written
/// to a temporary file named `name`.
fn model_with_ffn_up_of(ty: GgmlType, name: &str) -> String {
    let spec = SyntheticSpec {
        d_model: 256,
        ffn_dim: 256,
        ..SyntheticSpec::llama_tiny()
    };
    let mut m = spec.build().unwrap();
    let t = m.tensor_mut("blk.0.ffn_up.weight").unwrap();
    t.ggml_type = ty;
    t.data = vec![0; ty.bytes_for(256 * 256).unwrap() as usize];
    write_tmp(name, &m.to_bytes().unwrap())
}

#[test]
fn unsupported_quant_type_for_a_weight() {
    // A type GGUF knows but no model weight uses (64-bit floats).
    let f = model_with_ffn_up_of(GgmlType::F64, "f64.gguf");
    load_fails(&f, &["blk.0.ffn_up.weight", "F64"]);
}

#[test]
fn a_model_with_a_grid_i_quant_weight_runs() {
    // IQ2_XXS (grid i-quant) rows of zeros: loads and runs.
    let f = model_with_ffn_up_of(GgmlType::IQ2_XXS, "iq2.gguf");
    let out = rill(&["probe", "-m", &f, "-t", "1", "--token-ids", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn missing_tensor() {
    let f = edited("missing-tensor.gguf", |m| {
        m.remove_tensor("blk.1.ffn_down.weight").unwrap();
    });
    load_fails(&f, &["blk.1.ffn_down.weight", "missing"]);
    let f = edited("missing-norm.gguf", |m| {
        m.remove_tensor("output_norm.weight").unwrap();
    });
    load_fails(&f, &["output_norm.weight", "missing"]);
}

#[test]
fn nonexistent_paths_and_unknown_names() {
    let missing = tmp_path("does/not/exist.gguf");
    let missing = missing.to_str().unwrap();
    load_fails(missing, &["not found", "exist.gguf"]);
    let args = ["tokenize", "-m", missing, "hi"];
    fails(&args, &rill(&args), &["not found"]);
    let args = ["inspect", missing];
    fails(&args, &rill(&args), &["not found"]);
    load_fails("no-such-model", &["unknown model", "no-such-model"]);
    let args = ["pull", "no-such-model"];
    fails(&args, &rill(&args), &["no-such-model"]);
    // A directory is not a model.
    load_fails(tmp().to_str().unwrap(), &["directory"]);
}

#[test]
fn hf_spec_fails_naming_the_hub() {
    // A hub that cannot be reached, on this machine: a loopback port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let spec = "hf:rill-test-owner/no-such-repo/missing.gguf";
    let args = ["probe", "-m", spec, "--token-ids", "1"];
    let out = rill_with(&args, None, &[("HF_ENDPOINT", &endpoint)]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Progress lines may come first; the error is the last line.
    let last = stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap();
    assert!(last.starts_with("error: "), "{stderr}");
    assert!(last.to_lowercase().contains("hugging face hub"), "{stderr}");
    assert!(last.contains(spec), "{stderr}");
    // A malformed spec is refused without any network access.
    let args = ["probe", "-m", "hf:only-owner", "--token-ids", "1"];
    fails(&args, &rill(&args), &["hf:"]);
}

// ---------------------------------------------------------------------------------------------
// tokenize.

fn tokenize_json(args: &[&str], stdin: Option<&[u8]>) -> Vec<u64> {
    let out = ok(args, &rill_with(args, stdin, &[]));
    let v: Json = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
    ids_of(&v["ids"])
}

fn bytes_as_ids(s: &[u8]) -> Vec<u64> {
    s.iter().map(|&b| u64::from(b)).collect()
}

#[test]
fn tokenize_synthetic() {
    let m = synthetic();
    // Byte-level vocabulary without merges: the ids are the UTF-8 bytes.
    let ids = tokenize_json(&["tokenize", "-m", m, "--json", "héllo wörld"], None);
    assert_eq!(ids, bytes_as_ids("héllo wörld".as_bytes()));
    // A text starting with '-' is text, not a flag.
    let ids = tokenize_json(&["tokenize", "-m", m, "--json", "-n 5"], None);
    assert_eq!(ids, bytes_as_ids(b"-n 5"));
    // --file: any bytes, NUL included; and '-' for standard input.
    let content = b"-a\0b\n";
    let f = write_tmp("nul.txt", content);
    let ids = tokenize_json(&["tokenize", "-m", m, "--json", "--file", &f], None);
    assert_eq!(ids, bytes_as_ids(content));
    let ids = tokenize_json(
        &["tokenize", "-m", m, "--json", "--file", "-"],
        Some(content),
    );
    assert_eq!(ids, bytes_as_ids(content));
    // Control tokens: only with --parse-special.
    let t = "<|im_start|>hi";
    let ids = tokenize_json(&["tokenize", "-m", m, "--json", t], None);
    assert_eq!(ids, bytes_as_ids(t.as_bytes()));
    let ids = tokenize_json(&["tokenize", "-m", m, "--json", "--parse-special", t], None);
    assert_eq!(ids, vec![u64::from(IM_START_ID), 104, 105]);
    // Without --json: one line per token, the count on stderr.
    let args = ["tokenize", "-m", m, "ab"];
    let out = rill(&args);
    let stdout = ok(&args, &out);
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(stdout.lines().next().unwrap().contains("97"), "{stdout}");
    assert!(text(&out.stderr).contains("2 tokens"));
}

#[test]
fn tokenize_bad_input() {
    let m = synthetic();
    let bad = write_tmp("bad-utf8.txt", b"ok\xff\xfe");
    let args = ["tokenize", "-m", m, "--file", &bad];
    fails(&args, &rill(&args), &["UTF-8", "offset 2"]);
    let args = ["tokenize", "-m", m];
    fails(&args, &rill(&args), &["no text"]);
    let missing = tmp_path("no-such-input.txt");
    let args = ["tokenize", "-m", m, "--file", missing.to_str().unwrap()];
    fails(&args, &rill(&args), &["cannot read", "no-such-input.txt"]);
    // Standard input that is not UTF-8.
    let args = ["tokenize", "-m", m, "--file", "-"];
    fails(&args, &rill_with(&args, Some(b"\xc3"), &[]), &["UTF-8"]);
}

#[test]
fn tokenize_smollm2_matches_the_reference() {
    let reference =
        read_json(&reference_dir().join("smollm2-135m-instruct-q4_1/tokenization.json"));
    let cases = reference["cases"].as_array().unwrap();
    let first = &cases[0];
    let t = first["text"].as_str().unwrap();
    let ids = tokenize_json(&["tokenize", "-m", smollm2(), "--json", t], None);
    assert_eq!(ids, ids_of(&first["ids"]), "{t:?}");
    // A case whose special-token parsing differs.
    let special = cases
        .iter()
        .find(|c| c["ids"] != c["ids_parse_special"])
        .expect("a case with special tokens");
    let t = special["text"].as_str().unwrap();
    let f = write_tmp("special.txt", t.as_bytes());
    let ids = tokenize_json(&["tokenize", "-m", smollm2(), "--json", "--file", &f], None);
    assert_eq!(ids, ids_of(&special["ids"]), "{t:?}");
    let ids = tokenize_json(
        &[
            "tokenize",
            "-m",
            smollm2(),
            "--json",
            "--parse-special",
            "--file",
            "-",
        ],
        Some(t.as_bytes()),
    );
    assert_eq!(ids, ids_of(&special["ids_parse_special"]), "{t:?}");
}

// ---------------------------------------------------------------------------------------------
// probe.

/// Checks the documented shape exactly and returns (token_ids, positions, greedy_ids).
/// One position's `top_ids` and `top_logprobs`.
type Top = (Vec<u64>, Vec<f64>);

fn probe_json(out: &str, k: usize) -> (Vec<u64>, Vec<Top>, Vec<u64>) {
    let v: Json = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let obj = v.as_object().unwrap();
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["greedy_ids", "positions", "token_ids"], "{v}");
    let token_ids = ids_of(&v["token_ids"]);
    let positions: Vec<Top> = v["positions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let mut keys: Vec<&str> = p.as_object().unwrap().keys().map(String::as_str).collect();
            keys.sort();
            assert_eq!(keys, ["top_ids", "top_logprobs"], "{p}");
            let ids = ids_of(&p["top_ids"]);
            let lps: Vec<f64> = p["top_logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(ids.len(), k, "{p}");
            assert_eq!(lps.len(), k, "{p}");
            assert!(
                lps.windows(2).all(|w| w[0] >= w[1]),
                "not most likely first: {p}"
            );
            assert!(lps.iter().all(|&l| l <= 0.0), "{p}");
            let total: f64 = lps.iter().map(|l| l.exp()).sum();
            assert!(total <= 1.0 + 1e-4, "{p}");
            let mut distinct = ids.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), k, "{p}");
            (ids, lps)
        })
        .collect();
    assert_eq!(positions.len(), token_ids.len());
    (token_ids, positions, ids_of(&v["greedy_ids"]))
}

#[test]
fn probe_smollm2_matches_the_reference() {
    let prompts = read_json(&reference_dir().join("prompts.json"));
    let capital = prompts
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "capital")
        .unwrap();
    let text = capital["text"].as_str().unwrap();
    let reference = read_json(&reference_dir().join("smollm2-135m-instruct-q4_1/reference.json"));
    let case = &reference["cases"][0];
    let dump = tmp_path("smollm2-last.f32");
    let args = [
        "probe",
        "-m",
        smollm2(),
        "-t",
        "2",
        "--json",
        "--exact",
        "--greedy",
        "8",
        "--dump-last-logits",
        dump.to_str().unwrap(),
        text,
    ];
    let out = {
        let _g = heavy();
        rill(&args)
    };
    let out = ok(&args, &out);
    let (token_ids, positions, greedy) = probe_json(&out, 8);
    assert_eq!(token_ids, ids_of(&case["token_ids"]));
    assert_eq!(greedy, ids_of(&case["greedy_ids"])[..8].to_vec());
    // Exact path: every position's most likely token is the reference's, and the log-probs
    // are close.
    for (i, ((ids, lps), want)) in positions
        .iter()
        .zip(case["positions"].as_array().unwrap())
        .enumerate()
    {
        assert_eq!(ids[0], ids_of(&want["top_ids"])[0], "position {i}");
        let want_lp = want["top_logprobs"][0].as_f64().unwrap();
        assert!(
            (lps[0] - want_lp).abs() < 1e-3,
            "position {i}: {} vs {want_lp}",
            lps[0]
        );
    }
    // The dumped logits: vocab_size f32 values, matching the reference file closely.
    let got: Vec<f32> = std::fs::read(&dump)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got.len(), 49152);
    let want: Vec<f32> =
        std::fs::read(reference_dir().join("smollm2-135m-instruct-q4_1/capital.last_logits.f32"))
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
    let max_diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(
        max_diff < 1e-3,
        "last logits differ from the reference by up to {max_diff}"
    );
}

#[test]
fn probe_synthetic() {
    let m = synthetic();
    let dump = tmp_path("synthetic-last.f32");
    let args = [
        "probe",
        "-m",
        m,
        "-t",
        "1",
        "--json",
        "--top",
        "3",
        "--greedy",
        "4",
        "--token-ids",
        "1,2,3",
        "--dump-last-logits",
        dump.to_str().unwrap(),
    ];
    let out = ok(&args, &rill(&args));
    let (token_ids, positions, greedy) = probe_json(&out, 3);
    assert_eq!(token_ids, [1, 2, 3]);
    assert_eq!(greedy.len(), 4);
    assert_eq!(
        greedy[0], positions[2].0[0],
        "the first greedy token is the last position's top"
    );
    let logits: Vec<f32> = std::fs::read(&dump)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(logits.len(), VOCAB_SIZE);
    let argmax = (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap();
    assert_eq!(argmax as u64, positions[2].0[0]);

    // Text input, exact and fast agree on the top token of a tiny model, on both architectures.
    for model in [synthetic(), synthetic_gemma()] {
        let mut tops = Vec::new();
        for exact in [true, false] {
            let mut args = vec!["probe", "-m", model, "-t", "1", "--json", "hello"];
            if exact {
                args.push("--exact");
            }
            let out = ok(&args, &rill(&args));
            let (ids, positions, greedy) = probe_json(&out, 8);
            assert_eq!(ids, bytes_as_ids(b"hello"));
            assert!(greedy.is_empty());
            tops.push(positions.last().unwrap().0[0]);
        }
        assert_eq!(tops[0], tops[1], "{model}");
    }

    // The human-readable form names the tokens and the continuation.
    let args = ["probe", "-m", m, "-t", "1", "--greedy", "2", "ab"];
    let out = ok(&args, &rill(&args));
    assert!(
        out.contains("\"a\"") && out.contains("greedy continuation (2 tokens)"),
        "{out}"
    );
}

#[test]
fn probe_bad_input() {
    let m = synthetic();
    let big = VOCAB_SIZE.to_string();
    let args = ["probe", "-m", m, "--token-ids", &big];
    fails(&args, &rill(&args), &["token id", &big, "vocabulary"]);
    let args = ["probe", "-m", m, "--file", "-"];
    fails(
        &args,
        &rill_with(&args, Some(b""), &[]),
        &["nothing to probe"],
    );
    let dir_as_file = tmp().join("no-such-dir").join("logits.f32");
    let args = [
        "probe",
        "-m",
        m,
        "--token-ids",
        "1",
        "--dump-last-logits",
        dir_as_file.to_str().unwrap(),
    ];
    fails(&args, &rill(&args), &["cannot write", "logits.f32"]);
}

// ---------------------------------------------------------------------------------------------
// run.

#[test]
fn run_synthetic() {
    let m = synthetic();
    for raw in [false, true] {
        let mut args = vec![
            "run",
            "-m",
            m,
            "-t",
            "1",
            "-n",
            "24",
            "--seed",
            "42",
            "--temperature",
            "0.8",
        ];
        if raw {
            args.push("--raw");
        }
        args.push("Once upon a time");
        let a = ok(&args, &rill(&args));
        let b = ok(&args, &rill(&args));
        assert!(!a.trim().is_empty(), "raw={raw}: empty output");
        assert_eq!(a, b, "raw={raw}: same seed, different text");
        // Another seed gives another text (random weights: almost a uniform distribution).
        let mut other = args.clone();
        let i = other.iter().position(|a| *a == "42").unwrap();
        other[i] = "43";
        let c = ok(&other, &rill(&other));
        assert_ne!(a, c, "raw={raw}: the seed does not matter");
    }
    // Greedy, with statistics and a system message.
    let args = [
        "run",
        "-m",
        synthetic_gemma(),
        "-t",
        "1",
        "-n",
        "8",
        "--stats",
        "--system",
        "be brief",
        "hi",
    ];
    let out = rill(&args);
    ok(&args, &out);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("prompt tokens") && stderr.contains("finish:"),
        "{stderr}"
    );
}

#[test]
fn run_bad_input() {
    let m = synthetic();
    let args = [
        "run",
        "-m",
        m,
        "-t",
        "1",
        "--ctx-size",
        "4",
        "a long prompt that does not fit",
    ];
    fails(&args, &rill(&args), &["context"]);
    let args = ["run", "-m", m, "--temperature=-1", "hi"];
    fails(&args, &rill(&args), &["temperature"]);
    let args = ["run", "-m", m, "--raw", ""];
    fails(&args, &rill(&args), &["empty"]);
}

/// stdout of a successful `rill run`, without the final newline.
fn run_text(args: &[&str]) -> (String, String) {
    let out = rill(args);
    let stdout = ok(args, &out);
    let stdout = stdout
        .strip_suffix('\n')
        .unwrap_or_else(|| panic!("no final newline: {stdout:?}"))
        .to_string();
    (stdout, text(&out.stderr))
}

#[test]
fn run_sampling_flags_stop_strings_and_logprobs() {
    let m = synthetic();
    let base = [
        "run",
        "-m",
        m,
        "-t",
        "1",
        "--raw",
        "-n",
        "32",
        "--ignore-eos",
    ];
    // Greedy (without --temperature rill samples with the file's or llama.cpp's settings).
    let greedy: Vec<&str> = [&base[..], &["--temperature", "0"]].concat();
    let mut args: Vec<&str> = greedy.clone();
    args.push("Once upon a time");
    let (full, stderr) = run_text(&args);
    // The end of a run: the finish reason and both speeds, on stderr.
    assert!(
        stderr.contains("finish: length") && stderr.matches("tok/s").count() == 2,
        "{stderr}"
    );
    assert!(
        !full.contains("Once upon"),
        "stdout holds the prompt: {full:?}"
    );

    // --stop cuts the text before the stop string (a piece of the greedy text, so it occurs).
    let chars: Vec<char> = full.chars().collect();
    let from = (6..chars.len() - 2)
        .find(|&i| {
            chars[i..i + 2]
                .iter()
                .all(|&c| !c.is_control() && c != '\\')
        })
        .unwrap_or_else(|| panic!("no plain two characters in {full:?}"));
    let stop: String = chars[from..from + 2].iter().collect();
    let cut = full.find(&stop).unwrap();
    let stop_arg = format!("--stop={stop}");
    let mut args: Vec<&str> = greedy.clone();
    args.extend(["--stop", "never-there", &stop_arg, "Once upon a time"]);
    let (stopped, stderr) = run_text(&args);
    assert_eq!(stopped, full[..cut], "--stop {stop:?}");
    assert!(
        stderr.contains("finish: stop") && stderr.contains(&format!("{stop:?}")),
        "{stderr}"
    );

    // Alternatives go to stderr; stdout is unchanged, and --show-probs adds no colour to a pipe.
    let mut args: Vec<&str> = greedy.clone();
    args.extend(["--top-logprobs", "3", "--show-probs", "Once upon a time"]);
    let (same, stderr) = run_text(&args);
    assert_eq!(same, full);
    assert_eq!(stderr.matches("  raw ").count(), 32 * 3, "{stderr}");
    assert!(stderr.contains("[31] "), "{stderr}");

    // Every sampling flag at once: accepted, and the same seed gives the same text.
    let mut args: Vec<&str> = base.to_vec();
    args.extend([
        "--temperature",
        "0.9",
        "--seed",
        "5",
        "--top-k",
        "50",
        "--top-p",
        "0.95",
        "--min-p",
        "0.01",
        "--typical-p",
        "0.99",
        "--repeat-penalty",
        "1.2",
        "--repeat-last-n",
        "-1",
        "--presence-penalty",
        "-0.5",
        "--frequency-penalty",
        "0.3",
        "--logit-bias",
        "97=2",
        "--logit-bias",
        "98=-inf",
        "--min-tokens",
        "4",
        "--stop-token-id",
        "258",
        "--sampler-order",
        "penalties,logit-bias,temperature,top-k,typical,top-p,min-p",
        "Once upon a time",
    ]);
    let (a, stderr) = run_text(&args);
    let (b, _) = run_text(&args);
    assert_eq!(a, b);
    assert!(!a.contains('b'), "token 98 ('b') is forbidden: {a:?}");
    assert!(stderr.contains("seed 5"), "{stderr}");
}

#[test]
fn run_bad_sampling_flags() {
    let m = synthetic();
    for (flags, needles) in [
        (&["--top-p", "1.5"][..], &["top_p", "1.5"][..]),
        (&["--top-p", "0"][..], &["top_p"][..]),
        (&["--min-p=-0.1"][..], &["min_p"][..]),
        (&["--typical-p", "NaN"][..], &["typical_p", "NaN"][..]),
        (&["--repeat-penalty", "0"][..], &["repeat_penalty"][..]),
        (&["--presence-penalty", "3"][..], &["presence_penalty"][..]),
        (&["--logit-bias", "1=nan"][..], &["logit bias"][..]),
        (
            &["--logit-bias", "999=1"][..],
            &["logit_bias", "999", "vocabulary"][..],
        ),
        (
            &["--stop-token-id", "100000"][..],
            &["stop_token_ids", "vocabulary"][..],
        ),
        (&["--top-logprobs", "21"][..], &["top_logprobs", "20"][..]),
        (&["--stop", ""][..], &["--stop"][..]),
        (&["--sampler-order", "top-k,nope"][..], &["nope"][..]),
        (
            &["--top-k", "5", "--sampler-order", "temperature"][..],
            &["top-k"][..],
        ),
        (&["--repeat-last-n", "-2"][..], &["repeat-last-n"][..]),
    ] {
        let mut args = vec!["run", "-m", m, "-t", "1", "-n", "2"];
        args.extend(flags);
        args.push("hi");
        fails(&args, &rill(&args), needles);
    }
    // A malformed ID=BIAS is a usage error.
    let args = ["run", "-m", m, "--logit-bias", "7", "hi"];
    let out = rill(&args);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("ID=BIAS"));
}

#[test]
fn run_smollm2() {
    let args = [
        "run",
        "-m",
        smollm2(),
        "-t",
        "2",
        "-n",
        "8",
        "What is the capital of France?",
    ];
    let out = {
        let _g = heavy();
        rill(&args)
    };
    let out = ok(&args, &out);
    assert!(!out.trim().is_empty());
}

// ---------------------------------------------------------------------------------------------
// chat.

/// Parses "[prompt: R reused from the cache, C computed; ...]" lines.
fn chat_stats(stderr: &str) -> Vec<(usize, usize)> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("[prompt: ")?;
            let (reused, rest) = rest.split_once(" reused from the cache, ")?;
            let (computed, _) = rest.split_once(" computed")?;
            Some((reused.parse().ok()?, computed.parse().ok()?))
        })
        .collect()
}

#[test]
fn chat_smollm2_reuses_the_cache() {
    let args = ["chat", "-m", smollm2(), "-t", "2", "-n", "12", "--stats"];
    let out = {
        let _g = heavy();
        rill_with(
            &args,
            Some(b"What is the capital of France?\nAnd of Italy?\n"),
            &[],
        )
    };
    let stdout = ok(&args, &out);
    let stderr = text(&out.stderr);
    let stats = chat_stats(&stderr);
    assert_eq!(stats.len(), 2, "two turns expected: {stderr}");
    assert!(!stdout.trim().is_empty());
    let (reused1, computed1) = stats[0];
    let (reused2, computed2) = stats[1];
    assert_eq!(reused1, 0, "{stderr}");
    // The second turn reuses at least the whole first prompt, and computes less than it reuses.
    assert!(reused2 >= computed1, "history prefilled again: {stderr}");
    assert!(computed2 < reused2, "{stderr}");
}

#[test]
fn chat_synthetic_two_turns() {
    let args = [
        "chat",
        "-m",
        synthetic(),
        "-t",
        "1",
        "-n",
        "6",
        "--stats",
        "--seed",
        "1",
    ];
    let out = rill_with(&args, Some(b"hello\n\nsecond turn\n"), &[]);
    ok(&args, &out);
    let stderr = text(&out.stderr);
    let stats = chat_stats(&stderr);
    assert_eq!(stats.len(), 2, "{stderr}");
    assert!(stats[1].0 >= stats[0].1, "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// inspect.

fn check_inspect(model: &str) -> String {
    let args = ["inspect", model];
    let out = ok(&args, &rill(&args));
    for needle in [
        "parameters",
        "FLOPs per token",
        "KV cache per token",
        "metadata",
        "tensors",
    ] {
        assert!(
            out.contains(needle),
            "inspect {model}: no {needle:?} in:\n{out}"
        );
    }
    out
}

#[test]
fn inspect_synthetic_and_smollm2() {
    let out = check_inspect(synthetic());
    assert!(out.contains("llama (2 layers, d_model 64"), "{out}");
    let out = check_inspect(synthetic_gemma());
    assert!(out.contains("sliding window 4 on 2 of 3 layers"), "{out}");
    let out = check_inspect(smollm2());
    assert!(out.contains("30 layers"), "{out}");
    assert!(out.contains("vocab 49152"), "{out}");
    let args = ["inspect", synthetic(), "--all-tensors"];
    let out = ok(&args, &rill(&args));
    assert!(out.contains("blk.1.ffn_down.weight"), "{out}");
}

#[test]
fn usage_errors_do_not_panic() {
    for args in [
        &["frobnicate"][..],
        &["run"][..],
        &["probe", "--top", "many", "x"][..],
        &["tokenize", "--file", "a", "b"][..],
    ] {
        let out = rill(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "rill {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
}

// ---------------------------------------------------------------------------------------------
// Speculative decoding and beam search.

/// A synthetic llama with other weights: a draft that often disagrees with `synthetic()`.
fn synthetic_draft() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| {
        let mut spec = SyntheticSpec::llama_tiny();
        spec.seed ^= 0xd4af7;
        write_tmp("synthetic-draft.gguf", &spec.to_bytes().unwrap())
    })
}

const REPETITIVE: &str = "the cat sat on the mat, the cat sat on the mat, the cat";

#[test]
fn run_speculative_keeps_the_greedy_text() {
    let m = synthetic();
    let base = [
        "run",
        "-m",
        m,
        "-t",
        "1",
        "--raw",
        "-n",
        "40",
        "--ignore-eos",
        "--temperature",
        "0",
    ];
    let mut args = base.to_vec();
    args.push(REPETITIVE);
    let (plain, _) = run_text(&args);
    for flags in [
        &["--speculative", "ngram"][..],
        &[
            "--speculative",
            "ngram",
            "--ngram-max",
            "2",
            "--ngram-min",
            "2",
            "--draft-tokens",
            "8",
        ][..],
        &["--draft-layers", "1", "--draft-tokens", "3"][..],
        &["--draft-model", synthetic_draft(), "--adaptive-draft"][..],
    ] {
        let mut args = base.to_vec();
        args.extend(flags);
        args.push(REPETITIVE);
        let (text, stderr) = run_text(&args);
        assert_eq!(text, plain, "{flags:?}");
        assert!(
            stderr.contains("finish: length")
                && stderr.contains("[speculative decoding (")
                && stderr.contains(" accepted (")
                && stderr.contains("acceptance by draft position: 1: "),
            "{flags:?}: {stderr}"
        );
    }
    // Sampling: the same seed gives the same text.
    let mut args = base[..base.len() - 2].to_vec();
    args.extend([
        "--draft-layers",
        "1",
        "--temperature",
        "0.8",
        "--seed",
        "11",
        REPETITIVE,
    ]);
    let (a, stderr) = run_text(&args);
    let (b, _) = run_text(&args);
    assert_eq!(a, b);
    assert!(stderr.contains("seed 11"), "{stderr}");
}

#[test]
fn run_speculative_bad_flags() {
    let m = synthetic();
    let other_vocab = edited("other-vocab.gguf", |model| {
        let Some((_, Value::Array(tokens))) = model
            .metadata
            .iter_mut()
            .find(|(k, _)| k == "tokenizer.ggml.tokens")
        else {
            panic!("no token list")
        };
        tokens[70] = Value::String("QQ".into());
    });
    for (flags, needles) in [
        (
            &["--draft-model", other_vocab.as_str()][..],
            &["draft model", "vocabulary", "token 70"][..],
        ),
        (&["--draft-layers", "2"][..], &["draft layers", "1..=1"][..]),
        (&["--draft-layers", "0"][..], &["draft layers"][..]),
        (
            &["--speculative", "ngram", "--draft-tokens", "0"][..],
            &["draft_tokens"][..],
        ),
        (
            &[
                "--speculative",
                "ngram",
                "--ngram-min",
                "3",
                "--ngram-max",
                "2",
            ][..],
            &["n-gram"][..],
        ),
        (
            &["--draft-model", "/nonexistent/draft.gguf"][..],
            &["/nonexistent/draft.gguf"][..],
        ),
    ] {
        let mut args = vec!["run", "-m", m, "-t", "1", "-n", "4"];
        args.extend(flags);
        args.push("hi");
        fails(&args, &rill(&args), needles);
    }
    // Unknown kinds and two drafts at once are usage errors.
    for flags in [
        &["--speculative", "oracle"][..],
        &["--speculative", "ngram", "--draft-layers", "1"][..],
        &["--draft-model", synthetic_draft(), "--draft-layers", "1"][..],
    ] {
        let mut args = vec!["run", "-m", m, "-t", "1", "-n", "4"];
        args.extend(flags);
        args.push("hi");
        let out = rill(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn run_beam_search() {
    let m = synthetic();
    let args = [
        "run",
        "-m",
        m,
        "-t",
        "1",
        "--raw",
        "-n",
        "12",
        "--beam-width",
        "3",
        "--length-penalty",
        "0.5",
        "Once upon a time",
    ];
    let (best, stderr) = run_text(&args);
    let beams: Vec<&str> = stderr.lines().filter(|l| l.starts_with("[beam ")).collect();
    assert_eq!(beams.len(), 3, "{stderr}");
    assert!(beams[0].starts_with("[beam 1] score "), "{stderr}");
    assert!(
        beams[0].ends_with(&format!("{best:?}")),
        "{best:?} vs {stderr}"
    );
    assert!(
        stderr.contains("beam search of width 3 (length penalty 0.5)"),
        "{stderr}"
    );
    // Scores are in decreasing order.
    let scores: Vec<f64> = beams
        .iter()
        .map(|l| l.split_whitespace().nth(3).unwrap().parse().unwrap())
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    // Width 1 is plain greedy decoding.
    let mut one = args[..args.len() - 1].to_vec();
    one[9] = "1";
    one.extend(["--temperature", "0", "Once upon a time"]);
    let mut plain = args[..8].to_vec();
    plain.extend(["--temperature", "0", "Once upon a time"]);
    assert_eq!(run_text(&one).0, run_text(&plain).0);
    // Flags beam search cannot honour, and bad values, are refused.
    for (flags, needles) in [
        (
            &["--beam-width", "3", "--temperature", "0.7", "--stop", "x"][..],
            &["--beam-width", "--temperature", "--stop"][..],
        ),
        (
            &["--beam-width", "2", "--speculative", "ngram"][..],
            &["--beam-width", "speculative"][..],
        ),
        (&["--beam-width", "0"][..], &["--beam-width"][..]),
        (&["--beam-width", "600"][..], &["beam width", "600"][..]),
        (
            &["--beam-width", "2", "--length-penalty", "inf"][..],
            &["length penalty"][..],
        ),
    ] {
        let mut args = vec!["run", "-m", m, "-t", "1", "-n", "4"];
        args.extend(flags);
        args.push("hi");
        fails(&args, &rill(&args), needles);
    }
}

#[test]
fn bench_prompt_file_compares_plain_and_speculative() {
    let m = synthetic();
    let prompt = write_tmp("bench-prompt.txt", REPETITIVE.as_bytes());
    let args = [
        "bench",
        "-m",
        m,
        "-t",
        "1",
        "--prompt-file",
        &prompt,
        "--raw",
        "--ignore-eos",
        "--speculative",
        "ngram",
        "-n",
        "24",
        "-r",
        "2",
    ];
    let out = ok(&args, &rill(&args));
    assert!(out.contains("decode24 "), "{out}");
    assert!(out.contains("decode24+ngram(k=5)"), "{out}");
    assert!(out.contains("speedup "), "{out}");
    assert!(
        out.contains("greedy outputs identical: yes (24 tokens, finish: length)"),
        "{out}"
    );
    assert!(out.contains("acceptance by draft position"), "{out}");
    let mut json = args.to_vec();
    json.extend(["--draft-tokens", "3", "--json"]);
    let out = ok(&json, &rill(&json));
    let lines: Vec<Json> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0]["test"], "decode24");
    assert_eq!(lines[1]["test"], "decode24+ngram(k=3)");
    assert_eq!(lines[1]["identical_output"], true);
    assert!(lines[1]["acceptance_rate"].as_f64().is_some());
    assert_eq!(lines[1]["generated_tokens"], 24);
    // Draft flags need a prompt; a missing prompt file is named.
    let args = ["bench", "-m", m, "-t", "1", "--speculative", "ngram"];
    fails(&args, &rill(&args), &["--prompt-file"]);
    let args = [
        "bench",
        "-m",
        m,
        "-t",
        "1",
        "--prompt-file",
        "/nonexistent/p.txt",
    ];
    fails(&args, &rill(&args), &["/nonexistent/p.txt"]);
}

#[test]
fn run_smollm2_prompt_lookup_keeps_the_greedy_text() {
    let passage = "Repeat exactly: The quick brown fox jumps over the lazy dog while the \
                   small cat watches from the warm windowsill.";
    let base = [
        "run",
        "-m",
        smollm2(),
        "-t",
        "2",
        "-n",
        "24",
        "--temperature",
        "0",
    ];
    let mut plain = base.to_vec();
    plain.push(passage);
    let mut spec = base.to_vec();
    spec.extend(["--speculative", "ngram", passage]);
    let _g = heavy();
    let (a, _) = run_text(&plain);
    let (b, stderr) = run_text(&spec);
    assert_eq!(a, b);
    assert!(stderr.contains("prompt lookup"), "{stderr}");
}

#[test]
fn probe_lens_prints_one_entry_per_layer() {
    let args = [
        "probe",
        "-m",
        smollm2(),
        "--lens",
        "--json",
        "--top",
        "3",
        "The capital of France is",
    ];
    let out = rill(&args);
    let doc: serde_json::Value = serde_json::from_str(ok(&args, &out).trim()).unwrap();
    let lens = doc["lens"].as_array().unwrap();
    // The embeddings, then SmolLM2's 30 blocks.
    assert_eq!(lens.len(), 31);
    for (i, l) in lens.iter().enumerate() {
        assert_eq!(l["layer"], i);
        assert_eq!(l["top_ids"].as_array().unwrap().len(), 3);
        let lps: Vec<f64> = l["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]) && lps[0] <= 0.0, "{l}");
    }
    let last = lens.last().unwrap();
    assert_eq!(last["chosen_rank"], 0);
    assert_eq!(last["top_ids"][0], doc["chosen"]);
    // The plain probe's prediction at the last position is the lens's last layer.
    let plain = rill(&[
        "probe",
        "-m",
        smollm2(),
        "--json",
        "--top",
        "1",
        "The capital of France is",
    ]);
    let plain: serde_json::Value = serde_json::from_str(text(&plain.stdout).trim()).unwrap();
    let positions = plain["positions"].as_array().unwrap();
    assert_eq!(positions.last().unwrap()["top_ids"][0], doc["chosen"]);
}

#[test]
fn probe_attention_gives_every_layer_and_head() {
    let args = [
        "probe",
        "-m",
        smollm2(),
        "--attention",
        "--json",
        "The capital of France is",
    ];
    let out = rill(&args);
    let doc: serde_json::Value = serde_json::from_str(ok(&args, &out).trim()).unwrap();
    let n = doc["token_ids"].as_array().unwrap().len();
    let layers = doc["attention"].as_array().unwrap();
    // SmolLM2: 30 blocks of 9 query heads.
    assert_eq!(layers.len(), 30);
    for heads in layers {
        let heads = heads.as_array().unwrap();
        assert_eq!(heads.len(), 9);
        for w in heads {
            let w: Vec<f64> = w
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            assert_eq!(w.len(), n);
            assert!(w.iter().all(|&x| (0.0..=1.0).contains(&x)));
            assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-4, "{w:?}");
        }
    }
}

#[test]
fn a_receipt_replays_bit_for_bit_and_a_changed_one_does_not() {
    let dir = std::env::temp_dir().join(format!("rill-receipt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let receipt = dir.join("r.json");
    let r = receipt.to_str().unwrap();
    let args = [
        "run",
        "-m",
        smollm2(),
        "--seed",
        "11",
        "-n",
        "16",
        "--receipt",
        r,
        "Tell me a joke.",
    ];
    let out = rill(&args);
    ok(&args, &out);
    // A sampled generation (up to 16 tokens), replayed with one thread and with two.
    let recorded = read_json(&receipt)["tokens"].as_array().unwrap().len();
    assert!((6..=16).contains(&recorded), "{recorded} tokens");
    for threads in ["1", "2"] {
        let args = ["replay", r, "--threads", threads];
        let out = rill(&args);
        assert!(
            ok(&args, &out).starts_with(&format!("identical: {recorded} tokens")),
            "{}",
            text(&out.stdout)
        );
    }
    // A receipt whose tokens were changed is caught at the changed token.
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&receipt).unwrap()).unwrap();
    let t = doc["tokens"][5].as_u64().unwrap();
    doc["tokens"][5] = serde_json::json!(t + 1);
    let changed = dir.join("changed.json");
    std::fs::write(&changed, doc.to_string()).unwrap();
    let out = rill(&["replay", changed.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("differs at generated token 5"),
        "{}",
        text(&out.stderr)
    );
    // Another model file is refused by its hash.
    doc["model"]["sha256"] = serde_json::json!("00");
    std::fs::write(&changed, doc.to_string()).unwrap();
    let out = rill(&["replay", changed.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is not the receipt's model"),
        "{}",
        text(&out.stderr)
    );
    // Receipts record plain generations only.
    let out = rill(&[
        "run",
        "-m",
        smollm2(),
        "--receipt",
        r,
        "--beam-width",
        "2",
        "hi",
    ]);
    assert!(!out.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--kv-type`: a generation with a quantized KV cache is recorded with its types and replays
/// bit for bit; `rill bench --depth --kv-type` reports each depth and type; heads that are not
/// whole blocks of 32 get an error naming the type.
#[test]
fn quantized_kv_cache_runs_replays_and_benches() {
    let dir = std::env::temp_dir().join(format!("rill-kv-type-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let receipt = dir.join("q8.json");
    let r = receipt.to_str().unwrap();
    let m = synthetic_gemma();
    let args = [
        "run",
        "-m",
        m,
        "--kv-type",
        "q8_0",
        "--kv-type-v",
        "q4_0",
        "--seed",
        "3",
        "-n",
        "8",
        "--raw",
        "--receipt",
        r,
        "hello",
    ];
    let out = rill(&args);
    ok(&args, &out);
    let doc = read_json(&receipt);
    assert_eq!(doc["kv_types"]["keys"], "q8_0");
    assert_eq!(doc["kv_types"]["values"], "q4_0");
    let args = ["replay", r];
    let out = rill(&args);
    assert!(
        ok(&args, &out).starts_with("identical"),
        "{}",
        text(&out.stdout)
    );

    let args = [
        "bench",
        "-m",
        m,
        "-t",
        "1",
        "-p",
        "8",
        "-n",
        "4",
        "-d",
        "0,20",
        "--kv-type",
        "f16,q8_0",
        "-r",
        "1",
        "--json",
    ];
    let out = rill(&args);
    let lines: Vec<Json> = ok(&args, &out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(String, u64, String)> = lines
        .iter()
        .map(|l| {
            let test = l["test"].as_str().unwrap().to_string();
            (
                test,
                l["depth"].as_u64().unwrap(),
                l["kv_type"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(seen.len(), 8, "{seen:?}");
    for kv in ["f16", "q8_0"] {
        for depth in [0, 20] {
            for test in ["pp8", "tg4"] {
                assert!(seen.contains(&(test.into(), depth, kv.into())), "{seen:?}");
            }
        }
    }
    let f16 = &lines[0]["kv_bytes_per_token"];
    let q8 = &lines[4]["kv_bytes_per_token"];
    // 34 bytes per 32 elements against 64.
    assert_eq!(
        q8.as_u64().unwrap() * 64,
        f16.as_u64().unwrap() * 34,
        "{f16} {q8}"
    );

    let args = [
        "run",
        "-m",
        synthetic(),
        "--kv-type",
        "q4_0",
        "-n",
        "2",
        "--raw",
        "hi",
    ];
    let out = rill(&args);
    fails(&args, &out, &["q4_0", "16"]);
    let _ = std::fs::remove_dir_all(&dir);
}
