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

/// At a terminal (a pty, through `script`), `rill chat` reads messages with a line editor:
/// arrow keys edit the line instead of landing in the message, `"""` lines bracket a message of
/// several lines, history is kept per model under `$RILL_HOME/history`, and `/save` writes the
/// conversation. Each line is typed when the editor asks for it.
#[test]
fn chat_at_a_terminal_edits_lines_and_keeps_history() {
    use std::io::{Read, Write};
    let home = tmp_path("chat-home");
    let saved = tmp_path("conversation.json");
    let command = format!(
        "{} chat -m {} -t 1 -n 2 --seed 1",
        env!("CARGO_BIN_EXE_rill"),
        synthetic()
    );
    let mut child = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .env("RILL_HOME", &home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs the chat in a pseudo-terminal: apt install util-linux");
    // Each line is typed once the editor asks for it: every read of a line starts by switching
    // bracketed paste on (`ESC [?2004h`), redraws do not.
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut screen = Vec::new();
    let marker = b"\x1b[?2004h";
    let save = format!("/save {}\r", saved.display());
    let lines: [&[u8]; 7] = [
        b"helo\x1b[Dl\r", // "helo", left arrow, "l": "hello"
        b"\"\"\"\r",
        b"line one\r",
        b"line two\r",
        b"\"\"\"\r",
        save.as_bytes(),
        b"/exit\r",
    ];
    for (n, line) in lines.iter().enumerate() {
        let mut byte = [0u8; 1];
        while screen.windows(marker.len()).filter(|w| w == marker).count() <= n {
            let got = stdout.read(&mut byte).unwrap();
            assert!(
                got == 1,
                "the chat ended early: {}",
                String::from_utf8_lossy(&screen)
            );
            screen.push(byte[0]);
        }
        stdin.write_all(line).unwrap();
        stdin.flush().unwrap();
    }
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    screen.extend(rest);
    let status = child.wait().unwrap();
    assert!(status.success(), "{}", String::from_utf8_lossy(&screen));
    let doc: Json = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let messages = doc["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["content"], "hello");
    assert_eq!(messages[2]["content"], "line one\nline two");
    let history = std::fs::read_to_string(home.join("history/synthetic-llama.gguf.txt")).unwrap();
    assert!(history.contains("hello"), "{history}");
}
