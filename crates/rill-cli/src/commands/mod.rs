//! One module per subcommand, plus what they share: the `--model` argument and text input.

pub mod bench;
pub mod bench_serve;
pub mod chat;
pub mod chat_input;
pub mod embed;
pub mod inspect;
pub mod interrupt;
pub mod probe;
pub mod pull;
pub mod replay;
pub mod run;
pub mod sampling_defaults;
pub mod serve;
pub mod template_choice;
pub mod tokenize;

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rill_engine::{Engine, Precision};
use rill_model::{KvDtype, KvTypes};

/// The default model: fetched on first use.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// `--model` and `--threads`, shared by every command that loads a model.
#[derive(clap::Args, Clone)]
pub struct ModelArgs {
    /// A built-in model name (smollm2-135m, gemma3-270m), a path to a .gguf file, or
    /// hf:OWNER/REPO/FILE.gguf. Built-in models are downloaded on first use.
    #[arg(short, long, default_value = DEFAULT_MODEL)]
    pub model: String,
    /// Compute threads (0: one per core).
    #[arg(short, long, default_value_t = 0)]
    pub threads: usize,
    /// Element type of the KV cache's keys and values: f16 (default of the fast path), f32
    /// (default of --exact), q8_0 or q4_0 (about 1/2 and 1/4 of f16's memory; lossy).
    #[arg(long, value_name = "TYPE")]
    pub kv_type: Option<KvDtype>,
    /// The keys' type alone (overrides --kv-type for keys), as llama.cpp's -ctk.
    #[arg(long, value_name = "TYPE")]
    pub kv_type_k: Option<KvDtype>,
    /// The values' type alone (overrides --kv-type for values), as llama.cpp's -ctv.
    #[arg(long, value_name = "TYPE")]
    pub kv_type_v: Option<KvDtype>,
}

impl ModelArgs {
    /// `--model NAME --threads N` and nothing else.
    pub fn named(model: &str, threads: usize) -> ModelArgs {
        ModelArgs {
            model: model.to_string(),
            threads,
            kv_type: None,
            kv_type_k: None,
            kv_type_v: None,
        }
    }

    /// The model's local path, fetching it first when needed (with progress on stderr).
    pub fn path(&self) -> Result<PathBuf> {
        let opts = rill_fetch::FetchOptions {
            progress: true,
            ..Default::default()
        };
        Ok(rill_fetch::resolve(&self.model, &opts)?)
    }

    pub fn load(&self, precision: Precision) -> Result<Engine> {
        let path = self.path()?;
        let mut engine = Engine::load(&path, self.threads, precision)
            .with_context(|| format!("cannot load {}", path.display()))?;
        self.apply_kv_types(&mut engine.model, precision)?;
        Ok(engine)
    }

    /// The KV types the flags ask for (`None`: the precision's default).
    pub fn kv_types(&self, precision: Precision) -> Option<KvTypes> {
        if self.kv_type.is_none() && self.kv_type_k.is_none() && self.kv_type_v.is_none() {
            return None;
        }
        let default = self
            .kv_type
            .map_or_else(|| KvTypes::for_precision(precision), KvTypes::from);
        Some(KvTypes {
            keys: self.kv_type_k.unwrap_or(default.keys),
            values: self.kv_type_v.unwrap_or(default.values),
        })
    }

    /// Makes the model's KV caches use the flags' types.
    pub fn apply_kv_types(
        &self,
        model: &mut rill_model::Model,
        precision: Precision,
    ) -> Result<()> {
        Ok(model.set_kv_types(self.kv_types(precision))?)
    }
}

pub use rill_engine::kernel_paths;

/// `TEXT | --file PATH|-`: the text, as bytes (a file may hold anything, NUL bytes included).
#[derive(clap::Args, Clone)]
pub struct TextInput {
    /// The text (one starting with '-' goes after `--`).
    pub text: Option<String>,
    /// Read the text from a file instead ('-' for standard input), byte for byte.
    #[arg(long, conflicts_with = "text")]
    pub file: Option<PathBuf>,
}

impl TextInput {
    /// The input as a string; invalid UTF-8 is an error naming the byte offset.
    pub fn read(&self) -> Result<String> {
        let bytes = match (&self.text, &self.file) {
            (Some(t), None) => return Ok(t.clone()),
            (None, Some(p)) if p.as_os_str() == "-" => {
                let mut b = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut b)
                    .context("cannot read standard input")?;
                b
            }
            (None, Some(p)) => {
                std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?
            }
            (None, None) => bail!("no text given: pass TEXT or --file PATH (- for standard input)"),
            (Some(_), Some(_)) => bail!("pass either TEXT or --file, not both"),
        };
        String::from_utf8(bytes).map_err(|e| {
            anyhow::anyhow!(
                "the input is not valid UTF-8 (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            )
        })
    }
}
