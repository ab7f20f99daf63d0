//! `rill inspect MODEL`: what is in a GGUF file and what a token costs.

use anyhow::Result;
use rill_gguf::{GgufFile, Value};
use rill_model::{KvDtype, KvTypes, Model, ModelConfig};

#[derive(clap::Args)]
pub struct Args {
    /// A built-in model name, a path to a .gguf file, or hf:OWNER/REPO/FILE.gguf.
    #[arg(required_unless_present = "model_flag", conflicts_with = "model_flag")]
    pub model: Option<String>,
    /// The same, as an option, like every other command.
    #[arg(short = 'm', long = "model", id = "model_flag")]
    pub model_flag: Option<String>,
    /// List every tensor (by default, layers past the first are summarised).
    #[arg(long)]
    pub all_tensors: bool,
}

fn show_value(v: &Value) -> String {
    match v {
        // Quoted and escaped as Rust writes strings: one line, a real newline `\n`, a
        // backslash and an n in the text `\\n` (a template's Jinja string escapes stay visible).
        Value::String(s) => {
            if s.chars().count() > 100 {
                format!(
                    "{:?}… ({} chars)",
                    s.chars().take(100).collect::<String>(),
                    s.chars().count()
                )
            } else {
                format!("{s:?}")
            }
        }
        Value::Array(items) => {
            let head: Vec<String> = items.iter().take(4).map(show_value).collect();
            if items.len() > 4 {
                format!("[{}, …] ({} items)", head.join(", "), items.len())
            } else {
                format!("[{}]", head.join(", "))
            }
        }
        Value::F32(x) => format!("{x}"),
        Value::F64(x) => format!("{x}"),
        Value::Bool(b) => format!("{b}"),
        other => other.as_i64().map(|i| i.to_string()).unwrap_or_default(),
    }
}

fn human_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.2} GB", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.2} MB", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1} kB", n / 1e3)
    } else {
        format!("{n} B")
    }
}

/// Which registered kernel each kind of the model's products runs on this CPU's fast path, for
/// a prompt pass (512 rows) and a decoding step (one row), grouped by what the rows are.
fn print_kernels(model: &Model) {
    use rill_kernels::{Activations, WeightLayout};
    let weights = model.weights();
    let layout_name = |l: WeightLayout| match l {
        WeightLayout::Blocks => "in the file's blocks",
        WeightLayout::ScalesFirst => "scales first",
        WeightLayout::RowInterleaved => "in groups of 16 rows",
        WeightLayout::RowInterleavedNibbles => "in groups of 16 rows (nibble planes)",
    };
    let activations_name = |a: Activations| match a {
        Activations::Int8 => "8-bit activations",
        Activations::Int8Refined => "two-level 8-bit activations",
        Activations::Float => "f32 activations",
        Activations::Int16 => "16-bit activations",
    };
    // (rows, prompt kernel, decoding kernel) -> the products of that kind.
    let mut kinds: Vec<((String, String, String), Vec<String>)> = Vec::new();
    for (w, _) in weights.matrices() {
        let role = match w.name.as_str() {
            "token_embd.weight" if !weights.tied_output => continue,
            "token_embd.weight" => "output (tied to token_embd)".to_string(),
            name => {
                let name = name.strip_suffix(".weight").unwrap_or(name);
                match name.strip_prefix("blk.") {
                    Some(rest) => rest.split_once('.').map_or(rest, |r| r.1).to_string(),
                    None => name.to_string(),
                }
            }
        };
        let layout = w.layout();
        let kernel =
            |rows: usize| match rill_kernels::product_kernel(w.ty, layout, w.activations, rows) {
                Ok(k) => format!("{} ({:?})", k.name, k.level),
                Err(e) => format!("none ({e})"),
            };
        let key = (
            format!(
                "{}, {}, {}",
                w.ty,
                layout_name(layout),
                activations_name(w.activations)
            ),
            kernel(512),
            kernel(1),
        );
        match kinds.iter_mut().find(|(k, _)| *k == key) {
            Some((_, roles)) if roles.contains(&role) => {}
            Some((_, roles)) => roles.push(role),
            None => kinds.push((key, vec![role])),
        }
    }
    println!(
        "  kernels on this CPU's fast path ({}):",
        rill_engine::kernel_paths()
    );
    for ((rows, prompt, decode), roles) in kinds {
        println!("    {}: {rows}", roles.join(", "));
        if prompt == decode {
            println!("      prompt and decoding: {prompt}");
        } else {
            println!("      prompt: {prompt}; decoding: {decode}");
        }
    }
}

pub fn main(args: Args) -> Result<()> {
    let opts = rill_fetch::FetchOptions {
        progress: true,
        ..Default::default()
    };
    let spec = args
        .model
        .or(args.model_flag)
        .unwrap_or_else(|| super::DEFAULT_MODEL.to_string());
    let path = rill_fetch::resolve(&spec, &opts)?;
    let file = GgufFile::open(&path)?;
    println!(
        "file: {} ({}, GGUF v{})",
        path.display(),
        human_bytes(file.file_len()),
        file.version()
    );
    println!("\nmetadata ({} entries):", file.metadata().len());
    for (key, value) in file.metadata().iter() {
        // Keys and names come from the file: escaped, so they cannot drive the terminal.
        println!(
            "  {:<44} {}",
            key.escape_debug().to_string(),
            show_value(value)
        );
    }

    println!("\ntensors ({}):", file.tensors().len());
    println!(
        "  {:<36} {:<6} {:>18} {:>12}",
        "name", "type", "shape", "bytes"
    );
    let mut by_type: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    for t in file.tensors() {
        let e = by_type.entry(t.ggml_type.name()).or_default();
        e.0 += 1;
        e.1 += t.size;
        let in_later_layer = t.name.starts_with("blk.") && !t.name.starts_with("blk.0.");
        if args.all_tensors || !in_later_layer {
            let shape: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
            println!(
                "  {:<36} {:<6} {:>18} {:>12}",
                t.name,
                t.ggml_type.name(),
                shape.join(" x "),
                t.size
            );
        }
    }
    if !args.all_tensors {
        println!("  (blk.1 .. are like blk.0; --all-tensors lists them)");
    }
    let types: Vec<String> = by_type
        .iter()
        .map(|(ty, (n, bytes))| format!("{ty}: {n} tensors, {}", human_bytes(*bytes)))
        .collect();
    println!("  by type: {}", types.join("; "));

    match ModelConfig::from_file(&file) {
        Err(e) => println!("\nmodel: rill cannot run this file: {e}"),
        Ok(cfg) => {
            println!("\nmodel: {} ({} layers, d_model {}, {} heads / {} KV heads of {}, FFN {}, vocab {}, context {})",
                cfg.architecture.name(), cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                cfg.ffn_dim, cfg.vocab_size, cfg.context_length);
            println!("  traits: {}", cfg.traits().join(", "));
            if let Some(w) = cfg.sliding_window {
                let n_sliding = cfg.layer_is_sliding.iter().filter(|s| **s).count();
                println!(
                    "  sliding window {w} on {n_sliding} of {} layers",
                    cfg.n_layers
                );
            }
            match Model::from_file(file, 1) {
                Err(e) => println!("  rill cannot load it: {e}"),
                Ok(model) => {
                    let c = model.cost();
                    println!(
                        "  parameters:                 {:.1} M",
                        c.parameters as f64 / 1e6
                    );
                    println!("  FLOPs per token:            {:.1} M (+{} per cached position for attention)",
                        c.flops_per_token as f64 / 1e6, c.attention_flops_per_position);
                    println!(
                        "  weight bytes read per token: {} (output head {})",
                        human_bytes(c.weight_bytes_per_token),
                        match model.weights().has_output_head {
                            true => human_bytes(model.weights().output.bytes() as u64),
                            false => "none: an encoder".into(),
                        }
                    );
                    let recurrent = rill_model::RecurrentShape::of(&cfg);
                    let layout = model.kv_layout();
                    let kv_layers = layout.n_storing();
                    let per_type: Vec<String> = KvDtype::ALL
                        .iter()
                        .filter(|t| t.fits_head_dim(layout.max_head_dim()))
                        .map(|&t| {
                            let bytes = layout.bytes_per_token(KvTypes::from(t), |_| true);
                            format!("{} ({t})", human_bytes(bytes as u64))
                        })
                        .collect();
                    println!(
                        "  KV cache per token:         {} ({kv_layers} attention layers)",
                        per_type.join(", ")
                    );
                    if layout.n_storing()
                        < cfg
                            .layer_kinds
                            .iter()
                            .filter(|&&k| k == rill_model::LayerKind::Attention)
                            .count()
                        || cfg
                            .layer_attention
                            .iter()
                            .any(|a| a.head_dim != cfg.head_dim)
                    {
                        println!("  KV layout:                  {layout}");
                    }
                    if let Some(shape) = &recurrent {
                        println!(
                            "  recurrent state:            {} per sequence in {} layers (f32, fixed: it does not grow with the text), \
                             held twice (the state and a snapshot at the last block boundary, for rollbacks and the prefix cache)",
                            human_bytes(shape.state_bytes() as u64),
                            shape.n_recurrent(),
                        );
                    }
                    let f16 = KvTypes::from(KvDtype::F16);
                    if let Some(w) = rill_model::SlidingWindow::of(&cfg) {
                        let in_window = |l: usize| w.layers.get(l) == Some(&true);
                        let stores = |l: usize| layout.stores(l);
                        let global = (0..cfg.n_layers)
                            .filter(|&l| stores(l) && !in_window(l))
                            .count();
                        let windowed = (0..cfg.n_layers)
                            .filter(|&l| stores(l) && in_window(l))
                            .count();
                        let held = (w.size.div_ceil(16) + 2) * 16;
                        println!(
                            "  with the window cache:      {} per token of context (its {global} global layers), \
                             and at most {} per sequence for the {windowed} window layers ({held} positions; f16)",
                            human_bytes(layout.bytes_per_token(f16, |l| !in_window(l)) as u64),
                            human_bytes((layout.bytes_per_token(f16, in_window) * held) as u64),
                        );
                    }
                    // As `rill serve --kv-cache-mb 1024` splits it, with its other defaults.
                    let serve = rill_engine::ServeConfig {
                        kv_cache_bytes: 1 << 30,
                        ..Default::default()
                    };
                    let held = rill_engine::kv_capacity(&cfg, f16, &serve);
                    println!(
                        "  at f16, 1 GiB of KV cache holds {} positions of context, or {} conversations of {} tokens at once",
                        held.positions,
                        held.conversations,
                        rill_engine::KV_SPLIT_CONVERSATION_TOKENS,
                    );
                    print_kernels(&model);
                }
            }
        }
    }
    Ok(())
}
