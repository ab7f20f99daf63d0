//! `rill`: run, chat, probe, tokenize, embed, inspect, pull and serve models.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use commands::{bench, chat, embed, inspect, probe, pull, replay, run, serve, tokenize};

/// rill: an LLM inference engine that shows how text generation happens.
#[derive(Parser)]
#[command(name = "rill", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate an answer to a prompt, streamed to stdout.
    Run(run::Args),
    /// Multi-turn chat in the terminal (the KV cache is kept between turns).
    Chat(chat::Args),
    /// Show the most likely next tokens after every position of a text.
    Probe(probe::Args),
    /// Split text into token ids and pieces.
    Tokenize(tokenize::Args),
    /// Texts to embedding vectors (pooled last hidden states), and how alike they are.
    Embed(embed::Args),
    /// Show a model file's metadata, tensors and per-token costs.
    Inspect(inspect::Args),
    /// Download a built-in model into the cache.
    Pull(pull::Args),
    /// Measure prompt processing and generation speed (llama-bench style).
    Bench(bench::Args),
    /// Serve the model over HTTP with OpenAI's API (continuous batching).
    Serve(serve::Args),
    /// Generate again from a `rill run --receipt` receipt and check the tokens bit for bit.
    Replay(replay::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::main(a),
        Command::Chat(a) => chat::main(a),
        Command::Probe(a) => probe::main(a),
        Command::Tokenize(a) => tokenize::main(a),
        Command::Embed(a) => embed::main(a),
        Command::Inspect(a) => inspect::main(a),
        Command::Pull(a) => pull::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Serve(a) => serve::main(a),
        Command::Replay(a) => replay::main(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line naming the problem: the error and its causes, joined.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
