//! `rill embed`: texts to embedding vectors (an embedding model's, BERT's or a decoder's pooled
//! last hidden state), with how alike the texts are.

use anyhow::{bail, Context, Result};
use rill_engine::{Pooling, Precision};

use super::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The texts, each embedded apart (one starting with '-' goes after `--`).
    pub texts: Vec<String>,
    /// Read the texts from a file instead, one per line ('-' for standard input).
    #[arg(long, conflicts_with = "texts")]
    pub file: Option<std::path::PathBuf>,
    /// How a text's hidden states become one vector: as the file says (`pooling_type`; mean
    /// when it says nothing), or mean, cls (the first position's) or last.
    #[arg(long, value_parser = ["mean", "cls", "last"])]
    pub pooling: Option<String>,
    /// Keep this many leading dimensions (normalised again), as Matryoshka-trained models allow.
    #[arg(long)]
    pub dimensions: Option<usize>,
    /// The reference path: f32 activations against exactly dequantized weights.
    #[arg(long)]
    pub exact: bool,
    /// Print only {"model", "pooling", "dimensions", "tokens", "embeddings"} on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn main(args: Args) -> Result<()> {
    let texts = read_texts(&args)?;
    let precision = if args.exact {
        Precision::Exact
    } else {
        Precision::Fast
    };
    let mut engine = args.model.load(precision)?;
    let pooling = match args.pooling.as_deref() {
        None => engine.pooling(),
        Some("cls") => Pooling::Cls,
        Some("last") => Pooling::Last,
        _ => Pooling::Mean,
    };
    let d = engine.model.config().d_model;
    if let Some(n) = args.dimensions {
        if n == 0 || n > d {
            bail!("--dimensions must be in 1..={d} (the model's embedding size), got {n}");
        }
    }
    let inputs: Vec<Vec<u32>> = (texts.iter())
        .map(|t| engine.tokenizer.encode_with_special(t, true, false))
        .collect();
    let embedded = engine
        .embed(&inputs, pooling, 512)
        .context("cannot embed the texts")?;
    let vectors: Vec<Vec<f32>> = (embedded.vectors.into_iter())
        .map(|v| match args.dimensions {
            Some(n) if n < d => rill_engine::leading_dimensions(&v, n),
            _ => v,
        })
        .collect();
    if args.json {
        let doc = serde_json::json!({
            "model": args.model.model,
            "pooling": pooling.name(),
            "dimensions": vectors.first().map_or(0, Vec::len),
            "tokens": inputs.iter().map(Vec::len).collect::<Vec<_>>(),
            "embeddings": vectors,
        });
        println!("{doc}");
        return Ok(());
    }
    let dims = vectors.first().map_or(0, Vec::len);
    println!(
        "{} text(s), {} pooling, {dims} dimensions, unit length",
        texts.len(),
        pooling.name()
    );
    for (i, (v, ids)) in vectors.iter().zip(&inputs).enumerate() {
        let head: Vec<String> = v.iter().take(6).map(|x| format!("{x:+.4}")).collect();
        println!("[{i}] {} tokens: [{}, ...]", ids.len(), head.join(", "));
    }
    if vectors.len() > 1 {
        println!("cosine similarity:");
        for (i, a) in vectors.iter().enumerate() {
            let row: Vec<String> = (vectors.iter())
                .map(|b| format!("{:6.3}", cosine(a, b)))
                .collect();
            println!("[{i}] {}", row.join(" "));
        }
    }
    Ok(())
}

fn read_texts(args: &Args) -> Result<Vec<String>> {
    let texts = match &args.file {
        None => args.texts.clone(),
        Some(path) => {
            let text = if path.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("cannot read standard input")?
            } else {
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read {}", path.display()))?
            };
            text.lines().map(str::to_string).collect()
        }
    };
    if texts.is_empty() {
        bail!(
            "no text given: pass TEXT... or --file PATH (one text per line, - for standard input)"
        );
    }
    if let Some(i) = texts.iter().position(|t| t.trim().is_empty()) {
        bail!("text {i} is empty: there is nothing to embed");
    }
    Ok(texts)
}

/// Of two unit vectors: their dot product.
fn cosine(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}
