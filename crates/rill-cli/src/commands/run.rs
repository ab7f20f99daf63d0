//! `rill run PROMPT`: one answer, streamed.

use std::io::Write;

use anyhow::Result;
use rill_engine::{GenerateParams, Precision, SamplingParams};
use rill_tokenizer::ChatMessage;

use super::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 picks the most likely token every time (greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Seed of the sampler's random generator (same seed and parameters, same text).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Use the prompt as it is, without the model's chat template.
    #[arg(long)]
    pub raw: bool,
    /// A system message for the chat template.
    #[arg(long, conflicts_with = "raw")]
    pub system: Option<String>,
    /// Context size in tokens (default: the prompt plus --max-tokens).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Compute with f32 activations and an f32 KV cache (the reference path; slower).
    #[arg(long)]
    pub exact: bool,
    /// Print timing statistics to stderr at the end.
    #[arg(long)]
    pub stats: bool,
    /// The prompt.
    #[arg(allow_hyphen_values = true)]
    pub prompt: String,
}

pub fn main(args: Args) -> Result<()> {
    let precision = if args.exact {
        Precision::Exact
    } else {
        Precision::Fast
    };
    let mut engine = args.model.load(precision)?;
    let prompt_tokens = if args.raw {
        engine
            .tokenizer
            .encode_with_special(&args.prompt, true, false)
    } else {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        engine.chat_prompt(&messages)?
    };
    let context = args
        .ctx_size
        .unwrap_or(prompt_tokens.len().saturating_add(args.max_tokens));
    let mut session = engine.new_session(context)?;
    let seed = args.seed.unwrap_or_else(random_seed);
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            seed,
        },
        ignore_eos: false,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let generation = session.generate(&mut engine, &prompt_tokens, &params, |event| {
        // A closed stdout (e.g. piped into `head`) cancels generation instead of failing.
        out.write_all(event.text.as_bytes()).is_ok() && out.flush().is_ok()
    })?;
    let _ = writeln!(out);
    if args.stats {
        let n = generation.tokens.len();
        eprintln!(
            "[{} prompt tokens in {:.2} s ({:.1} tok/s), {} generated in {:.2} s ({:.1} tok/s), finish: {}, seed {}]",
            generation.prompt_tokens_computed,
            generation.prefill_seconds,
            generation.prompt_tokens_computed as f64 / generation.prefill_seconds.max(1e-9),
            n,
            generation.decode_seconds,
            n as f64 / generation.decode_seconds.max(1e-9),
            generation.finish_reason.as_str(),
            seed
        );
    }
    Ok(())
}

/// A seed from the clock, for runs that did not ask for one.
pub fn random_seed() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}
