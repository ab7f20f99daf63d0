//! Qwen3.5's multi-token-prediction block (`tests/data/tiny/qwen35mtp-tiny`: qwen35-tiny with an
//! MTP block, converted by llama.cpp's converter) against its reference, assembled from
//! transformers' own layer classes (`tools/models/make_mtp.py`): at every pair `(h_{p-1}, x_p)`
//! of each prompt, the block's logits for `x_{p+1}`, on the exact path to the bars of the main
//! models (argmax where the reference's top-2 gap is at least 1e-3, KL <= 1e-4), in one pass or
//! several.

mod reference_check;

use reference_check::{argmax, data_dir, ids, kl, read_f32};
use rill_model::{Batch, Model, Precision};

fn load() -> (Model, serde_json::Value, std::path::PathBuf) {
    let dir = data_dir().join("tiny/qwen35mtp-tiny");
    let model = Model::load(dir.join("model.gguf"), 2).expect("the model loads");
    let doc = std::fs::read_to_string(dir.join("mtp_reference.json")).expect("mtp_reference.json");
    (model, serde_json::from_str(&doc).unwrap(), dir)
}

/// The main pass's last hidden states of `tokens` (the hidden log of one prompt pass).
fn hidden(model: &mut Model, tokens: &[u32], precision: Precision) -> Vec<f32> {
    let mut kv = model.new_kv_cache(tokens.len() + 16, precision).unwrap();
    kv.add_sequence(0).unwrap();
    model.set_hidden_log(true);
    let mut logits = Vec::new();
    let batch = Batch::prompt(0, tokens, 0, false);
    model
        .forward(&batch, &mut kv, precision, &mut logits)
        .unwrap();
    let log = model.take_hidden_log();
    model.set_hidden_log(false);
    assert_eq!(log.rows.len(), tokens.len());
    assert!(log
        .rows
        .iter()
        .enumerate()
        .all(|(i, &(s, p))| s == 0 && p == i));
    log.data
}

/// The block's logits at every pair of `tokens`, in passes of `split` pairs.
fn mtp_logits(model: &mut Model, tokens: &[u32], precision: Precision, split: usize) -> Vec<f32> {
    let d = model.config().d_model;
    let h = hidden(model, tokens, precision);
    let mut kv = model
        .new_mtp_kv_cache(tokens.len() + 16, precision)
        .unwrap();
    kv.add_sequence(0).unwrap();
    let (mut all, mut logits, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let pairs = tokens.len() - 1;
    let mut p = 0;
    while p < pairs {
        let n = split.min(pairs - p);
        let mut batch = Batch::new();
        for j in p..p + n {
            batch.push(0, tokens[j + 1], j, true);
        }
        let h_prev = &h[p * d..(p + n) * d];
        model
            .forward_mtp(&batch, h_prev, &mut kv, precision, &mut logits, &mut out)
            .unwrap();
        assert_eq!(out.len(), n * d);
        all.extend_from_slice(&logits);
        p += n;
    }
    all
}

#[test]
fn the_mtp_block_gives_the_references_logits_at_every_pair() {
    let (mut model, doc, dir) = load();
    assert!(
        model.has_mtp(),
        "{:?}",
        rill_model::mtp::why_not(model.config())
    );
    let vocab = model.config().vocab_size;
    for case in doc["cases"].as_array().unwrap() {
        let name = case["id"].as_str().unwrap();
        let tokens = ids(&case["token_ids"]);
        let reference = read_f32(&dir.join(format!("{name}.mtp_logits.f32")));
        for split in [usize::MAX, 5] {
            let got = mtp_logits(&mut model, &tokens, Precision::Exact, split);
            assert_eq!(got.len(), reference.len());
            let mut worst = 0f64;
            for (i, (r, g)) in reference
                .chunks_exact(vocab)
                .zip(got.chunks_exact(vocab))
                .enumerate()
            {
                let mut sorted = r.to_vec();
                sorted.sort_by(|a, b| b.total_cmp(a));
                if sorted[0] - sorted[1] >= 1e-3 {
                    assert_eq!(argmax(g), argmax(r), "{name}: pair {i} (split {split})");
                }
                worst = worst.max(kl(r, g));
            }
            assert!(worst <= 1e-4, "{name}: KL {worst} (split {split})");
            eprintln!("{name} (passes of {split}): worst pair KL {worst:.2e}");
        }
        // The fast path, reported and held loosely (random weights: near-ties are common).
        let fast = mtp_logits(&mut model, &tokens, Precision::Fast, usize::MAX);
        let (mut same, mut sum) = (0, 0.0);
        for (r, g) in reference.chunks_exact(vocab).zip(fast.chunks_exact(vocab)) {
            same += usize::from(argmax(r) == argmax(g));
            sum += kl(r, g);
        }
        let n = reference.len() / vocab;
        eprintln!(
            "{name}: fast path top-1 {same}/{n}, mean KL {:.5}",
            sum / n as f64
        );
        assert!(
            sum / (n as f64) < 0.01,
            "{name}: fast path mean KL {}",
            sum / n as f64
        );
    }
}

#[test]
fn a_file_without_an_mtp_block_says_why() {
    let dir = data_dir().join("tiny/qwen35-tiny");
    let mut model = Model::load(dir.join("model.gguf"), 1).unwrap();
    assert!(!model.has_mtp());
    let mut kv = model.new_mtp_kv_cache(16, Precision::Exact).unwrap();
    kv.add_sequence(0).unwrap();
    let d = model.config().d_model;
    let err = model
        .forward_mtp(
            &Batch::prompt(0, &[1], 0, true),
            &vec![0.0; d],
            &mut kv,
            Precision::Exact,
            &mut Vec::new(),
            &mut Vec::new(),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("no multi-token-prediction block"),
        "{err}"
    );
}
