//! Probe.

use super::*;

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
