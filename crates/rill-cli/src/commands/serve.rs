//! `rill serve`: the OpenAI-compatible HTTP server. It listens at once (`/ready` answers 503
//! while the model is fetched and loaded), then serves every request through one
//! continuous-batching engine loop; the first SIGINT/SIGTERM drains it (running requests finish
//! for up to --shutdown-timeout, then end with a final event), a second exits at once.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use rill_engine::serve::{self, ServeConfig};
use rill_engine::Precision;
use rill_server::{Server, ServerOptions};

use super::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed on start).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// KV-cache size in MiB, shared by every request (default 512).
    #[arg(long, value_name = "N")]
    pub kv_cache_mb: Option<usize>,
    /// For a model with sliding-window layers (Gemma 2/3, gpt-oss, ...): MiB of the KV cache
    /// given to those layers, which keep only their window per sequence (default: room for
    /// about two windows per running sequence).
    #[arg(long, value_name = "N")]
    pub kv_window_cache_mb: Option<usize>,
    /// Most tokens (prompt chunks and decoded tokens) in one forward pass (default 512).
    #[arg(long, value_name = "N")]
    pub max_batch_tokens: Option<usize>,
    /// Most prompt tokens in a forward pass that also decodes other sequences' next tokens:
    /// bounds their inter-token latency while prompts are taken in (default 32; 0: only
    /// --max-batch-tokens bounds them).
    #[arg(long, value_name = "N")]
    pub max_prefill_rows: Option<usize>,
    /// Most sequences generating at once (default 64).
    #[arg(long, value_name = "N")]
    pub max_running: Option<usize>,
    /// Most requests waiting; more get 429 with Retry-After (default 256).
    #[arg(long, value_name = "N")]
    pub max_queue: Option<usize>,
    /// Per-request context: prompt plus max_tokens (default: the model's trained context,
    /// capped by what the KV cache holds).
    #[arg(short = 'c', long, value_name = "N")]
    pub ctx_size: Option<usize>,
    /// Require `Authorization: Bearer KEY` on /v1/*, /tokenize, /detokenize and /metrics.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Name of the model in /v1/models and responses (default: the --model argument for a
    /// built-in model, else the file's name without .gguf). More names after the first are
    /// aliases requests may use too (as vLLM's flag).
    #[arg(long, value_name = "NAME", num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Serve requests whatever `model` they name (for routers that fill in a name of their
    /// own). Without it, an absent or empty name and the placeholders "unknown" and "default"
    /// are served; other names than the served ones get 404.
    #[arg(long)]
    pub accept_any_model: bool,
    /// Seconds the first SIGTERM/SIGINT lets running requests finish (the drain: /ready and
    /// new requests get 503 meanwhile) before ending them with a final event and exiting; a
    /// second signal exits at once.
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    /// Seconds a client may take to send a request's headers (from connecting, or from the
    /// end of its previous request on a kept-alive connection); slower ones are disconnected.
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    pub header_read_timeout: f64,
    /// Names this replica in the x-rill-replica header of every response (default:
    /// HOSTNAME:PORT; empty: no header).
    #[arg(long, value_name = "ID")]
    pub replica_id: Option<String>,
    /// Also emit the metrics under another server's names: `vllm` adds the `vllm:*` metrics
    /// that routers (llm-d, the Gateway API Inference Extension, vLLM's production stack),
    /// KEDA examples and dashboards read.
    #[arg(long, value_name = "NAMES", default_value = "rill")]
    pub metrics_compat: MetricsCompatArg,
    /// Publish the prefix cache's changes (KV events) on a ZeroMQ PUB socket at this endpoint
    /// (e.g. tcp://*:5557), in vLLM's wire format, for prefix-aware routers (llm-d, Dynamo).
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events: Option<String>,
    /// The KV events' topic (default: kv@REPLICA-ID@MODEL, as llm-d parses it).
    #[arg(long, value_name = "TOPIC", requires = "kv_events")]
    pub kv_events_topic: Option<String>,
    /// Largest request body in MiB (larger ones get 413).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub max_body_mb: usize,
    /// Do not reuse the KV cache of identical prompt prefixes across requests.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Prompt lookup while decoding: most tokens drafted per step for a sequence whose last
    /// tokens occur earlier in its prompt or output, verified in the same pass (the output is
    /// plain decoding's; each sequence adapts its draft length, down to none where drafts fail).
    /// 0 turns it off. Default: 5.
    #[arg(long, value_name = "N")]
    pub prompt_lookup: Option<usize>,
    /// Compute with f32 activations and an f32 KV cache (the reference path; slower).
    #[arg(long)]
    pub exact: bool,
    /// Serve the web page (GET /) from this folder instead of the copy built into the binary:
    /// for working on crates/rill-server/web without rebuilding.
    #[arg(long, value_name = "DIR")]
    pub web_dir: Option<std::path::PathBuf>,
    /// Longest a request's structured-output constraint (JSON schema, regex, grammar) may take
    /// to compile; past it the request gets a 400. 0 refuses every constraint (structured
    /// output and tool calls switched off).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub constraint_timeout_ms: u64,
    /// Largest constraint grammar, in symbols (llguidance's grammar size); larger ones get a 400.
    #[arg(long, value_name = "N", default_value_t = 500_000)]
    pub constraint_max_size: usize,
    /// The per-request log line on stderr (method, path, status, client, time; for generations
    /// the model, prompt, cached and output tokens, time to first token, finish reasons):
    /// `text`, or `json` (one object per line).
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    pub log_format: LogFormatArg,
    /// No per-request log lines.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum MetricsCompatArg {
    Rill,
    Vllm,
}

/// This machine's name, for the default replica id.
fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Whether `id` can be sent as a header value (visible ASCII and spaces).
fn header_value_ok(id: &str) -> bool {
    id.bytes().all(|b| (0x20..0x7f).contains(&b))
}

/// The name a model is served under: a built-in name as typed, else the file's stem.
fn served_name(model: &str, path: &Path) -> String {
    if let Some(builtin) = rill_fetch::find_builtin(model) {
        builtin.name.to_string()
    } else {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| model.to_string())
    }
}

pub fn main(args: Args) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("rill-http")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = runtime.block_on(serve_main(args));
    // A model load still running (shutdown during loading) is not waited for.
    runtime.shutdown_timeout(Duration::from_millis(100));
    result
}

async fn serve_main(args: Args) -> Result<()> {
    let defaults = ServeConfig::default();
    let config = ServeConfig {
        kv_cache_bytes: args
            .kv_cache_mb
            .map_or(defaults.kv_cache_bytes, |mb| mb.saturating_mul(1 << 20)),
        kv_window_cache_bytes: args
            .kv_window_cache_mb
            .map_or(0, |mb| mb.saturating_mul(1 << 20)),
        max_batch_tokens: args.max_batch_tokens.unwrap_or(defaults.max_batch_tokens),
        max_prefill_rows_while_decoding: args
            .max_prefill_rows
            .unwrap_or(defaults.max_prefill_rows_while_decoding),
        max_running: args.max_running.unwrap_or(defaults.max_running),
        max_queue: args.max_queue.unwrap_or(defaults.max_queue),
        context: args.ctx_size.unwrap_or(defaults.context),
        prefix_caching: !args.no_prefix_caching,
        prompt_lookup_tokens: args.prompt_lookup.unwrap_or(defaults.prompt_lookup_tokens),
        prompt_lookup_measured: defaults.prompt_lookup_measured,
        model_name: String::new(),
        kv_events: args.kv_events.is_some(),
    };
    let mut aliases = vec![args.model.model.clone()];
    aliases.extend(args.served_model_name.iter().skip(1).cloned());
    if !(args.shutdown_timeout.is_finite() && args.shutdown_timeout >= 0.0) {
        anyhow::bail!(
            "--shutdown-timeout must be a number of seconds >= 0, got {}",
            args.shutdown_timeout
        );
    }
    if !(args.header_read_timeout.is_finite() && args.header_read_timeout > 0.0) {
        anyhow::bail!(
            "--header-read-timeout must be a number of seconds > 0, got {}",
            args.header_read_timeout
        );
    }
    // Flags are checked before the port is bound: a bad one is the only thing said.
    config.validate()?;
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let local = listener.local_addr()?;
    let replica_id = match &args.replica_id {
        Some(id) if id.is_empty() => None,
        Some(id) => Some(id.clone()),
        None => Some(format!("{}:{}", hostname(), local.port())),
    };
    if let Some(id) = &replica_id {
        if !header_value_ok(id) {
            anyhow::bail!("--replica-id {id:?} cannot be an HTTP header value (use visible ASCII)");
        }
    }
    let server = Server::new(ServerOptions {
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        max_body_bytes: args.max_body_mb.max(1).saturating_mul(1 << 20),
        model_aliases: aliases,
        shutdown_timeout: Duration::from_secs_f64(args.shutdown_timeout),
        header_read_timeout: Duration::from_secs_f64(args.header_read_timeout),
        replica_id: replica_id.clone(),
        accept_any_model: args.accept_any_model,
        metrics_compat: match args.metrics_compat {
            MetricsCompatArg::Rill => rill_server::MetricsCompat::Rill,
            MetricsCompatArg::Vllm => rill_server::MetricsCompat::Vllm,
        },
        web_dir: args.web_dir.clone(),
        request_log: (!args.quiet).then(|| rill_server::RequestLog {
            format: match args.log_format {
                LogFormatArg::Text => rill_server::RequestLogFormat::Text,
                LogFormatArg::Json => rill_server::RequestLogFormat::Json,
            },
            sink: std::sync::Arc::new(|line| eprintln!("{line}")),
        }),
        constraint_limits: rill_constrain::CompileLimits {
            timeout: std::time::Duration::from_millis(args.constraint_timeout_ms),
            max_grammar_size: args.constraint_max_size,
            ..rill_constrain::CompileLimits::default()
        },
    });
    eprintln!(
        "rill serve: listening on http://{local} (loading {}; /ready answers 503 until it is served)",
        args.model.model
    );

    let model_args = args.model.clone();
    let precision = if args.exact {
        Precision::Exact
    } else {
        Precision::Fast
    };
    let served_model_name = args.served_model_name.first().cloned();
    let loading = tokio::task::spawn_blocking(move || -> Result<_> {
        let path = model_args.path()?;
        let mut engine = rill_engine::Engine::load(&path, model_args.threads, precision)
            .with_context(|| format!("cannot load {}", path.display()))?;
        model_args.apply_kv_types(&mut engine.model, precision)?;
        let general_name = engine
            .model
            .file()
            .metadata()
            .get("general.name")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        let name = served_model_name.unwrap_or_else(|| served_name(&model_args.model, &path));
        let threads = engine.model.threads();
        let handle = serve::spawn(
            engine,
            ServeConfig {
                model_name: name,
                ..config
            },
        )
        .context("cannot start the engine loop")?;
        Ok((handle, path, general_name, threads))
    });

    // The first SIGINT/SIGTERM shuts down gracefully; a second one exits at once.
    let first_signal = std::sync::Arc::new(tokio::sync::Notify::new());
    let shutdown_timeout = args.shutdown_timeout;
    let notify = first_signal.clone();
    let shutdown = async move {
        rill_server::shutdown_signal().await;
        eprintln!(
            "rill serve: draining (not ready; running requests may finish for up to {} s; signal again to stop at once)",
            shutdown_timeout
        );
        notify.notify_one();
    };
    let forced = async move {
        first_signal.notified().await;
        rill_server::shutdown_signal().await;
    };
    let run = server.run(listener, shutdown);
    tokio::pin!(run);
    tokio::pin!(forced);
    let loaded = tokio::select! {
        r = &mut run => {
            // Shut down before the model was ready.
            return r.context("the server failed");
        }
        _ = &mut forced => return Ok(()),
        loaded = loading => loaded.context("the model loader failed")??,
    };
    let (handle, path, general_name, threads) = loaded;
    if let Some(g) = general_name {
        server.add_model_alias(g);
    }
    let info = handle.model_info();
    let kv = handle.kv_stats();
    let cfg = handle.config().clone();
    if let (Some(endpoint), Some(events)) = (&args.kv_events, handle.take_kv_events()) {
        let topic = args.kv_events_topic.clone().unwrap_or_else(|| {
            format!(
                "kv@{}@{}",
                replica_id
                    .clone()
                    .unwrap_or_else(|| format!("{}:{}", hostname(), local.port())),
                info.name
            )
        });
        let publisher = rill_server::kv_events::KvEventPublisher::bind(endpoint, topic.clone())
            .await
            .context("--kv-events")?;
        eprintln!(
            "rill serve: publishing KV events on {} (topic {topic})",
            publisher.endpoint()
        );
        tokio::spawn(publisher.run(events));
    }
    server.set_model_path(&path);
    server.set_ready(handle);
    eprintln!(
        "rill serve: ready on http://{local} (the glass-box page is at /): model {} ({}), context {} tokens, KV cache {} MiB \
         ({} blocks of {}{}), max {} running / {} queued / {} batch tokens, {} threads{}{}",
        info.name,
        path.display(),
        info.context,
        cfg.kv_cache_bytes >> 20,
        kv.blocks_total,
        kv.block_size,
        if kv.window_blocks_total > 0 {
            format!(
                "; its sliding-window layers {} blocks",
                kv.window_blocks_total
            )
        } else {
            String::new()
        },
        cfg.max_running,
        cfg.max_queue,
        cfg.max_batch_tokens,
        threads,
        if args.api_key.is_some() {
            ", API key required"
        } else {
            ""
        },
        if args.exact { ", exact" } else { "" },
    );
    tokio::select! {
        r = &mut run => r.context("the server failed")?,
        _ = &mut forced => {
            eprintln!("rill serve: forced to stop");
            return Ok(());
        }
    }
    eprintln!("rill serve: shut down");
    Ok(())
}
