//! `rill probe`: the token probability viewer in the terminal. After every position of the
//! input, the K most likely next tokens and their probabilities; optionally a greedy
//! continuation and the last position's full logits.

use std::io::Write;

use anyhow::{bail, Context, Result};
use rill_engine::{argmax, top_logprobs};
use rill_model::{Batch, Precision};

use super::{ModelArgs, TextInput};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Compute with f32 activations and an f32 KV cache (the reference path).
    #[arg(long)]
    pub exact: bool,
    /// Candidates shown per position.
    #[arg(long, default_value_t = 8)]
    pub top: usize,
    /// Then append this many greedy tokens (end tokens do not stop it).
    #[arg(long, default_value_t = 0)]
    pub greedy: usize,
    /// Print only JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print the logit lens at the last input position instead: per layer (0: the embeddings),
    /// the most likely tokens if the model stopped there (its final norm and output head applied
    /// to the residual stream; unadjusted), and the rank of the model's final choice.
    #[arg(long, conflicts_with_all = ["greedy", "dump_last_logits"])]
    pub lens: bool,
    /// Print the attention at the last input position instead: every layer's and head's
    /// weights over every position up to and including it (0 outside a sliding window).
    #[arg(long, conflicts_with_all = ["greedy", "dump_last_logits", "lens"])]
    pub attention: bool,
    /// Write the last input position's logits to this file (little-endian f32).
    #[arg(long)]
    pub dump_last_logits: Option<std::path::PathBuf>,
    /// Token ids to use as they are (comma-separated), instead of text.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["text", "file"])]
    pub token_ids: Option<Vec<u32>>,
    #[command(flatten)]
    pub input: TextInput,
}

/// The top candidates after one position.
struct Position {
    top_ids: Vec<u32>,
    top_logprobs: Vec<f32>,
}

fn top_k(logits: &[f32], k: usize) -> Position {
    let (top_ids, top_logprobs) = top_logprobs(logits, k).into_iter().unzip();
    Position {
        top_ids,
        top_logprobs,
    }
}

/// Rows per forward pass, so long inputs never hold every position's logits at once.
const CHUNK: usize = 64;

pub fn main(args: Args) -> Result<()> {
    let precision = if args.exact {
        Precision::Exact
    } else {
        Precision::Fast
    };
    let mut engine = args.model.load(precision)?;
    let token_ids = match &args.token_ids {
        Some(ids) => ids.clone(),
        // Raw text, no chat template; BOS when the model's metadata adds one.
        None => engine
            .tokenizer
            .encode_with_special(&args.input.read()?, true, false),
    };
    if token_ids.is_empty() {
        bail!("nothing to probe: the input has no tokens");
    }
    let vocab = engine.model.config().vocab_size;
    if let Some(&bad) = token_ids.iter().find(|&&t| t as usize >= vocab) {
        bail!("token id {bad} is outside the vocabulary of {vocab}");
    }
    let top = args.top.clamp(1, vocab);
    if args.lens {
        return print_lens(&mut engine, &token_ids, top, args.json);
    }
    if args.attention {
        return print_attention(&mut engine, &token_ids, args.json);
    }
    let context = engine.model.config().context_length;
    let capacity = token_ids.len().saturating_add(args.greedy);
    if capacity > context {
        bail!(
            "{} input tokens plus --greedy {} exceed the model's context of {context} tokens",
            token_ids.len(),
            args.greedy
        );
    }
    let mut kv = engine.model.new_kv_cache(capacity, precision)?;
    kv.add_sequence(0)?;

    let mut positions = Vec::with_capacity(token_ids.len());
    let mut logits = Vec::new();
    let mut last = Vec::new();
    for (c, chunk) in token_ids.chunks(CHUNK).enumerate() {
        let batch = Batch::prompt(0, chunk, c * CHUNK, true);
        engine
            .model
            .forward(&batch, &mut kv, precision, &mut logits)?;
        for row in logits.chunks_exact(vocab) {
            positions.push(top_k(row, top));
        }
        last.clear();
        last.extend_from_slice(&logits[logits.len() - vocab..]);
    }
    if let Some(path) = &args.dump_last_logits {
        let bytes: Vec<u8> = last.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    }

    let mut greedy_ids = Vec::with_capacity(args.greedy);
    for i in 0..args.greedy {
        let next = argmax(&last);
        greedy_ids.push(next);
        if i + 1 < args.greedy {
            let mut batch = Batch::new();
            batch.push(0, next, token_ids.len() + i, true);
            engine
                .model
                .forward(&batch, &mut kv, precision, &mut last)?;
        }
    }

    let tok = &engine.tokenizer;
    let piece = |id: u32| tok.decode_with(&[id], true);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        let positions: Vec<_> = positions
            .iter()
            .map(|p| serde_json::json!({"top_ids": p.top_ids, "top_logprobs": p.top_logprobs}))
            .collect();
        let json = serde_json::json!({
            "token_ids": token_ids,
            "positions": positions,
            "greedy_ids": greedy_ids,
        });
        writeln!(out, "{json}")?;
        return Ok(());
    }
    for (i, (&id, p)) in token_ids.iter().zip(&positions).enumerate() {
        let next = token_ids.get(i + 1);
        writeln!(out, "{i:>5} {id:>7} {:<20} ->", format!("{:?}", piece(id)))?;
        for (&cand, &lp) in p.top_ids.iter().zip(&p.top_logprobs) {
            let prob = lp.exp();
            let bar = "█".repeat((prob * 30.0).round() as usize);
            let mark = if Some(&cand) == next {
                " <- next in input"
            } else {
                ""
            };
            writeln!(
                out,
                "              {:>6.2}% {:<22} {bar}{mark}",
                prob * 100.0,
                format!("{:?}", piece(cand))
            )?;
        }
    }
    if !greedy_ids.is_empty() {
        let text = tok.decode_with(&greedy_ids, true);
        writeln!(
            out,
            "greedy continuation ({} tokens): {text:?}",
            greedy_ids.len()
        )?;
    }
    Ok(())
}

/// `--lens`: the logit lens at the last input position.
fn print_lens(
    engine: &mut rill_engine::Engine,
    token_ids: &[u32],
    top: usize,
    json: bool,
) -> Result<()> {
    let lens = engine.logit_lens(token_ids, top)?;
    let tok = &engine.tokenizer;
    let piece = |id: u32| tok.decode_with(&[id], true);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if json {
        let layers: Vec<_> = lens
            .layers
            .iter()
            .map(|l| {
                serde_json::json!({
                    "layer": l.layer,
                    "top_ids": l.top.iter().map(|&(t, _)| t).collect::<Vec<_>>(),
                    "top_logprobs": l.top.iter().map(|&(_, lp)| lp).collect::<Vec<_>>(),
                    "chosen_rank": l.chosen_rank,
                    "chosen_logprob": l.chosen_logprob,
                    "entropy": l.entropy,
                    "kl_to_final": l.kl_to_final,
                    "residual_norm": l.residual_norm,
                    "writes": l.writes.map(|w| serde_json::json!({
                        "attention_norm": w.attention_norm,
                        "ffn_norm": w.ffn_norm,
                        "attention_logit": w.attention_logit,
                        "ffn_logit": w.ffn_logit,
                    })),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "token_ids": token_ids,
            "chosen": lens.chosen,
            "chosen_logit": lens.chosen_logit,
            "embedding_logit": lens.embedding_logit,
            "settled_at": lens.settled_at,
            "lens": layers,
        });
        writeln!(out, "{doc}")?;
        return Ok(());
    }
    writeln!(
        out,
        "logit lens at position {} (unadjusted: the final norm and output head applied after each layer); the model's choice: {:?}",
        token_ids.len() - 1,
        piece(lens.chosen)
    )?;
    writeln!(
        out,
        "layer  top token              p       choice rank  p(choice)  entropy  KL to final  |residual|  attn→logit  ffn→logit"
    )?;
    for l in &lens.layers {
        let (t, lp) = l.top.first().copied().unwrap_or((0, f32::NEG_INFINITY));
        let name = if l.layer == 0 {
            "emb".to_string()
        } else {
            l.layer.to_string()
        };
        let (attn, ffn) = match l.writes {
            Some(w) => (
                format!("{:+.2}", w.attention_logit),
                format!("{:+.2}", w.ffn_logit),
            ),
            None => (format!("{:+.2}", lens.embedding_logit), String::new()),
        };
        writeln!(
            out,
            "{name:>5}  {:<20} {:>6.2}%  {:>11}  {:>8.2}%  {:>7.3}  {:>11.3}  {:>10.1}  {attn:>10}  {ffn:>9}",
            format!("{:?}", piece(t)),
            lp.exp() * 100.0,
            l.chosen_rank + 1,
            l.chosen_logprob.exp() * 100.0,
            l.entropy,
            l.kl_to_final,
            l.residual_norm,
        )?;
    }
    writeln!(
        out,
        "the choice's logit {:.2} is the embeddings' {:+.2} plus what each layer's attention and feed-forward wrote (direct contributions through the output head)",
        lens.chosen_logit, lens.embedding_logit
    )?;
    writeln!(
        out,
        "the choice is the most likely token from layer {} on",
        lens.settled_at
    )?;
    Ok(())
}

/// `--attention`: every layer's and head's weights at the last input position.
fn print_attention(engine: &mut rill_engine::Engine, token_ids: &[u32], json: bool) -> Result<()> {
    let lens = engine.logit_lens(token_ids, 1)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if json {
        let doc = serde_json::json!({ "token_ids": token_ids, "attention": lens.attention });
        writeln!(out, "{doc}")?;
        return Ok(());
    }
    let tok = &engine.tokenizer;
    let piece = |id: u32| format!("{:?}", tok.decode_with(&[id], true));
    writeln!(
        out,
        "attention of position {} ({}), per layer and head: the three positions it weighs most",
        token_ids.len() - 1,
        piece(token_ids[token_ids.len() - 1])
    )?;
    for (layer, heads) in lens.attention.iter().enumerate() {
        for (head, weights) in heads.iter().enumerate() {
            let mut order: Vec<usize> = (0..weights.len()).collect();
            order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
            let best: Vec<String> = order
                .iter()
                .take(3)
                .map(|&p| format!("{p} {} {:.1}%", piece(token_ids[p]), weights[p] * 100.0))
                .collect();
            writeln!(
                out,
                "layer {:>2} head {:>2}: {}",
                layer + 1,
                head,
                best.join(", ")
            )?;
        }
    }
    Ok(())
}
