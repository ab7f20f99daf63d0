//! Reproducibility receipts: `rill run --receipt FILE` records everything a generation depended
//! on (the model file's sha256, rill's version, the kernel paths, the precision, the prompt's
//! token ids, every sampling and stop parameter with the seed) and the tokens it produced;
//! `rill replay FILE` generates again from the receipt and checks the tokens bit for bit. Batch
//! invariance and bit-exact kernels are what make this hold on any machine and thread count.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rill_engine::receipt::precision_name;
use rill_engine::{
    kernel_paths, GenerateParams, Generation, ModelIdentity, Precision, Receipt, ReceiptChoice,
    ReplayVerdict,
};
use serde_json::Value;

#[derive(clap::Args)]
pub struct Args {
    /// The receipt written by `rill run --receipt`.
    pub receipt: PathBuf,
    /// The model to replay with (default: the path the receipt names); its sha256 must match.
    #[arg(short, long)]
    pub model: Option<String>,
    /// Compute threads (0: one per core; the tokens do not depend on it).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
}

/// Lowercase hex sha256 of a file.
fn sha256_file(path: &Path) -> Result<String> {
    Ok(rill_engine::receipt::sha256_file(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .0)
}

/// Writes the receipt of `generation`.
pub fn write(
    path: &Path,
    model_path: &Path,
    precision: Precision,
    kv_types: rill_model::KvTypes,
    prompt: &[u32],
    params: &GenerateParams,
    generation: &Generation,
) -> Result<()> {
    let receipt = Receipt {
        model: ModelIdentity {
            sha256: sha256_file(model_path)?,
            bytes: std::fs::metadata(model_path)?.len(),
            path: Some(model_path.display().to_string()),
            name: None,
        },
        rill_version: env!("CARGO_PKG_VERSION").into(),
        kernels: kernel_paths(),
        precision,
        kv_types: Some(kv_types),
        prompt: prompt.to_vec(),
        params: params.clone(),
        choices: vec![ReceiptChoice {
            tokens: generation.tokens.clone(),
            text: generation.text.clone(),
            finish: generation.finish.to_string(),
        }],
        response_id: None,
    };
    std::fs::write(path, serde_json::to_string_pretty(&receipt.to_json())?)
        .with_context(|| format!("cannot write {}", path.display()))
}

pub fn main(args: Args) -> Result<()> {
    let text = std::fs::read_to_string(&args.receipt)
        .with_context(|| format!("cannot read {}", args.receipt.display()))?;
    let json: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a receipt (not JSON)", args.receipt.display()))?;
    let receipt = Receipt::from_json(&json)
        .with_context(|| format!("cannot read {}", args.receipt.display()))?;
    let path = match (&args.model, &receipt.model.path) {
        (Some(m), _) => super::ModelArgs::named(m, args.threads).path()?,
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => {
            bail!("the receipt names no model file (a server's receipt): give it with --model")
        }
    };
    let got_sha = sha256_file(&path)?;
    if got_sha != receipt.model.sha256 {
        bail!(
            "{} is not the receipt's model: sha256 {got_sha}, the receipt says {}",
            path.display(),
            receipt.model.sha256
        );
    }
    let precision = receipt.precision;
    let mut engine = rill_engine::Engine::load(&path, args.threads, precision)
        .with_context(|| format!("cannot load {}", path.display()))?;
    // Receipts from before KV types were recorded used the precision's default.
    if let Some(types) = receipt.kv_types {
        engine.model.set_kv_types(Some(types))?;
    }
    receipt.params.validate(engine.model.config().vocab_size)?;
    let context = receipt
        .prompt
        .len()
        .saturating_add(receipt.params.max_tokens);
    let mut replayed = Vec::with_capacity(receipt.choices.len());
    for c in 0..receipt.choices.len() {
        // Choice c of a server response sampled with seed + c.
        let mut params = receipt.params.clone();
        params.sampling.seed = params.sampling.seed.wrapping_add(c as u64);
        let mut session = engine.new_session(context)?;
        let got = session.generate(&mut engine, &receipt.prompt, &params, |_| true)?;
        replayed.push(got.tokens);
    }
    eprintln!(
        "replayed on {} ({}), recorded on {}, rill {} (recorded with {})",
        kernel_paths(),
        precision_name(precision),
        receipt.kernels,
        env!("CARGO_PKG_VERSION"),
        receipt.rill_version,
    );
    match receipt.verdict(&replayed) {
        ReplayVerdict::Identical { tokens } => {
            println!("identical: {tokens} tokens, bit for bit");
            Ok(())
        }
        ReplayVerdict::Differs {
            choice,
            at,
            got,
            want,
            got_len,
            want_len,
        } => {
            let which = if receipt.choices.len() > 1 {
                format!("choice {choice}, ")
            } else {
                String::new()
            };
            // A side that ended before this token has none.
            let token =
                |t: Option<u32>| t.map_or_else(|| "the end".to_string(), |t| format!("token {t}"));
            bail!(
                "the replay differs at {which}generated token {at}: {} against the receipt's {} ({got_len} tokens against {want_len})",
                token(got),
                token(want)
            )
        }
    }
}
