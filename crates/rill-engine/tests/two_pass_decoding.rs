//! Decoding with the two-pass output head says exactly what decoding with the one-pass head
//! says, on both real models: greedy, the default sampler (top-k first), min-p alone and a
//! penalised sampler (which takes the full head), over the reference prompts and windows of a
//! long text, same seeds, token for token; greedy prompt-lookup speculation too. And the
//! two-pass head did run.

mod common;

use common::{alone, engine};
use rill_engine::{
    DraftSource, Engine, GenerateParams, NgramParams, Precision, SamplingParams, SpeculativeParams,
    Speculator,
};
use rill_model::TwoPassMode;
use serde_json::Value;

/// The reference prompts' tokens (those that fit), then `windows` windows of 48 tokens of the long text.
fn prompts(folder: &str, windows: usize) -> Vec<Vec<u32>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/reference")
        .join(folder);
    let read = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
    };
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut out: Vec<Vec<u32>> = read("reference.json")["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| ids(&c["token_ids"]))
        // The sessions hold 256 positions.
        .filter(|p| p.len() <= 192)
        .collect();
    let text = ids(&read("long_context.json")["cases"][1]["token_ids"]);
    for w in 0..windows {
        let start = 300 + w * 397;
        out.push(text[start..start + 48].to_vec());
    }
    out
}

fn params(max_tokens: usize, seed: u64, sampling: SamplingParams) -> GenerateParams {
    GenerateParams {
        max_tokens,
        ignore_eos: true,
        sampling: SamplingParams { seed, ..sampling },
        ..GenerateParams::default()
    }
}

fn samplers() -> Vec<(&'static str, SamplingParams, usize)> {
    vec![
        ("greedy", SamplingParams::default(), 40),
        (
            "defaults (T 0.8, top-k 40, top-p 0.95, min-p 0.05)",
            SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                min_p: 0.05,
                ..SamplingParams::default()
            },
            24,
        ),
        (
            "min-p 0.1 alone at T 1.2",
            SamplingParams {
                temperature: 1.2,
                min_p: 0.1,
                ..SamplingParams::default()
            },
            24,
        ),
        (
            "penalised (full head)",
            SamplingParams {
                temperature: 0.9,
                top_k: 40,
                repeat_penalty: 1.1,
                ..SamplingParams::default()
            },
            16,
        ),
    ]
}

fn check(builtin: &str, folder: &str, mode: TwoPassMode, windows: usize) {
    let mut two: Engine = engine(builtin, Precision::Fast);
    two.model.set_two_pass_head(mode).unwrap();
    assert!(two.model.has_two_pass_head(), "{builtin}: no two-pass head");
    let mut one: Engine = engine(builtin, Precision::Fast);
    one.model.set_two_pass_head(TwoPassMode::Off).unwrap();
    let prompts = prompts(folder, windows);
    let mut tokens = 0;
    for (name, sampling, n) in samplers() {
        // Greedy over every prompt; the samplers over the first eight.
        let count = if name == "greedy" { prompts.len() } else { 8 };
        for (p, prompt) in prompts.iter().take(count).enumerate() {
            let params = params(n, 7 + p as u64, sampling.clone());
            let want = alone(&mut one, prompt, &params);
            let got = alone(&mut two, prompt, &params);
            assert_eq!(got, want, "{builtin}, {name}, prompt {p}");
            tokens += want.len();
        }
    }
    let stats = two.model.head_stats();
    assert_eq!(one.model.head_stats().rows, 0);
    assert!(
        stats.rows > tokens as u64 / 4,
        "{builtin}: only {} of {tokens} rows took two passes",
        stats.rows
    );
    println!(
        "{builtin}: {tokens} tokens identical; {} rows in two passes ({} one-pass), {:.3}% of the \
         vocabulary refined",
        stats.rows,
        stats.full_rows,
        stats.refined_share() * 100.0
    );
    // Greedy speculation (prompt lookup) verifies with the same cut, a few rows a pass.
    two.model.reset_head_stats();
    for (p, prompt) in prompts.iter().take(8).enumerate() {
        let params = params(32, p as u64, SamplingParams::default());
        let want = alone(&mut one, prompt, &params);
        let mut sp = Speculator::new(
            &two,
            DraftSource::Ngram(NgramParams::default()),
            SpeculativeParams::default(),
        )
        .unwrap();
        let mut session = two.new_session(256).unwrap();
        let got = session
            .generate_speculative(&mut two, &mut sp, prompt, &params, |_| true)
            .unwrap()
            .tokens;
        assert_eq!(got, want, "{builtin}, greedy speculation, prompt {p}");
    }
    assert!(
        two.model.head_stats().rows > 0,
        "{builtin}: speculation took no two passes"
    );
}

#[test]
fn gemma3_decodes_the_same_with_the_two_pass_head() {
    check("gemma3-270m", "gemma3-270m-q4_k_m", TwoPassMode::Auto, 16);
}

#[test]
fn smollm2_decodes_the_same_with_the_two_pass_head() {
    check(
        "smollm2-135m",
        "smollm2-135m-instruct-q4_1",
        TwoPassMode::On,
        16,
    );
}

/// The serving loop gives each decoding row its sequence's cut, several sequences a pass (rows
/// of greedy and top-k requests side by side): every request's tokens are what it gives alone
/// with the one-pass head.
#[test]
fn gemma3_serves_the_same_with_the_two_pass_head() {
    let mut one: Engine = engine("gemma3-270m", Precision::Fast);
    one.model.set_two_pass_head(TwoPassMode::Off).unwrap();
    let prompts = prompts("gemma3-270m-q4_k_m", 4);
    let samplers = samplers();
    let requests: Vec<(Vec<u32>, GenerateParams)> = prompts
        .iter()
        .enumerate()
        .map(|(p, prompt)| {
            let (_, sampling, _) = &samplers[p % 3];
            (prompt.clone(), params(24, 11 + p as u64, sampling.clone()))
        })
        .collect();
    let want: Vec<Vec<u32>> = requests
        .iter()
        .map(|(prompt, params)| alone(&mut one, prompt, params))
        .collect();
    drop(one);
    let two: Engine = engine("gemma3-270m", Precision::Fast);
    assert!(two.model.has_two_pass_head());
    let h = rill_engine::spawn(
        two,
        rill_engine::ServeConfig {
            max_running: 8,
            ..rill_engine::ServeConfig::default()
        },
    )
    .unwrap();
    let streams: Vec<_> = requests
        .iter()
        .map(|(prompt, params)| {
            h.submit(rill_engine::ServeRequest::new(
                prompt.clone(),
                params.clone(),
            ))
            .unwrap()
        })
        .collect();
    for (r, stream) in streams.into_iter().enumerate() {
        let (tokens, _) = common::collect(stream, 1);
        assert_eq!(tokens[0], want[r], "request {r}");
    }
    let two_pass = common::metric(&h, "rill_head_two_pass_rows_total");
    let one_pass = common::metric(&h, "rill_head_one_pass_rows_total");
    assert!(two_pass > 0.0, "no row took two passes");
    println!(
        "gemma3-270m served: {} requests identical; {two_pass} rows in two passes, {one_pass} in one",
        want.len()
    );
}
