//! `rill bench`: llama-bench-style throughput. ppN is one forward pass over N random prompt tokens
//! from an empty cache (logits for the last row only); tgN is N single-token passes from an empty
//! cache (logits every step). Sampling is excluded. One warm-up run, then the median, min and max
//! over the repetitions.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use rill_engine::Rng;
use rill_model::{Batch, KvCache, Model, Precision};

#[derive(clap::Args)]
pub struct Args {
    /// Models to measure (built-in names, paths or hf: specs; comma-separated or repeated).
    #[arg(short, long = "model", value_delimiter = ',', default_value = super::DEFAULT_MODEL)]
    pub models: Vec<String>,
    /// Thread counts to measure (0: one per core).
    #[arg(short, long, value_delimiter = ',', default_value = "0")]
    pub threads: Vec<usize>,
    /// Prompt sizes for ppN tests (0 skips them).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths for tgN tests (0 skips them).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// Repetitions of each test (after one warm-up run).
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    /// Print one JSON object per test on stdout, and nothing else there.
    #[arg(long)]
    pub json: bool,
}

struct Measurement {
    median: f64,
    min: f64,
    max: f64,
}

fn summarize(mut samples: Vec<f64>) -> Measurement {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    Measurement {
        median,
        min: samples[0],
        max: samples[n - 1],
    }
}

/// Tokens per second of one ppN run.
fn prompt_run(
    model: &mut Model,
    kv: &mut KvCache,
    tokens: &[u32],
    logits: &mut Vec<f32>,
) -> Result<f64> {
    kv.truncate(0, 0)?;
    let batch = Batch::prompt(0, tokens, 0, false);
    let started = Instant::now();
    model.forward(&batch, kv, Precision::Fast, logits)?;
    Ok(tokens.len() as f64 / started.elapsed().as_secs_f64())
}

/// Tokens per second of one tgN run.
fn gen_run(
    model: &mut Model,
    kv: &mut KvCache,
    tokens: &[u32],
    logits: &mut Vec<f32>,
) -> Result<f64> {
    kv.truncate(0, 0)?;
    let mut batch = Batch::new();
    let started = Instant::now();
    for (pos, &token) in tokens.iter().enumerate() {
        batch.rows.clear();
        batch.push(0, token, pos, true);
        model.forward(&batch, kv, Precision::Fast, logits)?;
    }
    Ok(tokens.len() as f64 / started.elapsed().as_secs_f64())
}

/// Peak resident memory of this process, in bytes (Linux; None elsewhere).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub fn main(args: Args) -> Result<()> {
    if args.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    if !args.json {
        println!(
            "{:<36} {:>7} {:>8} {:>12} {:>12} {:>12}",
            "model", "threads", "test", "tok/s", "min", "max"
        );
    }
    for spec in &args.models {
        let path = rill_fetch::resolve(spec, &opts)?;
        let file_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| spec.clone());
        for &threads in &args.threads {
            let mut model = Model::load(&path, threads)
                .with_context(|| format!("cannot load {}", path.display()))?;
            let threads = model.threads();
            let vocab = model.config().vocab_size as u64;
            let longest = args
                .n_prompt
                .iter()
                .chain(&args.n_gen)
                .copied()
                .max()
                .unwrap_or(0);
            let mut kv = model.new_kv_cache(longest.max(1), Precision::Fast)?;
            kv.add_sequence(0)?;
            let mut rng = Rng::new(1234);
            let mut random_tokens = |n: usize| -> Vec<u32> {
                (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect()
            };
            let mut logits = Vec::new();
            let tests = args
                .n_prompt
                .iter()
                .filter(|&&n| n > 0)
                .map(|&n| (format!("pp{n}"), n, true))
                .chain(
                    args.n_gen
                        .iter()
                        .filter(|&&n| n > 0)
                        .map(|&n| (format!("tg{n}"), n, false)),
                );
            for (test, n, is_prompt) in tests {
                let tokens = random_tokens(n);
                let run = |model: &mut Model, kv: &mut KvCache, logits: &mut Vec<f32>| {
                    if is_prompt {
                        prompt_run(model, kv, &tokens, logits)
                    } else {
                        gen_run(model, kv, &tokens, logits)
                    }
                };
                run(&mut model, &mut kv, &mut logits)?; // warm-up
                let samples = (0..args.repetitions)
                    .map(|_| run(&mut model, &mut kv, &mut logits))
                    .collect::<Result<Vec<f64>>>()?;
                let m = summarize(samples);
                if args.json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "engine": "rill",
                            "model": name,
                            "test": test,
                            "threads": threads,
                            "tokens_per_s": m.median,
                            "min": m.min,
                            "max": m.max,
                            "repetitions": args.repetitions,
                            "file_bytes": file_bytes,
                            "peak_rss_bytes": peak_rss_bytes(),
                        })
                    );
                } else {
                    println!(
                        "{name:<36} {threads:>7} {test:>8} {:>12.1} {:>12.1} {:>12.1}",
                        m.median, m.min, m.max
                    );
                }
            }
            if !args.json {
                if let Some(rss) = peak_rss_bytes() {
                    println!(
                        "  peak RSS {:.1} MB for a {:.1} MB file (weights are mmapped, not copied)",
                        rss as f64 / 1e6,
                        file_bytes as f64 / 1e6
                    );
                }
            }
        }
    }
    Ok(())
}
