//! Speculative decoding and beam search.

use super::*;

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
        &[
            "--draft-layers",
            "1",
            "--draft-tokens",
            "3",
            "--fixed-draft",
        ][..],
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
    // Unknown kinds, two drafts at once and both draft-length rules are usage errors.
    for flags in [
        &["--speculative", "oracle"][..],
        &[
            "--speculative",
            "ngram",
            "--fixed-draft",
            "--adaptive-draft",
        ][..],
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
