//! rill's HTTP server: OpenAI's `/v1/completions`, `/v1/chat/completions` and `/v1/models`, plus
//! `/tokenize`, `/detokenize`, `/health` and `/metrics`, over the continuous-batching engine loop
//! ([`rill_engine::serve`]).
//!
//! Every failure is an OpenAI-shaped JSON error (`{"error": {"message", "type", "param",
//! "code"}}`): malformed JSON, wrong types and values out of range (400, naming the field and
//! what it accepts), a wrong API key (401), an unknown model or route (404), a body over the
//! limit (413), a full queue (429 with `Retry-After`), a model still loading or a server
//! shutting down (503). A streamed response ends with a final event even when the server shuts
//! down; a client that goes away drops its request's stream, which cancels the request.
//!
//! ```no_run
//! # async fn demo(handle: rill_engine::serve::ServeHandle) -> std::io::Result<()> {
//! let server = rill_server::Server::new(rill_server::ServerOptions::default());
//! server.set_ready(handle);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! server.run(listener, rill_server::shutdown_signal()).await
//! # }
//! ```

mod error;
mod fields;
mod generate;
mod glass;
pub mod kv_events;
mod layers;
mod live;
mod metrics;
mod multiverse;
mod params;
mod receipts;
mod render;
mod request_log;
mod routes;
mod structured;
mod tools;
mod web;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rill_engine::serve::ServeHandle;

pub use error::ApiError;
pub use params::{MAX_N, MAX_STOP_BYTES, MAX_STOP_STRINGS};
pub use request_log::{RequestLog, RequestLogFormat};

/// The default limit on a request body: 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// How long the server waits for connections to close once every request has ended.
const CONNECTION_GRACE: Duration = Duration::from_secs(5);

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

/// What every handler shares.
pub(crate) struct State {
    pub options: ServerOptions,
    handle: RwLock<Option<ServeHandle>>,
    /// Not ready any more: new requests get 503 while the running ones finish.
    draining: AtomicBool,
    shutting_down: AtomicBool,
    pub metrics: metrics::HttpMetrics,
    /// [`ServerOptions::model_aliases`] and those added since.
    aliases: RwLock<Vec<String>>,
    /// Unix time the model became ready (`created` of `/v1/models`).
    pub created: std::sync::atomic::AtomicU64,
    /// The `x-rill-replica` header's value ([`ServerOptions::replica_id`]).
    replica_header: Option<axum::http::HeaderValue>,
    /// Compiles structured-output constraints for the served vocabulary (built on first use).
    constrainer: std::sync::Mutex<Option<std::sync::Arc<rill_constrain::Constrainer>>>,
    /// The newest responses' reproducibility receipts.
    receipts: receipts::Receipts,
    /// The served model file's hash, computed when a receipt first needs it.
    model_identity: tokio::sync::OnceCell<rill_engine::ModelIdentity>,
    /// The served model file's path, for receipts ([`Server::set_model_path`]).
    model_path: RwLock<Option<String>>,
}

impl State {
    /// The constraint compiler of the served model's vocabulary: built by the first request
    /// that asks for structured output (a walk over the vocabulary), then shared.
    pub(crate) fn constrainer(
        &self,
        tokenizer: std::sync::Arc<rill_tokenizer::Tokenizer>,
    ) -> Result<std::sync::Arc<rill_constrain::Constrainer>, rill_constrain::ConstraintError> {
        let mut slot = self.constrainer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = std::sync::Arc::new(rill_constrain::Constrainer::with_limits(
            tokenizer,
            self.options.constraint_limits,
        )?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// The engine's handle, or 503 while the model loads or the server shuts down.
    pub(crate) fn handle(&self) -> Result<ServeHandle, ApiError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable(
                "the server is shutting down",
                "shutting_down",
            ));
        }
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable(
                "the server is draining before it stops: send the request to another replica",
                "draining",
            ));
        }
        match self
            .handle
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(h) => Ok(h.clone()),
            None => Err(ApiError::unavailable(
                "the model is still loading",
                "model_loading",
            )),
        }
    }

    /// Whether `/health` should say the server is draining, shutting down or loading.
    pub(crate) fn phase(&self) -> &'static str {
        if self.shutting_down.load(Ordering::SeqCst) {
            "shutting_down"
        } else if self.draining.load(Ordering::SeqCst) {
            "draining"
        } else if self.current_handle().is_none() {
            "loading"
        } else {
            "ok"
        }
    }

    /// Whether requests may name the model `name` (its own name or an alias).
    pub(crate) fn serves(&self, name: &str, served: &str) -> bool {
        name == served
            || self
                .aliases
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|a| a == name)
    }

    pub(crate) fn model_path(&self) -> Option<String> {
        self.model_path
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn current_handle(&self) -> Option<ServeHandle> {
        self.handle
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The HTTP server. Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct Server {
    state: Arc<State>,
}

impl Server {
    /// A server with no model yet: `/health` answers 503 and the other endpoints 503 too until
    /// [`Server::set_ready`].
    pub fn new(options: ServerOptions) -> Server {
        Server {
            state: Arc::new(State {
                aliases: RwLock::new(options.model_aliases.clone()),
                replica_header: options
                    .replica_id
                    .as_deref()
                    .and_then(|id| axum::http::HeaderValue::from_str(id).ok()),
                options,
                handle: RwLock::new(None),
                draining: AtomicBool::new(false),
                shutting_down: AtomicBool::new(false),
                metrics: metrics::HttpMetrics::default(),
                created: std::sync::atomic::AtomicU64::new(0),
                constrainer: std::sync::Mutex::new(None),
                receipts: Default::default(),
                model_identity: tokio::sync::OnceCell::new(),
                model_path: RwLock::new(None),
            }),
        }
    }

    /// Names the served model file in receipts (so `rill replay` finds it without `--model`).
    pub fn set_model_path(&self, path: &std::path::Path) {
        *self
            .state
            .model_path
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Some(path.display().to_string());
    }

    /// The model is loaded and its engine loop runs: requests are served from now on.
    pub fn set_ready(&self, handle: ServeHandle) {
        self.state
            .created
            .store(generate::unix_time(), Ordering::Relaxed);
        *self.state.handle.write().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// Lets requests name the model `alias` too.
    pub fn add_model_alias(&self, alias: impl Into<String>) {
        let alias = alias.into();
        let mut a = self
            .state
            .aliases
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if !a.contains(&alias) {
            a.push(alias);
        }
    }

    /// Whether a model is being served.
    pub fn is_ready(&self) -> bool {
        self.state.current_handle().is_some()
    }

    /// Whether the server is ready for requests (`/ready` answers 200): a model is served and
    /// no drain or shutdown has begun.
    pub fn is_accepting(&self) -> bool {
        self.state.phase() == "ok"
    }

    /// Drains: `/ready` and new requests get 503 from now on, while the requests in flight run
    /// to their end, for at most [`ServerOptions::shutdown_timeout`]. Returns how many were
    /// still running when the time ran out (0: all finished); [`Server::begin_shutdown`] ends
    /// those.
    pub async fn drain(&self) -> usize {
        self.state.draining.store(true, Ordering::SeqCst);
        let Some(handle) = self.state.current_handle() else {
            return 0;
        };
        handle.drain();
        let deadline = tokio::time::Instant::now() + self.state.options.shutdown_timeout;
        loop {
            let left = handle.in_flight();
            let now = tokio::time::Instant::now();
            if left == 0 || now >= deadline {
                return left;
            }
            // Polled: a drain is rare and a few milliseconds late is fine.
            tokio::time::sleep((deadline - now).min(Duration::from_millis(20))).await;
        }
    }

    /// Stops taking requests (503 from now on) and asks the engine loop to end the running ones
    /// (their streams end with a final event).
    pub fn begin_shutdown(&self) {
        self.state.shutting_down.store(true, Ordering::SeqCst);
        if let Some(h) = self.state.current_handle() {
            h.shutdown();
        }
    }

    /// The routes, with authentication, request counting and JSON fallbacks.
    pub fn router(&self) -> axum::Router {
        routes::router(self.state.clone())
    }

    /// Serves on `listener` until `shutdown` completes, then drains ([`Server::drain`]: new
    /// requests get 503 while running ones finish, for at most
    /// [`ServerOptions::shutdown_timeout`]), ends what still runs with a final event, and
    /// returns once every connection is closed (or a few seconds later).
    pub async fn run(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let this = self.clone();
        let signal = async move {
            shutdown.await;
            // Connections are still accepted while draining, to be answered 503 (a router's
            // health check must see the replica go unready).
            this.drain().await;
            // The engine's shutdown waits for its loop to finish a step: not on an async thread.
            let _ = tokio::task::spawn_blocking(move || this.begin_shutdown()).await;
            let _ = tx.send(());
        };
        let trimmer = tokio::spawn(return_free_memory(self.state.clone()));
        let result = serve_connections(
            listener,
            self.router(),
            self.state.options.header_read_timeout,
            signal,
        )
        .await;
        let _ = rx.await;
        trimmer.abort();
        result
    }
}

impl Server {
    /// Serves on a free loopback port from a thread of its own, with a runtime of
    /// `worker_threads`, until the process exits; returns the bound address. For tests and
    /// tools that need a server beside synchronous code.
    pub fn serve_in_background(
        &self,
        worker_threads: usize,
    ) -> std::io::Result<std::net::SocketAddr> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.max(1))
            .enable_all()
            .build()?;
        let this = self.clone();
        std::thread::Builder::new()
            .name("rill-server".into())
            .spawn(move || {
                runtime.block_on(async move {
                    if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                        let _ = this.run(listener, std::future::pending::<()>()).await;
                    }
                })
            })?;
        Ok(addr)
    }
}

/// Accepts connections and serves each (HTTP/1.1) until `shutdown` completes, then waits up to
/// [`CONNECTION_GRACE`] for open connections to finish. A client must send a request's headers
/// within `header_read_timeout` of starting them (or of connecting): slow-loris clients that
/// trickle headers, or connect and send nothing, are closed instead of held forever.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors and the like: wait a moment rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let (stream, client) = stream;
        let _ = stream.set_nodelay(true);
        // Each request knows its client (for the request log).
        let router = router
            .clone()
            .layer(axum::Extension(request_log::ClientAddr(client)));
        let service = hyper_util::service::TowerToHyperService::new(router);
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(CONNECTION_GRACE, graceful.shutdown()).await;
    Ok(())
}

/// Hands the heap's free pages back to the system once the server is idle after work: glibc
/// keeps what a burst of requests freed (in every thread's arena) as its high-water mark, so
/// without this a replica's resident memory after a load peak stays at the peak. Checked every
/// few seconds; trims only when engine steps ran since the last trim and nothing is in flight.
async fn return_free_memory(state: Arc<State>) {
    let mut trimmed_at_step = None;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let Some(handle) = state.current_handle() else {
            continue;
        };
        let step = handle.kv_stats().step;
        if handle.in_flight() > 0 || trimmed_at_step == Some(step) {
            continue;
        }
        trimmed_at_step = Some(step);
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
        let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
    }
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

/// Entry points for the fuzz targets (`fuzz/`): a request body taken through everything the
/// server reads and checks before it touches the model. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::fields::Fields;
    use crate::params::{parse_common, Endpoint};

    /// Parses and validates a chat-completions body as the server does; an `Err` is the
    /// message of the 400 the client would get.
    pub fn chat_body(body: &[u8], vocab_size: usize) -> Result<(), String> {
        let map = json_object(body)?;
        let f = Fields::new(&map);
        crate::generate::parse_messages(&f).map_err(|e| e.message)?;
        parse_common(&f, Endpoint::Chat, vocab_size).map_err(|e| e.message)?;
        crate::tools::parse(&f).map_err(|e| e.message)?;
        crate::structured::parse(&f).map_err(|e| e.message)?;
        Ok(())
    }

    /// The same for a completions body.
    pub fn completions_body(body: &[u8], vocab_size: usize) -> Result<(), String> {
        let map = json_object(body)?;
        let f = Fields::new(&map);
        crate::generate::parse_prompts(&f, vocab_size).map_err(|e| e.message)?;
        parse_common(&f, Endpoint::Completions, vocab_size).map_err(|e| e.message)?;
        crate::structured::parse(&f).map_err(|e| e.message)?;
        Ok(())
    }

    fn json_object(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, String> {
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(serde_json::Value::Object(m)) => Ok(m),
            Ok(_) => Err("not an object".into()),
            Err(e) => Err(e.to_string()),
        }
    }
}
