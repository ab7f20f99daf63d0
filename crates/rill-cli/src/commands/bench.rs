//! `rill bench`: llama-bench-style throughput. ppN is one forward pass over N random prompt tokens
//! (logits for the last row only); tgN is N single-token passes (logits every step). Both start
//! from an empty cache, or with `--depth D` after D random tokens already in it (filled once,
//! untimed, as `llama-bench -d`). Sampling is excluded. One warm-up run, then the median, min and
//! max over the repetitions. `--kv-type` measures each KV cache type in turn.
//!
//! With `--prompt-file`, decoding after a real prompt instead: greedy generation of N tokens
//! (decode tokens/s, the prefill excluded), plain and, with a draft flag, speculative, in the
//! same run, runs alternating; it prints the speedup, the acceptance, and whether both produced
//! the same tokens (an error if not: greedy speculative decoding must not change the output).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rill_engine::{Engine, GenerateParams, Generation, Rng, Speculator};
use rill_model::{Batch, HeadCut, KvCache, KvDtype, Model, Precision, SeqId, Stage, StageTimes};
use rill_tokenizer::ChatMessage;

use super::run::{speculative_summary, SpeculativeArgs};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    /// `rill bench serve`: load-test a running OpenAI-compatible server instead.
    #[command(subcommand)]
    pub target: Option<Target>,
    /// Models to measure (built-in names, paths or hf: specs; comma-separated or repeated).
    #[arg(short, long = "model", value_delimiter = ',', default_value = super::DEFAULT_MODEL)]
    pub models: Vec<String>,
    /// Thread counts to measure (0: one per core).
    #[arg(
        short,
        long,
        value_delimiter = ',',
        default_value = "0",
        allow_negative_numbers = true
    )]
    pub threads: Vec<usize>,
    /// Prompt sizes for ppN tests (0 skips them).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512",
        allow_negative_numbers = true
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths for tgN tests (0 skips them).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128",
        allow_negative_numbers = true
    )]
    pub n_gen: Vec<usize>,
    /// Tokens of context already in the KV cache before each test (not timed), as llama-bench's
    /// -d; several values measure each in turn.
    #[arg(
        short = 'd',
        long,
        value_delimiter = ',',
        default_value = "0",
        allow_negative_numbers = true
    )]
    pub depth: Vec<usize>,
    /// KV cache types to measure (keys and values alike): f16, q8_0, q4_0, f32.
    #[arg(long = "kv-type", value_delimiter = ',', default_value = "f16")]
    pub kv_types: Vec<KvDtype>,
    /// Repetitions of each test (after one warm-up run).
    #[arg(short = 'r', long, default_value_t = 5, allow_negative_numbers = true)]
    pub repetitions: usize,
    /// Print one JSON object per test on stdout, and nothing else there.
    #[arg(long)]
    pub json: bool,
    /// Also report where the time of each test goes: wall time, share and GFLOP/s per stage of
    /// the forward pass (norms, projections, attention, ...), over the measured repetitions.
    #[arg(long)]
    pub profile: bool,
    /// Measure decoding after this prompt (greedy, -n tokens; the chat template is applied
    /// unless --raw): plain, and speculative with a draft flag. -p is not used then.
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// With --prompt-file: use the text as it is, without the chat template.
    #[arg(long, requires = "prompt_file")]
    pub raw: bool,
    /// With --prompt-file: generate past end-of-generation tokens (always -n tokens).
    #[arg(long, requires = "prompt_file")]
    pub ignore_eos: bool,
    /// The output head when decoding: `auto` (two passes where the model's head qualifies:
    /// a 4-bit copy read in full, the file's rows only where a rigorous bound says the greedy
    /// token could lie; the token is the same, the bytes fewer), `two-pass` (wherever the head
    /// is stored in more than 5.5 bits a weight) or `full` (every logit, as llama-bench
    /// computes them).
    #[arg(long, value_enum, default_value = "auto")]
    pub head: HeadMode,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HeadMode {
    Auto,
    TwoPass,
    Full,
}

impl HeadMode {
    fn two_pass(self) -> rill_model::TwoPassMode {
        match self {
            HeadMode::Auto => rill_model::TwoPassMode::Auto,
            HeadMode::TwoPass => rill_model::TwoPassMode::On,
            HeadMode::Full => rill_model::TwoPassMode::Off,
        }
    }
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

/// Tokens per second of one ppN run after the `depth` cached positions.
fn prompt_run(
    model: &mut Model,
    kv: &mut KvCache,
    depth: usize,
    tokens: &[u32],
    logits: &mut Vec<f32>,
) -> Result<f64> {
    let seq = fork_depth(kv, depth)?;
    let batch = Batch::prompt(seq, tokens, depth, false);
    let started = Instant::now();
    model.forward(&batch, kv, Precision::Fast, logits)?;
    Ok(tokens.len() as f64 / started.elapsed().as_secs_f64())
}

/// Tokens per second of one tgN run after the `depth` cached positions.
fn gen_run(
    model: &mut Model,
    kv: &mut KvCache,
    depth: usize,
    tokens: &[u32],
    logits: &mut Vec<f32>,
    head: HeadMode,
) -> Result<f64> {
    let seq = fork_depth(kv, depth)?;
    let mut batch = Batch::new();
    // As a greedy decoder asks (the model computes every logit where it has no two-pass head).
    let cut = match head {
        HeadMode::Full => HeadCut::Full,
        HeadMode::Auto | HeadMode::TwoPass => HeadCut::TopK(1),
    };
    let started = Instant::now();
    for (i, &token) in tokens.iter().enumerate() {
        batch.rows.clear();
        batch.push_cut(seq, token, depth + i, cut);
        model.forward(&batch, kv, Precision::Fast, logits)?;
    }
    Ok(tokens.len() as f64 / started.elapsed().as_secs_f64())
}

/// A fresh copy of sequence 0 (which holds the `depth` positions), sharing its blocks, for one
/// run to write into: the runs never write into sequence 0, whose window layers would let go
/// of the depth's last window as a run went on.
fn fork_depth(kv: &mut KvCache, depth: usize) -> Result<SeqId> {
    const RUN: SeqId = 1;
    if kv.has_sequence(RUN) {
        kv.remove_sequence(RUN)?;
    }
    anyhow::ensure!(kv.seq_len(0)? == depth, "the depth was not filled");
    kv.fork(0, RUN)?;
    Ok(RUN)
}

/// Makes sequence 0 of `kv` hold the first `depth` of `context` (extending what it holds, in
/// prompt passes of at most 512 tokens, as llama-bench fills its depth in batches).
fn fill_depth(
    model: &mut Model,
    kv: &mut KvCache,
    context: &[u32],
    depth: usize,
    logits: &mut Vec<f32>,
) -> Result<()> {
    let have = kv.seq_len(0)?.min(depth);
    // Less when a shorter depth follows a longer one past the window.
    let have = kv.truncate(0, have)?;
    for (i, chunk) in context[have..depth].chunks(512).enumerate() {
        let batch = Batch::prompt(0, chunk, have + i * 512, false);
        model.forward(&batch, kv, Precision::Fast, logits)?;
    }
    Ok(())
}

/// Per stage: milliseconds per pass, share of the pass and achieved GFLOP/s.
fn stage_rows(p: &StageTimes) -> impl Iterator<Item = (Stage, f64, f64, Option<f64>)> + '_ {
    let total = p.total_time().as_secs_f64().max(1e-12);
    let passes = p.passes.max(1) as f64;
    Stage::ALL.into_iter().map(move |stage| {
        let secs = p.time(stage).as_secs_f64();
        let flops = p.flops(stage);
        let gflops = (flops > 0 && secs > 0.0).then(|| flops as f64 / secs / 1e9);
        (stage, secs * 1e3 / passes, secs / total, gflops)
    })
}

fn print_profile(p: &StageTimes) {
    println!(
        "  where the time goes ({} passes, {} rows; shares of the measured wall time):",
        p.passes, p.rows
    );
    println!(
        "  {:<12} {:>10} {:>7} {:>9}",
        "stage", "ms/pass", "share", "GFLOP/s"
    );
    for (stage, ms, share, gflops) in stage_rows(p) {
        let gflops = gflops.map_or_else(|| "-".to_string(), |g| format!("{g:.1}"));
        println!(
            "  {:<12} {:>10.3} {:>6.1}% {:>9}",
            stage.name(),
            ms,
            share * 100.0,
            gflops
        );
    }
    let passes = p.passes.max(1) as f64;
    println!(
        "  weights read: {:.1} MB per pass, {:.2} MB per row (of a mixture of experts, only \
         the experts some row chose)",
        p.weight_bytes as f64 / passes / 1e6,
        p.weight_bytes as f64 / p.rows.max(1) as f64 / 1e6,
    );
    let h = &p.head;
    if h.rows > 0 {
        println!(
            "  output head: {} of {} rows of logits in two passes, {:.2}% of the vocabulary \
             refined ({:.0} tokens a row), {:.1} MB of head read per row of logits",
            h.rows,
            h.rows + h.full_rows,
            h.refined_share() * 100.0,
            h.refined as f64 / h.rows as f64,
            h.bytes as f64 / (h.rows + h.full_rows) as f64 / 1e6,
        );
    }
}

fn profile_json(p: &StageTimes) -> serde_json::Value {
    let stages: serde_json::Map<String, serde_json::Value> = stage_rows(p)
        .map(|(stage, ms, share, gflops)| {
            (
                stage.name().to_string(),
                serde_json::json!({"ms_per_pass": ms, "share": share, "gflop_per_s": gflops}),
            )
        })
        .collect();
    serde_json::json!({
        "passes": p.passes,
        "rows": p.rows,
        "weight_bytes": p.weight_bytes,
        "head": {
            "two_pass_rows": p.head.rows,
            "full_rows": p.head.full_rows,
            "refined_share": p.head.refined_share(),
            "bytes": p.head.bytes,
        },
        "stages": stages,
    })
}

/// A test's name in the table: `pp512`, with `@ d4096` after a depth (as llama-bench) and the
/// KV type when several are measured.
fn test_label(test: &str, depth: usize, kv_type: KvDtype, all: &[KvDtype]) -> String {
    let mut label = test.to_string();
    if depth > 0 {
        label += &format!(" @ d{depth}");
    }
    if all.len() > 1 {
        label += &format!(" {kv_type}");
    }
    label
}

/// Peak resident memory of this process, in bytes (Linux; None elsewhere).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// What `rill bench` measures besides the model itself.
#[derive(clap::Subcommand)]
pub enum Target {
    /// Streamed chat requests against an OpenAI-compatible server (rill serve, llama-server, ...):
    /// output tokens/s, requests/s, TTFT and inter-token latency per concurrency level.
    Serve(super::bench_serve::Args),
}

pub fn main(mut args: Args) -> Result<()> {
    if let Some(Target::Serve(load)) = args.target.take() {
        return super::bench_serve::main(load);
    }
    if args.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    if let Some(file) = &args.prompt_file {
        return prompt_bench(&args, file);
    }
    if args.speculative.enabled() {
        bail!("speculative decoding is measured after a real prompt: add --prompt-file FILE");
    }
    if !args.json {
        println!("kernels: {}", super::kernel_paths());
        println!(
            "{:<36} {:>7} {:>18} {:>12} {:>12} {:>12}",
            "model", "threads", "test", "tok/s", "min", "max"
        );
    }
    for spec in &args.models {
        let (path, name) = resolve_model(spec)?;
        let file_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        for &threads in &args.threads {
            let mut model = Model::load(&path, threads)
                .with_context(|| format!("cannot load {}", path.display()))?;
            model.set_two_pass_head(args.head.two_pass())?;
            let threads = model.threads();
            let packed_bytes = model.weights().packed_bytes();
            let vocab = model.config().vocab_size as u64;
            let longest = args
                .n_prompt
                .iter()
                .chain(&args.n_gen)
                .copied()
                .max()
                .unwrap_or(0);
            let deepest = args.depth.iter().copied().max().unwrap_or(0);
            let mut rng = Rng::new(1234);
            let mut random_tokens = |n: usize| -> Vec<u32> {
                (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect()
            };
            let context = random_tokens(deepest);
            let mut logits = Vec::new();
            for &kv_type in &args.kv_types {
                model.set_kv_types(Some(kv_type.into()))?;
                // A block more for the runs' copy of the depth's partly filled last block.
                let capacity = deepest + longest + KvCache::DEFAULT_BLOCK_SIZE;
                let mut kv = model.new_kv_cache(capacity, Precision::Fast)?;
                kv.add_sequence(0)?;
                for &depth in &args.depth {
                    fill_depth(&mut model, &mut kv, &context, depth, &mut logits)?;
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
                                prompt_run(model, kv, depth, &tokens, logits)
                            } else {
                                gen_run(model, kv, depth, &tokens, logits, args.head)
                            }
                        };
                        run(&mut model, &mut kv, &mut logits)?; // warm-up
                        model.set_profiling(args.profile);
                        let samples = (0..args.repetitions)
                            .map(|_| run(&mut model, &mut kv, &mut logits))
                            .collect::<Result<Vec<f64>>>()?;
                        let profile = model.stage_times().cloned();
                        model.set_profiling(false);
                        kv.remove_sequence(1)?;
                        let m = summarize(samples);
                        let label = test_label(&test, depth, kv_type, &args.kv_types);
                        if args.json {
                            let mut v = serde_json::json!({
                                "engine": "rill",
                                "model": name,
                                "test": test,
                                "depth": depth,
                                "kv_type": kv_type.name(),
                                "threads": threads,
                                "tokens_per_s": m.median,
                                "min": m.min,
                                "max": m.max,
                                "repetitions": args.repetitions,
                                "file_bytes": file_bytes,
                                "kv_bytes_per_token": kv.bytes_per_token(),
                                "peak_rss_bytes": peak_rss_bytes(),
                            });
                            if let Some(p) = &profile {
                                v["profile"] = profile_json(p);
                            }
                            println!("{v}");
                        } else {
                            println!(
                                "{name:<36} {threads:>7} {label:>18} {:>12.1} {:>12.1} {:>12.1}",
                                m.median, m.min, m.max
                            );
                            if let Some(p) = &profile {
                                print_profile(p);
                            }
                        }
                    }
                }
            }
            if !args.json {
                if let Some(rss) = peak_rss_bytes() {
                    println!(
                        "  peak RSS {:.1} MB for a {:.1} MB file ({:.1} MB of weights repacked \
                         for the fast kernels, in memory; the rest mmapped, not copied)",
                        rss as f64 / 1e6,
                        file_bytes as f64 / 1e6,
                        packed_bytes as f64 / 1e6
                    );
                }
            }
        }
    }
    Ok(())
}

/// What the output head read per row of logits, and what a decoded token read in all, against
/// the file.
fn print_head_reads(model: &Model) {
    let h = model.head_stats();
    let rows = h.rows + h.full_rows;
    if rows == 0 {
        return;
    }
    let full = model.weights().output.bytes_read(Precision::Fast) as f64;
    let head = h.bytes as f64 / rows as f64;
    let token = model.cost().weight_bytes_per_token as f64 - full + head;
    println!(
        "  output head: {} of {rows} rows of logits in two passes ({} of them read it all), \
         {:.2}% of the vocabulary refined; {:.1} MB of head a row (one pass: {:.1} MB); \
         {:.1} MB of weights a token",
        h.rows,
        h.fallback_rows,
        h.refined_share() * 100.0,
        head / 1e6,
        full / 1e6,
        token / 1e6,
    );
}

/// One decode measurement: the tokens and tokens per second of each run.
struct DecodeRuns {
    tok_s: Vec<f64>,
    last: Option<Generation>,
}

impl DecodeRuns {
    fn new() -> DecodeRuns {
        DecodeRuns {
            tok_s: Vec::new(),
            last: None,
        }
    }

    /// Runs one greedy generation (on `session`, whose cache keeps the prompt between runs);
    /// `record`: count it (else it is the warm-up).
    fn run(
        &mut self,
        engine: &mut Engine,
        session: &mut rill_engine::Session,
        speculator: Option<&mut Speculator>,
        prompt: &[u32],
        params: &GenerateParams,
        record: bool,
    ) -> Result<()> {
        let g = match speculator {
            Some(sp) => session.generate_speculative(engine, sp, prompt, params, |_| true)?,
            None => session.generate(engine, prompt, params, |_| true)?,
        };
        if record {
            self.tok_s.push(g.decode_tokens_per_second());
        }
        self.last = Some(g);
        Ok(())
    }
}

/// The file of a `--model` argument (fetched with a progress bar on first use) and the name
/// the tables show for it.
fn resolve_model(spec: &str) -> Result<(std::path::PathBuf, String)> {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let path = rill_fetch::resolve(spec, &opts)?;
    let name = path
        .file_name()
        .map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned());
    Ok((path, name))
}

/// `--prompt-file`: decode speed after a real prompt, plain and speculative.
fn prompt_bench(args: &Args, file: &std::path::Path) -> Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    if args.speculative.enabled() {
        args.speculative.params()?;
    }
    if !args.json {
        println!(
            "{:<36} {:>7} {:>22} {:>10} {:>10} {:>10}",
            "model", "threads", "test", "tok/s", "min", "max"
        );
    }
    for spec in &args.models {
        let (path, name) = resolve_model(spec)?;
        for &threads in &args.threads {
            let mut engine = Engine::load(&path, threads, Precision::Fast)
                .with_context(|| format!("cannot load {}", path.display()))?;
            engine.model.set_two_pass_head(args.head.two_pass())?;
            let threads = engine.model.threads();
            let prompt = if args.raw {
                engine.tokenizer.encode_with_special(&text, true, false)
            } else {
                engine.chat_prompt(&[ChatMessage::new("user", text.trim_end())])?
            };
            let mut speculator = args.speculative.speculator(&engine, threads)?;
            for &n in args.n_gen.iter().filter(|&&n| n > 0) {
                let params = GenerateParams {
                    max_tokens: n,
                    ignore_eos: args.ignore_eos,
                    ..GenerateParams::default()
                };
                let context = prompt.len() + n;
                let mut plain_session = engine.new_session(context)?;
                let mut spec_session = engine.new_session(context)?;
                let mut plain = DecodeRuns::new();
                let mut spec = DecodeRuns::new();
                engine.model.reset_head_stats();
                // A warm-up of each, then the repetitions, alternating (noise hits both alike).
                for r in 0..=args.repetitions {
                    let record = r > 0;
                    plain.run(
                        &mut engine,
                        &mut plain_session,
                        None,
                        &prompt,
                        &params,
                        record,
                    )?;
                    if let Some(sp) = speculator.as_mut() {
                        spec.run(
                            &mut engine,
                            &mut spec_session,
                            Some(sp),
                            &prompt,
                            &params,
                            record,
                        )?;
                    }
                }
                let test = format!("decode{n}");
                let p = summarize(plain.tok_s.clone());
                let plain_gen = plain.last.as_ref().expect("at least one run");
                report(args, &name, threads, &test, &p, plain_gen, None);
                if !args.json && speculator.is_none() {
                    print_head_reads(&engine.model);
                }
                let (Some(sp), Some(spec_gen)) = (speculator.as_ref(), spec.last.as_ref()) else {
                    continue;
                };
                let kind = match sp.kind() {
                    rill_engine::DraftKind::Model => "draft-model".to_string(),
                    rill_engine::DraftKind::Layers(k) => format!("layers{k}"),
                    rill_engine::DraftKind::Ngram => "ngram".to_string(),
                    rill_engine::DraftKind::Mtp => "mtp".to_string(),
                };
                let test = format!("decode{n}+{kind}(k={})", sp.params().draft_tokens);
                let m = summarize(spec.tok_s.clone());
                let identical = plain_gen.tokens == spec_gen.tokens;
                let speedup = m.median / p.median;
                report(
                    args,
                    &name,
                    threads,
                    &test,
                    &m,
                    spec_gen,
                    Some((speedup, identical)),
                );
                let st = spec_gen
                    .speculative
                    .as_ref()
                    .expect("a speculative generation has statistics");
                if !args.json {
                    println!(
                        "  speedup {speedup:.2}x (median decode tok/s of {} runs each, plain and \
                         speculative alternating); greedy outputs identical: {} ({} tokens, \
                         finish: {})",
                        args.repetitions,
                        if identical { "yes" } else { "NO" },
                        spec_gen.tokens.len(),
                        spec_gen.finish_reason
                    );
                    println!("  {}", speculative_summary(st));
                }
                if !identical {
                    let at = plain_gen
                        .tokens
                        .iter()
                        .zip(&spec_gen.tokens)
                        .position(|(a, b)| a != b)
                        .unwrap_or(plain_gen.tokens.len().min(spec_gen.tokens.len()));
                    bail!(
                        "greedy speculative decoding changed the output: first difference at \
                         token {at} ({} plain tokens, {} speculative)",
                        plain_gen.tokens.len(),
                        spec_gen.tokens.len()
                    );
                }
            }
        }
    }
    Ok(())
}

/// One result line (or JSON object).
fn report(
    args: &Args,
    name: &str,
    threads: usize,
    test: &str,
    m: &Measurement,
    g: &Generation,
    speculative: Option<(f64, bool)>,
) {
    if args.json {
        let mut v = serde_json::json!({
            "engine": "rill",
            "model": name,
            "test": test,
            "threads": threads,
            "tokens_per_s": m.median,
            "min": m.min,
            "max": m.max,
            "repetitions": args.repetitions,
            "generated_tokens": g.tokens.len(),
            "finish_reason": g.finish_reason.as_str(),
        });
        if let (Some((speedup, identical)), Some(st)) = (speculative, &g.speculative) {
            v["speedup"] = serde_json::json!(speedup);
            v["identical_output"] = serde_json::json!(identical);
            v["draft_tokens"] = serde_json::json!(st.draft_tokens);
            v["drafted"] = serde_json::json!(st.drafted);
            v["accepted"] = serde_json::json!(st.accepted);
            v["acceptance_rate"] = serde_json::json!(st.acceptance_rate());
            v["acceptance_by_position"] = serde_json::json!(st.acceptance_by_position());
            v["tokens_per_pass"] = serde_json::json!(st.tokens_per_round());
        }
        println!("{v}");
    } else {
        println!(
            "{name:<36} {threads:>7} {test:>22} {:>10.1} {:>10.1} {:>10.1}",
            m.median, m.min, m.max
        );
    }
}
