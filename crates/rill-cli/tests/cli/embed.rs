//! Embed: texts to vectors on the tiny random BERT (`tests/data/tiny/bert-tiny/`): the exact
//! path's vectors within 1e-5 of transformers', its file's CLS pooling; fewer dimensions;
//! the similarity table; bad input as one line; generation refused on an encoder.

use super::*;

fn bert() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/tiny/bert-tiny");
    dir.join("model.gguf").display().to_string()
}

#[test]
fn embed_gives_transformers_vectors() {
    let m = bert();
    let reference: Json = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&m).with_file_name("reference.json")).unwrap(),
    )
    .unwrap();
    let cases: Vec<&Json> = (reference["cases"].as_array().unwrap().iter())
        .filter(|c| c["text"].is_string())
        .collect();
    let mut args = vec!["embed", "-m", &m, "--exact", "--json"];
    args.extend(cases.iter().map(|c| c["text"].as_str().unwrap()));
    let out = ok(&args, &rill(&args));
    let doc: Json = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(doc["pooling"], "cls", "the file's pooling");
    assert_eq!(doc["dimensions"], 64);
    for (i, case) in cases.iter().enumerate() {
        assert_eq!(
            doc["tokens"][i],
            case["token_ids"].as_array().unwrap().len()
        );
        let got = doc["embeddings"][i].as_array().unwrap();
        let want = case["cls"].as_array().unwrap();
        for (g, w) in got.iter().zip(want) {
            let off = (g.as_f64().unwrap() - w.as_f64().unwrap()).abs();
            assert!(off <= 1e-5, "{}: off by {off}", case["id"]);
        }
    }
    // Fewer dimensions, normalised again.
    let args = ["embed", "-m", &m, "--json", "--dimensions", "8", "hello"];
    let doc: Json = serde_json::from_str(ok(&args, &rill(&args)).trim()).unwrap();
    let v: Vec<f64> = (doc["embeddings"][0].as_array().unwrap().iter())
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(v.len(), 8);
    assert!((v.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-5);
    // The table: each text's first values and the similarities, 1 on the diagonal.
    let args = [
        "embed",
        "-m",
        &m,
        "--pooling",
        "mean",
        "hello world",
        "the lazy dog",
    ];
    let out = ok(&args, &rill(&args));
    assert!(out.contains("mean pooling, 64 dimensions"), "{out}");
    assert!(out.contains("[0]  1.000"), "{out}");
    assert!(out.contains("[1]") && out.contains(" 1.000\n"), "{out}");
}

#[test]
fn embed_bad_input_and_an_encoder_that_cannot_generate() {
    let m = bert();
    for (args, needles) in [
        (vec!["embed", "-m", &m], &["no text"][..]),
        (vec!["embed", "-m", &m, "a", " "], &["text 1 is empty"][..]),
        (
            vec!["embed", "-m", &m, "--dimensions", "65", "a"],
            &["--dimensions", "1..=64"][..],
        ),
        (
            vec!["run", "-m", &m, "-n", "2", "hello"],
            &["encoder", "no output head"][..],
        ),
    ] {
        fails(&args, &rill(&args), needles);
    }
}
