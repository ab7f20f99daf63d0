//! `rill run PROMPT`: one answer, streamed to stdout (the generated text alone); log-probabilities,
//! the finish reason and timings go to stderr.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Result};
use rill_engine::{
    check_top_logprobs, FinishCause, GenerateParams, Generation, Precision, SamplingParams, Stage,
    TokenEvent, TokenLogprobs,
};
use rill_tokenizer::{ChatMessage, Tokenizer};

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
    /// Keep only the K most likely tokens (0: off).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// Keep the most likely tokens up to this probability mass, in (0, 1] (1: off).
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    pub top_p: f32,
    /// Keep tokens at least P times as likely as the most likely one, in [0, 1] (0: off).
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    pub min_p: f32,
    /// Locally typical sampling mass, in (0, 1] (1: off).
    #[arg(long, default_value_t = 1.0, value_name = "P")]
    pub typical_p: f32,
    /// Repetition penalty over the last --repeat-last-n tokens (llama.cpp: positive logits
    /// divided, negative multiplied; 1: off).
    #[arg(long, default_value_t = 1.0, value_name = "R")]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (prompt included); 0: off, -1: all of them.
    #[arg(
        long,
        default_value_t = 64,
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i64,
    /// OpenAI presence penalty, in [-2, 2].
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "X",
        allow_negative_numbers = true
    )]
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, in [-2, 2].
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "X",
        allow_negative_numbers = true
    )]
    pub frequency_penalty: f32,
    /// Add BIAS to the logit of token ID (repeatable; -inf forbids the token).
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Order of the sampler stages, comma-separated (default:
    /// penalties,logit-bias,top-k,typical,top-p,min-p,temperature).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub sampler_order: Option<Vec<String>>,
    /// Seed of the sampler's random generator (same seed and parameters, same text).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop at this text (repeatable); it is not printed, nor anything after it. `\n`, `\t`,
    /// `\r` and `\\` stand for a newline, a tab, a carriage return and a backslash.
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
    /// Stop at this token id (repeatable).
    #[arg(long, value_name = "ID")]
    pub stop_token_id: Vec<u32>,
    /// End-of-generation and stop tokens are not sampled, nor stop strings matched, before this
    /// many tokens.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub min_tokens: usize,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print each token's N most likely alternatives (raw and after the sampler chain) to stderr
    /// (N <= 20).
    #[arg(long, value_name = "N")]
    pub top_logprobs: Option<usize>,
    /// Colour each token by the probability it was drawn with (only when stdout is a terminal).
    #[arg(long)]
    pub show_probs: bool,
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
    /// Also print cache reuse, the seed and the sampler settings to stderr at the end.
    #[arg(long)]
    pub stats: bool,
    /// The prompt.
    #[arg(allow_hyphen_values = true)]
    pub prompt: String,
}

/// `ID=BIAS`.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("expected ID=BIAS, got {s:?}"))?;
    let id = id
        .trim()
        .parse()
        .map_err(|_| format!("token id {id:?} is not a non-negative integer"))?;
    let bias = bias
        .trim()
        .parse()
        .map_err(|_| format!("bias {bias:?} is not a number"))?;
    Ok((id, bias))
}

impl Args {
    /// The generation parameters, checked (token ids excepted: they need the vocabulary).
    fn generate_params(&self, seed: u64) -> Result<GenerateParams> {
        let order = match &self.sampler_order {
            Some(names) => names
                .iter()
                .map(|n| n.parse::<Stage>())
                .collect::<Result<Vec<_>, _>>()?,
            None => Stage::DEFAULT_ORDER.to_vec(),
        };
        let repeat_last_n = match self.repeat_last_n {
            -1 => usize::MAX,
            n if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
            n => bail!("--repeat-last-n must be >= 0, or -1 for the whole history, got {n}"),
        };
        let sampling = SamplingParams {
            temperature: self.temperature,
            seed,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.clone(),
            banned_tokens: Vec::new(),
            order,
        };
        sampling.validate()?;
        if let Some(n) = self.top_logprobs {
            check_top_logprobs(n)?;
        }
        let stop: Vec<String> = self.stop.iter().map(|s| unescape(s)).collect();
        if stop.iter().any(String::is_empty) {
            bail!("--stop needs a non-empty string");
        }
        Ok(GenerateParams {
            max_tokens: self.max_tokens,
            sampling,
            ignore_eos: self.ignore_eos,
            min_tokens: self.min_tokens,
            stop,
            stop_token_ids: self.stop_token_id.clone(),
            top_logprobs: self.top_logprobs,
            prompt_logprobs: false,
        })
    }
}

pub fn main(args: Args) -> Result<()> {
    let seed = args.seed.unwrap_or_else(random_seed);
    // Bad options fail before the model is loaded.
    let params = args.generate_params(seed)?;
    let precision = if args.exact {
        Precision::Exact
    } else {
        Precision::Fast
    };
    let mut engine = args.model.load(precision)?;
    params.validate(engine.model.config().vocab_size)?;
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
    let colour = args.show_probs && std::io::stdout().is_terminal();
    // The callback cannot borrow the tokenizer while generation holds the engine: the token
    // texts it prints come from a table, built only when asked for.
    let texts: Vec<String> = if params.top_logprobs.is_some() {
        (0..engine.model.config().vocab_size as u32)
            .map(|id| token_text(&engine.tokenizer, id))
            .collect()
    } else {
        Vec::new()
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let generation = session.generate(&mut engine, &prompt_tokens, &params, |event| {
        if let Some(lp) = event.logprobs {
            print_logprobs(&texts, event, lp);
        }
        // A closed stdout (e.g. piped into `head`) cancels generation instead of failing.
        let written = if colour && !event.text.is_empty() {
            write!(
                out,
                "\x1b[{}m{}\x1b[0m",
                colour_code(event.probability),
                event.text
            )
        } else {
            out.write_all(event.text.as_bytes())
        };
        written.is_ok() && out.flush().is_ok()
    })?;
    let _ = writeln!(out);
    drop(out);
    if colour {
        eprintln!(
            "[colours: \x1b[32mp >= 0.8\x1b[0m \x1b[36m>= 0.5\x1b[0m \x1b[33m>= 0.2\x1b[0m \x1b[35m>= 0.05\x1b[0m \x1b[31m< 0.05\x1b[0m]"
        );
    }
    print_summary(&args, &engine.tokenizer, &generation, seed);
    Ok(())
}

/// ANSI foreground colour for a probability.
fn colour_code(p: f32) -> u8 {
    match p {
        p if p >= 0.8 => 32,
        p if p >= 0.5 => 36,
        p if p >= 0.2 => 33,
        p if p >= 0.05 => 35,
        _ => 31,
    }
}

/// A token's text, quoted and escaped (control tokens by name).
fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    match tokenizer.token_to_bytes(id, true) {
        Ok(bytes) => format!("{:?}", String::from_utf8_lossy(&bytes)),
        Err(_) => format!("<{id}>"),
    }
}

/// One token's log-probabilities on stderr: the token, then the raw alternatives with what the
/// sampler chain made of them (`removed`: the chain cut it).
fn print_logprobs(texts: &[String], event: &TokenEvent<'_>, lp: &TokenLogprobs) {
    let text = |id: u32| {
        texts
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| format!("<{id}>"))
    };
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "[{}] {} (id {}): p {:.4}, logprob {:.4} (raw {:.4}), entropy {:.3} nats (raw {:.3})",
        event.index,
        text(lp.token),
        lp.token,
        event.probability,
        lp.logprob,
        lp.raw_logprob,
        lp.entropy,
        lp.raw_entropy
    );
    // The processed list holds every surviving token when it is shorter than asked.
    let complete = lp.top.len() < lp.raw_top.len();
    for &(id, raw) in &lp.raw_top {
        let after = match lp.top.iter().find(|t| t.0 == id) {
            Some(&(_, l)) => format!("{l:.4}"),
            None if complete => "removed".into(),
            None => "-".into(),
        };
        let _ = writeln!(
            err,
            "    {:>20} {id:>7}  raw {raw:>9.4}  sampled {after}",
            text(id)
        );
    }
    for &(id, l) in lp
        .top
        .iter()
        .filter(|t| !lp.raw_top.iter().any(|r| r.0 == t.0))
    {
        let _ = writeln!(
            err,
            "    {:>20} {id:>7}  raw {:>9}  sampled {l:.4}",
            text(id),
            "-"
        );
    }
}

/// The finish reason and timings on stderr.
fn print_summary(args: &Args, tokenizer: &Tokenizer, g: &Generation, seed: u64) {
    let finish = match &g.finish {
        FinishCause::EndOfGeneration(t) | FinishCause::StopToken(t) => {
            format!("{} {}", g.finish, token_text(tokenizer, *t))
        }
        other => other.to_string(),
    };
    let mut line = format!(
        "[{} prompt tokens in {:.2} s ({:.1} tok/s), {} generated in {:.2} s ({:.1} tok/s), finish: {} ({finish})",
        g.prompt_tokens_computed,
        g.prefill_seconds,
        g.prefill_tokens_per_second(),
        g.tokens.len(),
        g.decode_seconds,
        g.decode_tokens_per_second(),
        g.finish_reason.as_str(),
    );
    if args.stats {
        line.push_str(&format!(
            ", {} prompt tokens reused from the cache",
            g.prompt_tokens_reused
        ));
    }
    if args.temperature > 0.0 {
        line.push_str(&format!(", seed {seed}"));
    }
    line.push(']');
    eprintln!("{line}");
    if matches!(g.finish, FinishCause::ContextFull { .. }) {
        eprintln!("(the context is full: raise --ctx-size to generate more)");
    }
}

/// A seed from the clock, for runs that did not ask for one.
pub fn random_seed() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// `\n`, `\t`, `\r` and `\\` in a `--stop` string stand for a newline, a tab, a carriage return
/// and a backslash; any other backslash is kept as it is.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_escapes_and_logit_bias_parse() {
        assert_eq!(unescape(r"a\n\nb\t\\x\q\"), "a\n\nb\t\\x\\q\\");
        assert_eq!(parse_logit_bias("15=-2.5"), Ok((15, -2.5)));
        assert_eq!(parse_logit_bias("3=-inf"), Ok((3, f32::NEG_INFINITY)));
        assert!(parse_logit_bias("x=1").is_err());
        assert!(parse_logit_bias("1").is_err());
        assert!(parse_logit_bias("1=big").is_err());
    }
}
