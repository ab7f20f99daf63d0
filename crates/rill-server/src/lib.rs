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

// Layer 0, the foundation: what every request handler reads and reports.
mod error;
mod fields;
pub mod kv_events;
mod metrics;
mod options;
mod params;
mod request_log;
mod state;
mod stored_responses;
// Layer 1: the internal generation request and its output, which every dialect shares.
mod generation;
// Layer 2: the dialects (adapters from wire formats to the internal request and back) and the
// glass box's endpoints.
mod dialects;
mod glass;
// Layer 3: the routes.
mod routes;
mod web;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rill_engine::serve::ServeHandle;

pub use error::ApiError;
pub use options::{MetricsCompat, ServerOptions, DEFAULT_MAX_BODY_BYTES, MODEL_PLACEHOLDERS};
pub use params::{MAX_N, MAX_STOP_BYTES, MAX_STOP_STRINGS};
pub use request_log::{RequestLog, RequestLogFormat};

use state::State;

/// How long the server waits for connections to close once every request has ended.
const CONNECTION_GRACE: Duration = Duration::from_secs(5);

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
                responses: Default::default(),
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
            .store(generation::request::unix_time(), Ordering::Relaxed);
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
        crate::generation::prompt::parse_messages(&f).map_err(|e| e.message)?;
        parse_common(&f, Endpoint::Chat, vocab_size).map_err(|e| e.message)?;
        crate::generation::tools::parse(&f).map_err(|e| e.message)?;
        crate::generation::structured::parse(&f).map_err(|e| e.message)?;
        Ok(())
    }

    /// The same for a completions body.
    pub fn completions_body(body: &[u8], vocab_size: usize) -> Result<(), String> {
        let map = json_object(body)?;
        let f = Fields::new(&map);
        crate::generation::prompt::parse_prompts(&f, vocab_size).map_err(|e| e.message)?;
        parse_common(&f, Endpoint::Completions, vocab_size).map_err(|e| e.message)?;
        crate::generation::structured::parse(&f).map_err(|e| e.message)?;
        Ok(())
    }

    /// The same for an Anthropic Messages body.
    pub fn messages_body(body: &[u8]) -> Result<(), String> {
        let map = json_object(body)?;
        crate::dialects::anthropic::request::parse(&Fields::new(&map)).map_err(|e| e.message)?;
        Ok(())
    }

    /// The same for an OpenAI Responses body.
    pub fn responses_body(body: &[u8]) -> Result<(), String> {
        let map = json_object(body)?;
        crate::dialects::responses::request::parse(&Fields::new(&map)).map_err(|e| e.message)?;
        Ok(())
    }

    /// The same for an Ollama `/api/chat` body.
    pub fn ollama_chat_body(body: &[u8]) -> Result<(), String> {
        let map = json_object(body)?;
        crate::dialects::ollama::request::chat(&Fields::new(&map)).map_err(|e| e.message)?;
        Ok(())
    }

    /// The same for an Ollama `/api/generate` body.
    pub fn ollama_generate_body(body: &[u8]) -> Result<(), String> {
        let map = json_object(body)?;
        crate::dialects::ollama::request::generate(&Fields::new(&map)).map_err(|e| e.message)?;
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
