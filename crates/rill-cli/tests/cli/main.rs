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

fn bytes_as_ids(s: &[u8]) -> Vec<u64> {
    s.iter().map(|&b| u64::from(b)).collect()
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

mod bad_files;
mod chat;
mod embed;
mod inspect;
mod probe;
mod run;
mod speculative_and_beams;
mod tokenize;
