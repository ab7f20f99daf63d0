//! Tokenize.

use super::*;

fn tokenize_json(args: &[&str], stdin: Option<&[u8]>) -> Vec<u64> {
    let out = ok(args, &rill_with(args, stdin, &[]));
    let v: Json = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
    ids_of(&v["ids"])
}

#[test]
fn tokenize_synthetic() {
    let m = synthetic();
    // Byte-level vocabulary without merges: the ids are the UTF-8 bytes.
    let ids = tokenize_json(&["tokenize", "-m", m, "--json", "héllo wörld"], None);
    assert_eq!(ids, bytes_as_ids("héllo wörld".as_bytes()));
    // A text starting with '-' goes after `--` (without, it is a flag: a mistyped one is an
    // error, never the text).
    let ids = tokenize_json(&["tokenize", "-m", m, "--json", "--", "-n 5"], None);
    assert_eq!(ids, bytes_as_ids(b"-n 5"));
    let out = rill(&["tokenize", "-m", m, "--json", "-n 5"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
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
