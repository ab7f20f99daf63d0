//! Reproducibility receipts: `rill run --receipt FILE` records everything a generation depended
//! on (the model file's sha256, rill's version, the kernel paths, the precision, the prompt's
//! token ids, every sampling and stop parameter with the seed) and the tokens it produced;
//! `rill replay FILE` generates again from the receipt and checks the tokens bit for bit. Batch
//! invariance and bit-exact kernels are what make this hold on any machine and thread count.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rill_engine::{GenerateParams, Generation, Precision, SamplingParams, Stage};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

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
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Exact => "exact",
        Precision::Fast => "fast",
    }
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
    let s = &params.sampling;
    let receipt = json!({
        "rill_receipt": 1,
        "rill_version": env!("CARGO_PKG_VERSION"),
        "model": {
            "path": model_path,
            "sha256": sha256_file(model_path)?,
            "bytes": std::fs::metadata(model_path)?.len(),
        },
        "kernels": super::kernel_paths(),
        "precision": precision_name(precision),
        "kv_types": {"keys": kv_types.keys.name(), "values": kv_types.values.name()},
        "prompt_token_ids": prompt,
        "params": {
            "max_tokens": params.max_tokens,
            "temperature": s.temperature,
            "seed": s.seed,
            "top_k": s.top_k,
            "top_p": s.top_p,
            "min_p": s.min_p,
            "typical_p": s.typical_p,
            "repeat_penalty": s.repeat_penalty,
            "repeat_last_n": if s.repeat_last_n == usize::MAX { -1 } else { s.repeat_last_n as i64 },
            "presence_penalty": s.presence_penalty,
            "frequency_penalty": s.frequency_penalty,
            "logit_bias": s.logit_bias,
            "banned_tokens": s.banned_tokens,
            "order": s.order.iter().map(|o| o.name()).collect::<Vec<_>>(),
            "ignore_eos": params.ignore_eos,
            "min_tokens": params.min_tokens,
            "stop": params.stop,
            "stop_token_ids": params.stop_token_ids,
        },
        "tokens": generation.tokens,
        "text": generation.text,
        "finish": generation.finish.to_string(),
    });
    std::fs::write(path, serde_json::to_string_pretty(&receipt)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

fn field<'a>(v: &'a Value, key: &str) -> Result<&'a Value> {
    v.get(key)
        .with_context(|| format!("the receipt has no {key:?}"))
}

fn f32_of(v: &Value, key: &str) -> Result<f32> {
    Ok(field(v, key)?
        .as_f64()
        .with_context(|| format!("{key:?} is not a number"))? as f32)
}

fn u64_of(v: &Value, key: &str) -> Result<u64> {
    field(v, key)?
        .as_u64()
        .with_context(|| format!("{key:?} is not a non-negative integer"))
}

fn ids_of(v: &Value, key: &str) -> Result<Vec<u32>> {
    field(v, key)?
        .as_array()
        .with_context(|| format!("{key:?} is not an array"))?
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .with_context(|| format!("{key:?} holds a value that is not a token id"))
        })
        .collect()
}

/// The generation parameters a receipt records.
fn params_of(p: &Value) -> Result<GenerateParams> {
    let order = field(p, "order")?
        .as_array()
        .context("\"order\" is not an array")?
        .iter()
        .map(|o| {
            o.as_str()
                .context("a stage is not a string")?
                .parse::<Stage>()
                .map_err(|e| anyhow::anyhow!("{e}"))
        })
        .collect::<Result<Vec<_>>>()?;
    let logit_bias = field(p, "logit_bias")?
        .as_array()
        .context("\"logit_bias\" is not an array")?
        .iter()
        .map(|e| {
            let id = e[0].as_u64().context("a logit_bias id")? as u32;
            let b = e[1].as_f64().context("a logit_bias value")? as f32;
            Ok((id, b))
        })
        .collect::<Result<Vec<_>>>()?;
    let repeat_last_n = match field(p, "repeat_last_n")?.as_i64() {
        Some(-1) => usize::MAX,
        Some(n) if n >= 0 => n as usize,
        _ => bail!("\"repeat_last_n\" is not an integer >= -1"),
    };
    let stop = field(p, "stop")?
        .as_array()
        .context("\"stop\" is not an array")?
        .iter()
        .map(|s| s.as_str().map(str::to_string).context("a stop string"))
        .collect::<Result<Vec<_>>>()?;
    Ok(GenerateParams {
        max_tokens: u64_of(p, "max_tokens")? as usize,
        sampling: SamplingParams {
            temperature: f32_of(p, "temperature")?,
            seed: u64_of(p, "seed")?,
            top_k: u64_of(p, "top_k")? as usize,
            top_p: f32_of(p, "top_p")?,
            min_p: f32_of(p, "min_p")?,
            typical_p: f32_of(p, "typical_p")?,
            repeat_penalty: f32_of(p, "repeat_penalty")?,
            repeat_last_n,
            presence_penalty: f32_of(p, "presence_penalty")?,
            frequency_penalty: f32_of(p, "frequency_penalty")?,
            logit_bias,
            banned_tokens: ids_of(p, "banned_tokens")?,
            order,
        },
        ignore_eos: field(p, "ignore_eos")?
            .as_bool()
            .context("\"ignore_eos\" is not a boolean")?,
        min_tokens: u64_of(p, "min_tokens")? as usize,
        stop,
        stop_token_ids: ids_of(p, "stop_token_ids")?,
        ..GenerateParams::default()
    })
}

pub fn main(args: Args) -> Result<()> {
    let text = std::fs::read_to_string(&args.receipt)
        .with_context(|| format!("cannot read {}", args.receipt.display()))?;
    let receipt: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a receipt (not JSON)", args.receipt.display()))?;
    if receipt.get("rill_receipt").and_then(Value::as_u64) != Some(1) {
        bail!(
            "{} is not a rill receipt (version 1)",
            args.receipt.display()
        );
    }
    let model = field(&receipt, "model")?;
    let want_sha = field(model, "sha256")?
        .as_str()
        .context("the model's sha256 is not a string")?;
    let path = match &args.model {
        Some(m) => super::ModelArgs::named(m, args.threads).path()?,
        None => PathBuf::from(
            field(model, "path")?
                .as_str()
                .context("the model's path is not a string")?,
        ),
    };
    let got_sha = sha256_file(&path)?;
    if got_sha != want_sha {
        bail!(
            "{} is not the receipt's model: sha256 {got_sha}, the receipt says {want_sha}",
            path.display()
        );
    }
    let precision = match field(&receipt, "precision")?.as_str() {
        Some("exact") => Precision::Exact,
        Some("fast") => Precision::Fast,
        other => bail!("unknown precision {other:?}"),
    };
    let prompt = ids_of(&receipt, "prompt_token_ids")?;
    let want = ids_of(&receipt, "tokens")?;
    let params = params_of(field(&receipt, "params")?)?;
    let mut engine = rill_engine::Engine::load(&path, args.threads, precision)
        .with_context(|| format!("cannot load {}", path.display()))?;
    // Receipts from before KV types were recorded used the precision's default.
    if let Some(types) = receipt.get("kv_types") {
        let of = |key: &str| -> Result<rill_model::KvDtype> {
            let name = types.get(key).and_then(|v| v.as_str()).unwrap_or("");
            rill_model::KvDtype::parse(name).with_context(|| format!("unknown KV type {name:?}"))
        };
        let types = rill_model::KvTypes {
            keys: of("keys")?,
            values: of("values")?,
        };
        engine.model.set_kv_types(Some(types))?;
    }
    params.validate(engine.model.config().vocab_size)?;
    let context = prompt.len().saturating_add(params.max_tokens);
    let mut session = engine.new_session(context)?;
    let got = session.generate(&mut engine, &prompt, &params, |_| true)?;
    let recorded_on = field(&receipt, "kernels")?.as_str().unwrap_or("?");
    eprintln!(
        "replayed on {} ({}), recorded on {recorded_on}, rill {} (recorded with {})",
        super::kernel_paths(),
        precision_name(precision),
        env!("CARGO_PKG_VERSION"),
        field(&receipt, "rill_version")?.as_str().unwrap_or("?"),
    );
    if got.tokens == want {
        println!("identical: {} tokens, bit for bit", want.len());
        return Ok(());
    }
    let at = got
        .tokens
        .iter()
        .zip(&want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.tokens.len().min(want.len()));
    bail!(
        "the replay differs at generated token {at}: {:?} against the receipt's {:?} ({} tokens against {})",
        got.tokens.get(at),
        want.get(at),
        got.tokens.len(),
        want.len()
    )
}
