//! `rill bench serve`: a load generator for any OpenAI-compatible server (rill serve,
//! llama-server, vLLM, ...). At each concurrency level, that many clients send streamed chat
//! requests back to back until `--requests` have completed; every prompt is distinct (about
//! `--prompt-tokens` tokens of user text, before the chat template) and asks for exactly
//! `--max-tokens` tokens (`ignore_eos`, `min_tokens` and `max_tokens`). Reported per level:
//! output tokens/s and requests/s over the level's wall time, time to first token (TTFT: request
//! sent to first content received) and inter-token latency (ITL: the gaps between content
//! chunks), p50/p90/p99.
//!
//! With `--turns T` each client holds conversations instead: a first user message of about
//! `--prompt-tokens` tokens (a long history: a document, an earlier chat), then T turns, each
//! sending the whole conversation so far (every earlier answer as the assistant's message) plus a
//! short new user message. Each turn's prefix is the previous turn's conversation, so a server
//! with a prefix cache (or llama-server's per-slot cache) computes only what is new. Every turn is
//! a request in the report.
//!
//! `--dialect messages` or `responses` sends the same load through rill serve's Anthropic
//! Messages or OpenAI Responses endpoints ([`wire`]).

mod wire;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};

pub use wire::Dialect;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// The server's base URL (e.g. http://127.0.0.1:8080; a trailing /v1 is fine).
    #[arg(long)]
    pub url: String,
    /// Concurrency levels: clients sending requests at once (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub concurrency: Vec<usize>,
    /// Requests per level (default: 4 per client, at least 8).
    #[arg(long)]
    pub requests: Option<usize>,
    /// Approximate prompt length in tokens (the user message, calibrated with the server's
    /// /tokenize when it has one).
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Output tokens per request (exactly, when the server honours ignore_eos).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Print one JSON object per level on stdout, and nothing else there.
    #[arg(long)]
    pub json: bool,
    /// Send `Authorization: Bearer KEY`.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// The `model` field of the requests (left out when not given).
    #[arg(long)]
    pub model: Option<String>,
    /// Sampling temperature of the requests (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed of the prompts' words (and of the requests, sent as `seed`).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Unmeasured requests sent before the first level.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Per-request time limit in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Turns per conversation (1: independent requests). With more, `--requests` counts turns
    /// and each conversation starts with the `--prompt-tokens` history.
    #[arg(long, default_value_t = 1)]
    pub turns: usize,
    /// Approximate tokens of each follow-up user message of a conversation.
    #[arg(long, default_value_t = 32)]
    pub turn_tokens: usize,
    /// The API the requests go through (`messages` and `responses`: rill serve's other
    /// dialects, to compare what each costs per token).
    #[arg(long, value_enum, default_value_t = Dialect::Chat)]
    pub dialect: Dialect,
}

/// What a load run sends.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub url: String,
    pub requests: Option<usize>,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub api_key: Option<String>,
    pub model: Option<String>,
    pub temperature: f32,
    pub seed: u64,
    pub warmup: usize,
    pub timeout: Duration,
    pub turns: usize,
    pub turn_tokens: usize,
    pub dialect: Dialect,
}

impl From<&Args> for LoadOptions {
    fn from(a: &Args) -> LoadOptions {
        LoadOptions {
            url: a.url.clone(),
            requests: a.requests,
            prompt_tokens: a.prompt_tokens,
            max_tokens: a.max_tokens,
            api_key: a.api_key.clone(),
            model: a.model.clone(),
            temperature: a.temperature,
            seed: a.seed,
            warmup: a.warmup,
            timeout: Duration::from_secs(a.timeout.max(1)),
            turns: a.turns,
            turn_tokens: a.turn_tokens,
            dialect: a.dialect,
        }
    }
}

/// One concurrency level's results.
#[derive(Clone, Debug, Default)]
pub struct LevelReport {
    pub concurrency: usize,
    /// Turns per conversation (1: independent requests).
    pub turns: usize,
    /// Requests that completed.
    pub requests: usize,
    pub failed: usize,
    /// The first failure's description.
    pub first_error: Option<String>,
    pub output_tokens: usize,
    pub prompt_tokens: usize,
    pub duration_s: f64,
    pub output_tokens_per_s: f64,
    pub requests_per_s: f64,
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    pub ttft_p99_s: f64,
    pub itl_p50_s: f64,
    pub itl_p90_s: f64,
    pub itl_p99_s: f64,
    pub e2e_p50_s: f64,
    pub e2e_p99_s: f64,
}

impl LevelReport {
    pub fn to_json(&self) -> Value {
        json!({
            "concurrency": self.concurrency,
            "turns": self.turns,
            "requests": self.requests,
            "failed": self.failed,
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "duration_s": self.duration_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "requests_per_s": self.requests_per_s,
            "ttft_p50_s": self.ttft_p50_s,
            "ttft_p90_s": self.ttft_p90_s,
            "ttft_p99_s": self.ttft_p99_s,
            "itl_p50_s": self.itl_p50_s,
            "itl_p90_s": self.itl_p90_s,
            "itl_p99_s": self.itl_p99_s,
            "e2e_p50_s": self.e2e_p50_s,
            "e2e_p99_s": self.e2e_p99_s,
        })
    }
}

/// The `q` quantile (0..=1) of sorted samples, linearly interpolated; NaN when empty.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let x = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let (i, f) = (x.floor() as usize, x.fract());
            if i + 1 < n {
                sorted[i] + (sorted[i + 1] - sorted[i]) * f
            } else {
                sorted[n - 1]
            }
        }
    }
}

/// One streamed request's measurements.
struct Sample {
    ttft: Option<f64>,
    gaps: Vec<f64>,
    e2e: f64,
    output_tokens: usize,
    prompt_tokens: usize,
    /// The answer's text (the next turn sends it back as the assistant's message).
    text: String,
}

const WORDS: &[&str] = &[
    "the",
    "river",
    "stone",
    "light",
    "house",
    "green",
    "cold",
    "music",
    "water",
    "quiet",
    "garden",
    "window",
    "morning",
    "road",
    "city",
    "paper",
    "story",
    "friend",
    "little",
    "bright",
    "forest",
    "mountain",
    "evening",
    "bread",
    "table",
    "summer",
    "winter",
    "train",
    "letter",
    "market",
    "school",
    "bridge",
    "island",
    "cloud",
    "silver",
    "golden",
    "ocean",
    "field",
    "horse",
    "village",
    "candle",
    "mirror",
    "autumn",
    "spring",
    "garden",
    "old",
    "new",
    "slow",
    "fast",
    "happy",
    "strange",
    "gentle",
    "yellow",
    "blue",
    "red",
    "small",
    "large",
    "warm",
    "dark",
    "simple",
    "early",
    "late",
    "soft",
    "loud",
    "long",
    "short",
    "clear",
    "open",
    "empty",
    "full",
    "walks",
    "finds",
    "brings",
    "holds",
    "keeps",
    "sees",
    "hears",
    "builds",
    "paints",
    "writes",
    "reads",
    "sings",
    "waits",
    "opens",
    "closes",
    "carries",
    "remembers",
    "follows",
    "crosses",
    "and",
    "with",
    "under",
    "over",
    "near",
    "into",
    "from",
    "after",
    "before",
    "while",
];

/// xorshift64*: the prompts' words.
struct Words(u64);

impl Words {
    fn next(&mut self) -> &'static str {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        WORDS[(r >> 33) as usize % WORDS.len()]
    }
}

/// Prompt `i` of `words` words (distinct from its first words on).
fn prompt_text(seed: u64, i: usize, words: usize) -> String {
    let mut w = Words(
        (seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_add(0x1234_5678) | 1,
    );
    let mut s = format!("Story {i}:");
    for _ in 0..words {
        s.push(' ');
        s.push_str(w.next());
    }
    s.push_str(". Continue the story.");
    s
}

fn base_url(url: &str) -> String {
    let u = url.trim().trim_end_matches('/');
    let u = u.strip_suffix("/v1").unwrap_or(u);
    if u.starts_with("http://") || u.starts_with("https://") {
        u.to_string()
    } else {
        format!("http://{u}")
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
    opts: LoadOptions,
}

impl Client {
    fn post(&self, path: &str, body: &Value) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(k) = &self.opts.api_key {
            r = r.header("authorization", format!("Bearer {k}"));
        }
        r
    }

    /// Tokens of `text` by the server's /tokenize (rill's `prompt` or llama-server's
    /// `content`), if it has one.
    async fn count_tokens(&self, text: &str) -> Option<usize> {
        let body = json!({ "prompt": text, "content": text, "add_special": false });
        let r = self
            .post("/tokenize", &body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .ok()?;
        if !r.status().is_success() {
            return None;
        }
        let v: Value = serde_json::from_slice(&r.bytes().await.ok()?).ok()?;
        let n = v.get("tokens")?.as_array()?.len();
        (n > 0).then_some(n)
    }

    /// Words per prompt for about `target` tokens.
    async fn calibrate(&self, target: usize) -> usize {
        let target = target.max(1);
        let probe_words = (target * 2).clamp(16, 4096);
        let probe = prompt_text(self.opts.seed, usize::MAX, probe_words);
        match self.count_tokens(&probe).await {
            Some(tokens) => {
                let per_word = tokens as f64 / (probe_words as f64 + 6.0);
                ((target as f64 / per_word).round() as usize).saturating_sub(6)
            }
            // About one token per word for these common words.
            None => target.saturating_sub(8),
        }
        .max(1)
    }

    fn request_body(&self, messages: Vec<Value>, i: usize) -> Value {
        let sampling = wire::Sampling {
            max_tokens: self.opts.max_tokens,
            temperature: self.opts.temperature,
            seed: self.opts.seed.wrapping_add(i as u64),
        };
        (self.opts.dialect).body(messages, &sampling, self.opts.model.as_deref())
    }

    /// Sends one streamed chat request of one user message and measures it.
    async fn one(&self, prompt: String, i: usize) -> Result<Sample> {
        self.turn(vec![json!({ "role": "user", "content": prompt })], i)
            .await
    }

    /// A whole conversation: the first message (the history), then `turns` requests, each with
    /// every earlier message and answer and a new short user message after the first.
    async fn conversation(
        &self,
        history: String,
        i: usize,
        turn_words: usize,
    ) -> Vec<Result<Sample>> {
        let mut messages = vec![json!({ "role": "user", "content": history })];
        let mut results = Vec::with_capacity(self.opts.turns);
        for t in 0..self.opts.turns.max(1) {
            if t > 0 {
                let next = prompt_text(self.opts.seed ^ 0x7475_726e, i * 1000 + t, turn_words);
                messages.push(json!({ "role": "user", "content": next }));
            }
            let r = self.turn(messages.clone(), i * 1000 + t).await;
            match &r {
                Ok(sample) => messages.push(json!({ "role": "assistant", "content": sample.text })),
                Err(_) => {
                    results.push(r);
                    break;
                }
            }
            results.push(r);
        }
        results
    }

    /// Sends one streamed chat request of `messages` and measures it.
    async fn turn(&self, messages: Vec<Value>, i: usize) -> Result<Sample> {
        let body = self.request_body(messages, i);
        let started = Instant::now();
        let response = self
            .post(self.opts.dialect.path(), &body)
            .timeout(self.opts.timeout)
            .send()
            .await
            .context("request failed")?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            bail!(
                "HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            );
        }
        let mut stream = response.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        let mut last: Option<Instant> = None;
        let mut first: Option<f64> = None;
        let mut gaps = Vec::new();
        let mut chunks = 0usize;
        let mut usage: Option<(usize, usize)> = None;
        let mut done = false;
        let mut text = String::new();
        while let Some(bytes) = stream.next().await {
            let bytes = bytes.context("reading the stream")?;
            let now = Instant::now();
            buf.extend_from_slice(&bytes);
            while let Some((end, sep)) = find_event_end(&buf) {
                let event: Vec<u8> = buf.drain(..end + sep).collect();
                let event = String::from_utf8_lossy(&event[..end]).into_owned();
                for line in event.lines() {
                    let Some(data) = line.strip_prefix("data:") else {
                        continue;
                    };
                    let reading = self
                        .opts
                        .dialect
                        .read(data.trim())
                        .map_err(anyhow::Error::msg)?;
                    done |= reading.done;
                    if reading.usage.is_some() {
                        usage = reading.usage;
                    }
                    if let Some(s) = reading.text {
                        text.push_str(&s);
                        chunks += 1;
                        match last {
                            None => first = Some((now - started).as_secs_f64()),
                            Some(l) => gaps.push((now - l).as_secs_f64()),
                        }
                        last = Some(now);
                    }
                }
            }
        }
        if !done {
            bail!("the stream ended without its last event");
        }
        let (prompt_tokens, output_tokens) = usage.unwrap_or((0, chunks));
        Ok(Sample {
            ttft: first,
            gaps,
            e2e: started.elapsed().as_secs_f64(),
            output_tokens: if output_tokens == 0 {
                chunks
            } else {
                output_tokens
            },
            prompt_tokens,
            text,
        })
    }
}

/// The end of the first complete server-sent event in `buf` and the separator's length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Runs every level against the server; one report per level.
#[allow(dead_code)] // The library-style entry (the CLI prints as levels complete instead).
pub fn run_load(opts: &LoadOptions, levels: &[usize]) -> Result<Vec<LevelReport>> {
    run_load_with(opts, levels, |_| {})
}

/// [`run_load`], calling `on_level` as each level completes.
pub fn run_load_with(
    opts: &LoadOptions,
    levels: &[usize],
    mut on_level: impl FnMut(&LevelReport),
) -> Result<Vec<LevelReport>> {
    if levels.is_empty() || levels.contains(&0) {
        bail!("--concurrency needs levels of at least 1");
    }
    if opts.requests == Some(0) {
        bail!("--requests must be at least 1");
    }
    if opts.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let http = reqwest::Client::builder()
            // A fresh connection per request: a server may close an idle kept-alive one just as a
            // request goes out on it (llama-server does), which would count as a failure.
            .pool_max_idle_per_host(0)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .context("cannot build the HTTP client")?;
        let client = std::sync::Arc::new(Client {
            http,
            base: base_url(&opts.url),
            opts: opts.clone(),
        });
        let words = client.calibrate(opts.prompt_tokens).await;
        let turns = opts.turns.max(1);
        let turn_words = if turns > 1 {
            client.calibrate(opts.turn_tokens).await
        } else {
            0
        };
        let mut next_prompt = 0usize;
        for _ in 0..opts.warmup {
            let p = prompt_text(opts.seed, usize::MAX - 1 - next_prompt, words);
            next_prompt += 1;
            client
                .one(p, 0)
                .await
                .with_context(|| format!("the warm-up request to {} failed", client.base))?;
        }
        let mut reports = Vec::new();
        for &c in levels {
            // Units of work: requests, or whole conversations of `turns` requests.
            let n = opts.requests.unwrap_or((4 * c).max(8)).div_ceil(turns);
            let first = next_prompt;
            next_prompt += n;
            let counter = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let started = Instant::now();
            let mut workers = Vec::new();
            for _ in 0..c.min(n) {
                let client = client.clone();
                let counter = counter.clone();
                let seed = opts.seed;
                workers.push(tokio::spawn(async move {
                    let mut results = Vec::new();
                    loop {
                        let k = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if k >= n {
                            break;
                        }
                        let prompt = prompt_text(seed, first + k, words);
                        if turns > 1 {
                            results
                                .extend(client.conversation(prompt, first + k, turn_words).await);
                        } else {
                            results.push(client.one(prompt, first + k).await);
                        }
                    }
                    results
                }));
            }
            let mut samples = Vec::new();
            let mut failed = 0;
            let mut first_error = None;
            for w in workers {
                for r in w.await.context("a client task failed")? {
                    match r {
                        Ok(s) => samples.push(s),
                        Err(e) => {
                            failed += 1;
                            first_error.get_or_insert_with(|| format!("{e:#}"));
                        }
                    }
                }
            }
            let report = summarize(
                c,
                turns,
                started.elapsed().as_secs_f64(),
                &samples,
                failed,
                first_error,
            );
            on_level(&report);
            reports.push(report);
        }
        Ok(reports)
    })
}

fn summarize(
    concurrency: usize,
    turns: usize,
    duration_s: f64,
    samples: &[Sample],
    failed: usize,
    first_error: Option<String>,
) -> LevelReport {
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let ttft = sorted(samples.iter().filter_map(|s| s.ttft).collect());
    let itl = sorted(
        samples
            .iter()
            .flat_map(|s| s.gaps.iter().copied())
            .collect(),
    );
    let e2e = sorted(samples.iter().map(|s| s.e2e).collect());
    let output_tokens: usize = samples.iter().map(|s| s.output_tokens).sum();
    let d = duration_s.max(1e-9);
    LevelReport {
        concurrency,
        turns,
        requests: samples.len(),
        failed,
        first_error,
        output_tokens,
        prompt_tokens: samples.iter().map(|s| s.prompt_tokens).sum(),
        duration_s,
        output_tokens_per_s: output_tokens as f64 / d,
        requests_per_s: samples.len() as f64 / d,
        ttft_p50_s: percentile(&ttft, 0.5),
        ttft_p90_s: percentile(&ttft, 0.9),
        ttft_p99_s: percentile(&ttft, 0.99),
        itl_p50_s: percentile(&itl, 0.5),
        itl_p90_s: percentile(&itl, 0.9),
        itl_p99_s: percentile(&itl, 0.99),
        e2e_p50_s: percentile(&e2e, 0.5),
        e2e_p99_s: percentile(&e2e, 0.99),
    }
}

fn ms(s: f64) -> String {
    if s.is_nan() {
        "-".into()
    } else {
        format!("{:.0}", s * 1000.0)
    }
}

pub fn main(args: Args) -> Result<()> {
    let opts = LoadOptions::from(&args);
    if !args.json {
        let per_level = args
            .requests
            .map_or("4 x concurrency (>= 8)".to_string(), |n| n.to_string());
        if args.turns > 1 {
            println!(
                "{per_level} streamed chat requests per level as conversations of {} turns (a ~{}-token first message, ~{}-token follow-ups, every earlier answer sent back), {} output tokens each, against {}",
                args.turns,
                args.prompt_tokens,
                args.turn_tokens,
                args.max_tokens,
                base_url(&args.url)
            );
        } else {
            println!(
                "{per_level} streamed chat requests per level, ~{} prompt tokens, {} output tokens each, against {}",
                args.prompt_tokens,
                args.max_tokens,
                base_url(&args.url)
            );
        }
        println!(
            "{:>5} {:>6} {:>6} {:>10} {:>7} {:>22} {:>22}",
            "conc",
            "ok",
            "failed",
            "out tok/s",
            "req/s",
            "TTFT p50/p90/p99 ms",
            "ITL p50/p90/p99 ms"
        );
    }
    let json = args.json;
    let reports = run_load_with(&opts, &args.concurrency, |r| {
        if json {
            println!("{}", r.to_json());
        } else {
            println!(
                "{:>5} {:>6} {:>6} {:>10.1} {:>7.2} {:>22} {:>22}",
                r.concurrency,
                r.requests,
                r.failed,
                r.output_tokens_per_s,
                r.requests_per_s,
                format!(
                    "{}/{}/{}",
                    ms(r.ttft_p50_s),
                    ms(r.ttft_p90_s),
                    ms(r.ttft_p99_s)
                ),
                format!(
                    "{}/{}/{}",
                    ms(r.itl_p50_s),
                    ms(r.itl_p90_s),
                    ms(r.itl_p99_s)
                ),
            );
        }
        if let Some(e) = &r.first_error {
            eprintln!(
                "warning: {} of {} requests failed at concurrency {}; first: {e}",
                r.failed,
                r.failed + r.requests,
                r.concurrency
            );
        }
    })?;
    if let Some(r) = reports.iter().find(|r| r.requests == 0) {
        bail!(
            "every request failed at concurrency {}: {}",
            r.concurrency,
            r.first_error.as_deref().unwrap_or("unknown error")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
