//! How the server answers: [`ServerOptions`] and the constants it is bounded by.

use std::time::Duration;

use crate::request_log::RequestLog;

/// The default limit on a request body: 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// Names routers put in `model` when the client gave none (sglang-router sends `"unknown"`):
/// served as the one model, like an absent `model`.
pub const MODEL_PLACEHOLDERS: &[&str] = &["unknown", "default"];

/// Which metric names `/metrics` carries besides rill's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsCompat {
    /// rill's names only (`rill_*`).
    #[default]
    Rill,
    /// rill's and vLLM's (`vllm:*`, with a `model_name` label), as routers (the Gateway API
    /// Inference Extension's endpoint picker, llm-d, the production stack), KEDA examples and
    /// dashboards read them.
    Vllm,
}

/// How the server answers.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// When set, `/v1/*`, `/tokenize`, `/detokenize` and `/metrics` require
    /// `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Largest request body accepted (larger ones get 413).
    pub max_body_bytes: usize,
    /// Other names requests may give in `model` for the served model (e.g. the `--model`
    /// argument as typed); `/v1/models` lists the model's own name.
    pub model_aliases: Vec<String>,
    /// How long a drain (the first SIGTERM) lets running requests finish before ending them
    /// with a final event; meanwhile `/ready` and new requests get 503.
    pub shutdown_timeout: Duration,
    /// Names this replica in the `x-rill-replica` header of every response (None: no header).
    pub replica_id: Option<String>,
    /// Serve requests whatever `model` they name (for routers that fill in a name of their
    /// own); by default only the served names, an absent or empty one, or a router's
    /// placeholder ([`MODEL_PLACEHOLDERS`]) are served, and other names get 404.
    pub accept_any_model: bool,
    /// Longest a client may take to send a request's headers (from its first byte, or from
    /// connecting); slower ones are disconnected (slow-loris).
    pub header_read_timeout: Duration,
    /// Also emit the metrics under the names another server uses (`vllm:*`), for the routers,
    /// autoscalers and dashboards that hard-code them.
    pub metrics_compat: MetricsCompat,
    /// Serve the web page's files from this folder instead of the copies built into the binary
    /// (for working on the page without rebuilding).
    pub web_dir: Option<std::path::PathBuf>,
    /// Bounds on compiling a request's structured-output constraint (a JSON schema, regex or
    /// grammar): past them the request gets a 400.
    pub constraint_limits: rill_constrain::CompileLimits,
    /// One line per request (None: none).
    pub request_log: Option<RequestLog>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            api_key: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            model_aliases: Vec::new(),
            shutdown_timeout: Duration::from_secs(30),
            replica_id: None,
            accept_any_model: false,
            metrics_compat: MetricsCompat::Rill,
            header_read_timeout: Duration::from_secs(30),
            web_dir: None,
            constraint_limits: rill_constrain::CompileLimits::default(),
            request_log: None,
        }
    }
}
