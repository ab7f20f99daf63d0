//! The two-pass output head against the one-pass head on the two real models: for every row
//! of the reference prompts and a few hundred positions of a long text, in prompt passes and
//! one token at a time, the values a cut needs are the one-pass head's bit for bit (greedy's
//! token, top-k's set, min-p's band), and every other token's estimate is below the cut.

mod reference_check;

use reference_check::data_dir;
use rill_model::{Batch, HeadCut, Model, Precision, TwoPassMode};
use serde_json::Value;

fn load(builtin: &str) -> Model {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::resolve(builtin, &opts)
        .unwrap_or_else(|e| panic!("{e} (run `cargo run --release -- pull {builtin}`)"));
    Model::load(&path, 0).expect("model loads")
}

/// The prompts: every reference case, and the first `long` tokens of the long-context text.
fn prompts(folder: &str, long: usize) -> Vec<Vec<u32>> {
    let dir = data_dir().join("reference").join(folder);
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let read = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
    };
    let mut out: Vec<Vec<u32>> = read("reference.json")["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let mut t = ids(&c["token_ids"]);
            t.extend(ids(&c["greedy_ids"]));
            t
        })
        .collect();
    let long_ids = ids(&read("long_context.json")["cases"][0]["token_ids"]);
    out.push(long_ids[..long].to_vec());
    out
}

/// Every row's logits with `cut` (None: the one-pass head), the prompt in one pass.
fn prompt_logits(model: &mut Model, tokens: &[u32], cut: Option<HeadCut>) -> Vec<f32> {
    let mut kv = model
        .new_kv_cache(tokens.len() + 8, Precision::Fast)
        .unwrap();
    kv.add_sequence(0).unwrap();
    let mut batch = Batch::new();
    for (i, &t) in tokens.iter().enumerate() {
        match cut {
            Some(c) => batch.push_cut(0, t, i, c),
            None => batch.push(0, t, i, true),
        }
    }
    let mut logits = Vec::new();
    model
        .forward(&batch, &mut kv, Precision::Fast, &mut logits)
        .unwrap();
    logits
}

/// Every row's logits with `cut`, one token per pass (decoding).
fn step_logits(model: &mut Model, tokens: &[u32], cut: Option<HeadCut>) -> Vec<f32> {
    let mut kv = model
        .new_kv_cache(tokens.len() + 8, Precision::Fast)
        .unwrap();
    kv.add_sequence(0).unwrap();
    let (mut all, mut logits) = (Vec::new(), Vec::new());
    for (i, &t) in tokens.iter().enumerate() {
        let mut batch = Batch::new();
        match cut {
            Some(c) => batch.push_cut(0, t, i, c),
            None => batch.push(0, t, i, true),
        }
        model
            .forward(&batch, &mut kv, Precision::Fast, &mut logits)
            .unwrap();
        all.extend_from_slice(&logits);
    }
    all
}

/// Indices of `row` from the largest value down (ties by index), the first `k`.
fn top(row: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// What `cut` promises about `got` against the one-pass `full`, for one row.
fn check_row(full: &[f32], got: &[f32], cut: HeadCut, what: &str) {
    match cut {
        HeadCut::TopK(k) => {
            let k = k as usize;
            let want = top(full, k);
            let kth = full[want[k - 1]];
            for &j in &want {
                assert_eq!(got[j].to_bits(), full[j].to_bits(), "{what}: token {j}");
            }
            // Everything else is below the k-th or exactly tied with it.
            for (j, (&g, &f)) in got.iter().zip(full).enumerate() {
                if g >= kth {
                    assert_eq!(
                        g.to_bits(),
                        f.to_bits(),
                        "{what}: token {j} reaches the cut"
                    );
                }
            }
        }
        HeadCut::Within(delta) => {
            let max = full.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for (j, (&g, &f)) in got.iter().zip(full).enumerate() {
                if f >= max - delta || g >= max - delta {
                    assert_eq!(g.to_bits(), f.to_bits(), "{what}: token {j} in the band");
                }
            }
        }
        HeadCut::Full => unreachable!(),
    }
}

/// `certified`: the least share of the one-token passes whose second pass read part of the head
/// only (the certificate must do its work, not the one-pass head it falls back to).
fn check_model(builtin: &str, folder: &str, certified: f64) {
    let mut model = load(builtin);
    // Every row that allows it (SmolLM2's head is below the default's vocabulary).
    model.set_two_pass_head(TwoPassMode::On).unwrap();
    assert!(model.has_two_pass_head(), "{builtin}: no two-pass head");
    let vocab = model.config().vocab_size;
    let cuts = [
        HeadCut::TopK(1),
        HeadCut::TopK(40),
        HeadCut::Within((1.0f32 / 0.05).ln()),
    ];
    let prompts = prompts(folder, 320);
    let mut rows = 0;
    for (p, tokens) in prompts.iter().enumerate() {
        let full = prompt_logits(&mut model, tokens, None);
        for &cut in &cuts {
            let got = prompt_logits(&mut model, tokens, Some(cut));
            for (r, (f, g)) in full.chunks(vocab).zip(got.chunks(vocab)).enumerate() {
                check_row(f, g, cut, &format!("{builtin} prompt {p} row {r} {cut:?}"));
            }
        }
        rows += tokens.len();
    }
    // One token at a time (the decoding kernels), greedy, on the long text and one prompt.
    model.reset_head_stats();
    for tokens in [&prompts[prompts.len() - 1][..160], &prompts[0][..]] {
        let full = step_logits(&mut model, tokens, None);
        let got = step_logits(&mut model, tokens, Some(HeadCut::TopK(1)));
        for (r, (f, g)) in full.chunks(vocab).zip(got.chunks(vocab)).enumerate() {
            check_row(f, g, HeadCut::TopK(1), &format!("{builtin} step {r}"));
        }
        rows += tokens.len();
    }
    let s = model.head_stats();
    assert!(s.rows > 0, "{builtin}: no row took two passes");
    let share = 1.0 - s.fallback_rows as f64 / s.rows as f64;
    assert!(
        share >= certified,
        "{builtin}: {:.3} of the rows certified",
        share
    );
    println!(
        "{builtin}: {rows} rows checked; decoding greedy one token a pass: {:.1}% of the rows \
         certified, {:.2}% of the vocabulary refined ({} tokens a row), {:.1} MB of head read \
         a row (one-pass {:.1} MB)",
        share * 100.0,
        s.refined_share() * 100.0,
        s.refined / s.rows.max(1),
        s.bytes as f64 / (s.rows + s.full_rows).max(1) as f64 / 1e6,
        model.weights().output.bytes_read(Precision::Fast) as f64 / 1e6,
    );
}

#[test]
fn smollm2_two_pass_head_matches_the_one_pass_head() {
    // Its 4-bit copy's bounds reach thousands of tokens: checked for the bits, not the savings.
    check_model("smollm2-135m", "smollm2-135m-instruct-q4_1", 0.0);
}

#[test]
fn gemma3_two_pass_head_matches_the_one_pass_head() {
    check_model("gemma3-270m", "gemma3-270m-q4_k_m", 0.5);
}
