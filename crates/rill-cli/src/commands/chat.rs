//! `rill chat`: a multi-turn conversation; the KV cache persists between turns, so only each
//! new turn is prefilled.

use std::io::{BufRead, Write};

use anyhow::Result;
use rill_engine::{GenerateParams, Precision, SamplingParams};
use rill_tokenizer::ChatMessage;

use super::sampling_defaults::SamplingDefaults;
use super::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most tokens per answer.
    #[arg(short = 'n', long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy. Default: the model file's general.sampling.* settings,
    /// else llama.cpp's (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05).
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// A system message.
    #[arg(long)]
    pub system: Option<String>,
    /// Context size in tokens for the whole conversation.
    #[arg(long, default_value_t = 4096)]
    pub ctx_size: usize,
    /// Print per-turn statistics (tokens reused from the cache, speed) to stderr.
    #[arg(long)]
    pub stats: bool,
}

pub fn main(args: Args) -> Result<()> {
    if let Some(t) = args.temperature {
        SamplingParams::with_temperature(t, 0).validate()?;
    }
    let mut engine = args.model.load(Precision::Fast)?;
    let defaults = SamplingDefaults::from_metadata(engine.model.file().metadata());
    let mut session = engine.new_session(args.ctx_size)?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system));
    }
    let seed = args.seed.unwrap_or_else(super::run::random_seed);
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    if interactive {
        eprintln!("rill chat: type a message and press Enter; /reset starts over, /exit (or Ctrl-D) quits.");
    }
    // Ctrl-C stops an answer; at the prompt, twice leaves.
    let interrupts = super::interrupt::Interrupts::install();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut turn = 0u64;
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m: &ChatMessage| m.role == "system");
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", text));
        let prompt = engine.chat_prompt(&messages)?;
        let params = GenerateParams {
            max_tokens: args.max_tokens,
            sampling: SamplingParams {
                temperature: args.temperature.unwrap_or(defaults.temperature),
                top_k: defaults.top_k,
                top_p: defaults.top_p,
                min_p: defaults.min_p,
                repeat_penalty: defaults.repeat_penalty,
                repeat_last_n: usize::try_from(defaults.repeat_last_n).unwrap_or(usize::MAX),
                seed: seed.wrapping_add(turn),
                ..SamplingParams::default()
            },
            ..GenerateParams::default()
        };
        turn += 1;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        let generating = interrupts.generating();
        let result = session.generate(&mut engine, &prompt, &params, |event| {
            out.write_all(event.text.as_bytes()).is_ok()
                && out.flush().is_ok()
                && !generating.interrupted()
        });
        drop(generating);
        let generation = match result {
            Ok(g) => g,
            Err(e) => {
                // A full context ends the turn with a message, not the program.
                messages.pop();
                eprintln!("\nerror: {e} (use /reset to start over)");
                continue;
            }
        };
        writeln!(out)?;
        if args.stats {
            eprintln!(
                "[prompt: {} reused from the cache, {} computed; {} generated, {:.1} tok/s; finish: {}]",
                generation.prompt_tokens_reused,
                generation.prompt_tokens_computed,
                generation.tokens.len(),
                generation.tokens.len() as f64 / generation.decode_seconds.max(1e-9),
                generation.finish_reason.as_str()
            );
        }
        if generation.finish_reason == rill_engine::FinishReason::Cancelled {
            // The answer so far stays in the conversation (and its keys and values in the cache).
            eprintln!("(stopped)");
        }
        messages.push(ChatMessage::new("assistant", generation.text.trim()));
    }
    Ok(())
}
