//! Chat.

use super::*;

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

/// Ctrl-C during an answer stops that answer (kept in the conversation) and the chat goes on.
/// `RILL_HOLD_FOR_INTERRUPT` holds the answer after its first token until the signal lands.
#[test]
fn chat_ctrl_c_stops_the_answer_and_goes_on() {
    use std::io::{Read, Write};
    let mut child = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args([
            "chat",
            "-m",
            synthetic(),
            "-t",
            "1",
            "-n",
            "100000",
            "--stats",
        ])
        .stdin(Stdio::piped())
        .env("RILL_HOLD_FOR_INTERRUPT", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hello\n").unwrap();
    stdin.flush().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    stdin.write_all(b"/exit\n").unwrap();
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.contains("(stopped)"), "{stderr}");
    assert!(stderr.contains("finish: cancelled"), "{stderr}");
}
