//! `rill chat`: a multi-turn conversation; the KV cache persists between turns, so only each
//! new turn is prefilled. At a terminal a line editor reads the messages (`chat_input.rs`).

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use rill_engine::{GenerateParams, Precision, SamplingParams};
use rill_tokenizer::ChatMessage;
use serde_json::{json, Value};

use super::chat_input::{Input, Read};
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

const HELP: &str = "\
/help          these commands
/clear         start over (the system message stays; /reset too)
/system TEXT   set the system message (/system alone removes it)
/save FILE     write the conversation as JSON
/load FILE     read a conversation written by /save (or a JSON list of {role, content})
/exit          leave (/quit, Ctrl-D, or Ctrl-C twice at the prompt)
A message over several lines: end a line with \\ to go on, or put it between lines of \"\"\".
Ctrl-C while an answer is generated stops it (the answer so far stays in the conversation).";

/// What a `/command` did.
enum Command {
    Handled,
    Leave,
}

fn command(text: &str, messages: &mut Vec<ChatMessage>) -> Result<Command> {
    let (name, arg) = match text.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (text, ""),
    };
    match name {
        "/exit" | "/quit" => return Ok(Command::Leave),
        "/help" => eprintln!("{HELP}"),
        "/clear" | "/reset" => {
            messages.retain(|m| m.role == "system");
            eprintln!("(conversation cleared)");
        }
        "/system" => {
            messages.retain(|m| m.role != "system");
            if !arg.is_empty() {
                messages.insert(0, ChatMessage::new("system", arg));
                eprintln!("(system message set)");
            } else {
                eprintln!("(system message removed)");
            }
        }
        "/save" => match save(Path::new(arg), messages) {
            Ok(()) => eprintln!("(saved {} messages to {arg})", messages.len()),
            Err(e) => eprintln!("error: {e:#}"),
        },
        "/load" => match load(Path::new(arg)) {
            Ok(loaded) => {
                *messages = loaded;
                eprintln!("(loaded {} messages from {arg})", messages.len());
            }
            Err(e) => eprintln!("error: {e:#}"),
        },
        other => eprintln!("error: unknown command {other:?}; /help lists them"),
    }
    Ok(Command::Handled)
}

fn save(path: &Path, messages: &[ChatMessage]) -> Result<()> {
    if path.as_os_str().is_empty() {
        bail!("/save needs a file name");
    }
    let list: Vec<Value> = messages
        .iter()
        .map(|m| json!({ "role": m.role, "content": m.content }))
        .collect();
    let text = serde_json::to_string_pretty(&json!({ "messages": list }))?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

fn load(path: &Path) -> Result<Vec<ChatMessage>> {
    if path.as_os_str().is_empty() {
        bail!("/load needs a file name");
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let doc: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let list = doc.get("messages").unwrap_or(&doc);
    let Some(list) = list.as_array() else {
        bail!("{} holds no list of messages", path.display());
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let field = |k: &str| m.get(k).and_then(Value::as_str);
            match (field("role"), field("content")) {
                (Some(role @ ("system" | "user" | "assistant")), Some(content)) => {
                    Ok(ChatMessage::new(role, content))
                }
                _ => bail!(
                    "message {i} of {} is not {{\"role\": system|user|assistant, \"content\": text}}",
                    path.display()
                ),
            }
        })
        .collect()
}

pub fn main(args: Args) -> Result<()> {
    if let Some(t) = args.temperature {
        SamplingParams::with_temperature(t, 0).validate()?;
    }
    let model_path = args.model.path()?;
    let mut engine = args.model.load(Precision::Fast)?;
    let defaults = SamplingDefaults::from_metadata(engine.model.file().metadata());
    let mut session = engine.new_session(args.ctx_size)?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system));
    }
    let seed = args.seed.unwrap_or_else(super::run::random_seed);
    let mut input = Input::new(&model_path);
    if input.interactive() {
        eprintln!("rill chat: type a message and press Enter; /help lists the commands, /exit (or Ctrl-D) quits.");
    }
    // Ctrl-C stops an answer; at a plain prompt (not the editor's), twice leaves.
    let interrupts = super::interrupt::Interrupts::install();
    let mut turn = 0u64;
    loop {
        let text = match input.read()? {
            Read::Leave => break,
            Read::Message(text) => text,
        };
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        if text.starts_with('/') && !text.contains('\n') {
            match command(text, &mut messages)? {
                Command::Leave => break,
                Command::Handled => continue,
            }
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
                && !generating.interrupted(!event.text.is_empty())
        });
        drop(generating);
        let generation = match result {
            Ok(g) => g,
            Err(e) => {
                // A full context ends the turn with a message, not the program.
                messages.pop();
                eprintln!("\nerror: {e} (use /clear to start over)");
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
