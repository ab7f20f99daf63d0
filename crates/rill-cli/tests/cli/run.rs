//! Run.

use super::*;

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

/// A mistyped flag is an error naming it (with the closest flag), never the prompt; a prompt
/// starting with '-' goes after `--`; a negative count is a bad value of its flag.
#[test]
fn mistyped_flags_are_errors_not_prompts() {
    // A usage error: clap's message (the first line names the problem), exit status 2.
    let usage_error = |args: &[&str], needles: &[&str]| {
        let out = rill(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "rill {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let first = stderr.lines().next().unwrap_or("");
        assert!(first.starts_with("error: "), "{stderr}");
        for n in needles {
            assert!(stderr.contains(n), "rill {args:?}: no {n:?} in {stderr}");
        }
    };
    let m = synthetic();
    usage_error(
        &["run", "-m", m, "--tempreature"],
        &[
            "unexpected argument '--tempreature'",
            "a similar argument exists: '--temperature'",
        ],
    );
    usage_error(
        &["run", "-m", m, "--bogus-flag", "hi"],
        &["unexpected argument '--bogus-flag'"],
    );
    usage_error(
        &["bench", "-m", m, "-d", "-5"],
        &["invalid value '-5' for '--depth"],
    );
    let args = [
        "run",
        "-m",
        m,
        "-t",
        "1",
        "-n",
        "2",
        "--raw",
        "--",
        "-a prompt",
    ];
    ok(&args, &rill(&args));
    let args = ["tokenize", "-m", m, "--", "-x"];
    ok(&args, &rill(&args));
}

/// Error wording: a bad serving flag is the only thing said (before the port is bound, not
/// as an "invalid sampling parameter"); a text file named .gguf shows its first bytes as text.
#[test]
fn errors_say_what_is_wrong_in_words() {
    let m = synthetic();
    let args = ["serve", "-m", m, "--port", "0", "--kv-cache-mb", "0"];
    let err = fails(
        &args,
        &rill(&args),
        &["invalid serving configuration", "--kv-cache-mb"],
    );
    assert!(!err.contains("listening"), "{err}");
    let text_file = write_tmp("notes.gguf", b"hello, this is text\n");
    let args = ["run", "-m", &text_file, "hi"];
    fails(
        &args,
        &rill(&args),
        &["not a gguf file", "starts with \"hell\""],
    );
}

/// A base model (no chat template, nothing in its name of instruction tuning) gets the prompt
/// as it is unless `--chat`; the end line always says which template was applied.
#[test]
fn base_models_run_raw_and_the_end_line_names_the_template() {
    let without = |name: &str, general_name: &str| {
        edited(name, |m| {
            m.remove_metadata("tokenizer.chat_template");
            m.set_metadata("general.name", Value::String(general_name.into()));
        })
    };
    let base = without("base.gguf", "Tiny 1B");
    let tuned = without("tuned.gguf", "Tiny 1B Instruct");
    let cases: [(&str, &[&str], &str); 5] = [
        (synthetic(), &[], "the file's chat template"),
        (synthetic(), &["--raw"], "no chat template (--raw)"),
        (&base, &[], "no chat template: a base model"),
        (
            &base,
            &["--chat"],
            "the built-in ChatML template (the file has none)",
        ),
        (
            &tuned,
            &[],
            "the built-in ChatML template (the file has none)",
        ),
    ];
    for (model, extra, note) in cases {
        let mut args = vec!["run", "-m", model, "-t", "1", "-n", "2"];
        args.extend_from_slice(extra);
        args.push("hello");
        let out = rill(&args);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(note), "{args:?}: no {note:?} in {stderr}");
    }
}

/// Ctrl-C during `rill run` stops the answer: the usual end line, finish `cancelled`, exit 0.
/// The signal goes once the first token is out (read from its stdout); the answer waits for
/// it there (`RILL_HOLD_FOR_INTERRUPT`).
#[test]
fn ctrl_c_stops_the_answer_with_the_end_line() {
    use std::io::Read;
    let m = synthetic();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args([
            "run",
            "-m",
            m,
            "-t",
            "1",
            "-n",
            "200000",
            "--ignore-eos",
            "--raw",
            "hi",
        ])
        .env("RILL_HOLD_FOR_INTERRUPT", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.contains("finish: cancelled"), "{stderr}");
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
