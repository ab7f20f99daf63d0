//! The routes, the middleware (API key, response counting), reading bodies as JSON with
//! OpenAI-shaped errors, and the small endpoints: models, tokenize, detokenize, health, metrics.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, Path, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use rill_tokenizer::Tokenizer;
use serde_json::{json, Value};

use crate::dialects::{anthropic, ollama, openai, responses};
use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generation::prompt::{chat_tokens, parse_messages, token_repr};
use crate::generation::request::{blocking, open_request};
use crate::glass::{choosing, layers, live, model, multiverse, receipts};
use crate::params::token_list;
use crate::state::State;
use crate::web;

type AppState = Arc<State>;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/api/version", get(ollama::version))
        .route("/api/tags", get(ollama::tags))
        .route("/api/ps", get(ollama::ps))
        .route("/api/show", post(ollama::show))
        .route("/api/chat", post(ollama::chat))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/v1/embeddings", post(openai::embeddings::embeddings))
        .route("/api/generate", post(ollama::generate))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/v1/completions/render", post(openai::render::completions))
        .route("/v1/chat/completions/render", post(openai::render::chat))
        .route("/server_info", get(openai::render::server_info))
        .route("/get_server_info", get(openai::render::server_info))
        .route("/model_info", get(openai::render::model_info))
        .route("/get_model_info", get(openai::render::model_info))
        .route("/metrics", get(metrics))
        .route("/v1/rill/distribution", post(choosing::distribution))
        .route("/v1/rill/beam", post(choosing::beam))
        .route("/v1/rill/lens", post(layers::lens))
        .route("/v1/rill/counterfactual", post(layers::counterfactual))
        .route("/v1/rill/receipts/{id}", get(receipts::get))
        .route("/v1/rill/replay", post(receipts::replay))
        .route("/v1/rill/server", get(live::server))
        .route("/v1/rill/multiverse", post(multiverse::multiverse))
        .route("/v1/rill/speculative", post(choosing::speculative))
        .route("/v1/rill/model", get(model::model))
        .route("/", get(web::index))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Whether `path` needs the API key (everything but `/health`).
fn protected(path: &str) -> bool {
    path.starts_with("/v1/")
        || path.starts_with("/api/")
        || matches!(
            path,
            "/tokenize"
                | "/detokenize"
                | "/metrics"
                | "/server_info"
                | "/get_server_info"
                | "/model_info"
                | "/get_model_info"
        )
}

/// Checks the API key, then counts the response by route and status.
async fn guard(
    axum::extract::State(state): axum::extract::State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = std::time::Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_string();
    let note = crate::request_log::GenerationNote::default();
    request.extensions_mut().insert(note.clone());
    // What the request's log line needs of the request (nothing when nothing is logged).
    let line_of = state.options.request_log.as_ref().map(|_| {
        let client = (request.extensions())
            .get::<crate::request_log::ClientAddr>()
            .map(|c| c.0);
        let what = (
            request.method().to_string(),
            request.uri().path().to_string(),
        );
        (what, client)
    });
    let response = match &state.options.api_key {
        Some(key) if protected(request.uri().path()) => match api_key(&request) {
            Some(given) if constant_time_eq(given.as_bytes(), key.as_bytes()) => {
                next.run(request).await
            }
            Some(_) => unauthorized(request.uri().path(), "Incorrect API key provided"),
            None => unauthorized(
                request.uri().path(),
                "Missing API key: pass it in the Authorization header as 'Bearer KEY' (or in \
                 x-api-key)",
            ),
        },
        _ => next.run(request).await,
    };
    state.metrics.count(&route, response.status().as_u16());
    let mut response = response;
    if let Some(value) = &state.replica_header {
        response.headers_mut().insert(REPLICA_HEADER, value.clone());
    }
    match (&state.options.request_log, line_of) {
        (Some(log), Some((what, client))) => {
            let status = response.status().as_u16();
            let record =
                crate::request_log::Record::new(log.clone(), what, status, client, started, note);
            response.map(|body| Body::new(crate::request_log::LoggedBody::new(body, record)))
        }
        _ => response,
    }
}

/// The response header naming the replica that answered (behind a router).
pub(crate) const REPLICA_HEADER: &str = "x-rill-replica";

/// The key a request gives: `Authorization: Bearer KEY` (OpenAI's clients), or `x-api-key: KEY`
/// (Anthropic's).
fn api_key(request: &Request) -> Option<&str> {
    let bearer = || {
        let value = request
            .headers()
            .get(header::AUTHORIZATION)?
            .to_str()
            .ok()?;
        let (scheme, token) = value.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    };
    bearer().or_else(|| {
        let value = request.headers().get("x-api-key")?.to_str().ok()?;
        Some(value.trim())
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 401 in the shape of the dialect `path` belongs to.
fn unauthorized(path: &str, message: &str) -> Response {
    let e = ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
        .with_code("invalid_api_key");
    if path.starts_with("/v1/messages") {
        anthropic::error_response(e)
    } else if path.starts_with("/api/") {
        ollama::error_response(e)
    } else {
        e.into_response()
    }
}

/// The web page's files, else an OpenAI-shaped 404.
async fn fallback(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: Request,
) -> Response {
    if request.method() == axum::http::Method::GET || request.method() == axum::http::Method::HEAD {
        if let Some(r) = web::file(&state, request.uri().path()).await {
            return r;
        }
    }
    not_found(request).await.into_response()
}

async fn not_found(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!(
            "Unknown request URL: {} {}",
            request.method(),
            request.uri().path()
        ),
    )
    .with_code("unknown_url")
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!(
            "Method {} is not allowed for {}",
            request.method(),
            request.uri().path()
        ),
    )
    .with_code("method_not_allowed")
}

fn model_object(state: &State, name: &str, context: usize) -> Value {
    json!({
        "id": name,
        "object": "model",
        "created": state.created.load(std::sync::atomic::Ordering::Relaxed),
        "owned_by": "rill",
        "max_model_len": context,
    })
}

async fn models(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    match state.handle() {
        Ok(h) => {
            let info = h.model_info();
            json_body(&json!({
                "object": "list",
                "data": [model_object(&state, &info.name, info.context)],
            }))
        }
        Err(e) => e.into_response(),
    }
}

async fn model(
    axum::extract::State(state): axum::extract::State<AppState>,
    Path(id): Path<String>,
) -> Response {
    match state.handle() {
        Ok(h) => {
            let info = h.model_info();
            if state.serves(&id, &info.name) {
                json_body(&model_object(&state, &info.name, info.context))
            } else {
                ApiError::model_not_found(&id, &info.name).into_response()
            }
        }
        Err(e) => e.into_response(),
    }
}

async fn tokenize(
    axum::extract::State(state): axum::extract::State<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let add_special = f.bool("add_special")?;
    let tokenizer = handle.tokenizer();
    let tokens = if f.get("messages").is_some() {
        if f.get("prompt").is_some() {
            return Err(ApiError::param(
                "prompt",
                "give either 'prompt' or 'messages', not both",
            ));
        }
        let messages = parse_messages(&f)?;
        let agp = f.bool("add_generation_prompt")?.unwrap_or(true);
        let add_special = add_special.unwrap_or(true);
        blocking(move || chat_tokens(&tokenizer, &messages, agp, add_special)).await?
    } else {
        let prompt = f
            .str("prompt")?
            .ok_or_else(|| ApiError::missing("prompt"))?
            .to_string();
        let add_special = add_special.unwrap_or(true);
        blocking(move || Ok(tokenizer.encode_with_special(&prompt, add_special, true))).await?
    };
    Ok(json_body(&json!({
        "count": tokens.len(),
        "max_model_len": info.context,
        "tokens": tokens,
    })))
}

async fn detokenize(
    axum::extract::State(state): axum::extract::State<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let tokens = token_list(
        "tokens",
        f.get("tokens").ok_or_else(|| ApiError::missing("tokens"))?,
        info.vocab_size,
        usize::MAX,
    )?;
    let pieces = f.bool("pieces")?.unwrap_or(false);
    let tokenizer: Arc<Tokenizer> = handle.tokenizer();
    let body = blocking(move || {
        let mut body = json!({ "prompt": tokenizer.decode(&tokens) });
        // rill's extension: each token as the model sees it (the tokenization tier).
        if pieces {
            body["pieces"] = tokens
                .iter()
                .map(|&id| {
                    let (text, bytes) = token_repr(&tokenizer, id);
                    json!({ "token": id, "text": text, "bytes": bytes, "special": tokenizer.is_control(id) })
                })
                .collect();
        }
        Ok(body)
    })
    .await?;
    Ok(json_body(&body))
}

/// Liveness: 200 while the process lives, whatever it is doing (loading, serving, draining);
/// `status` says which, and the KV cache's blocks once a model is served.
async fn health(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    let phase = state.phase();
    let mut body = json!({ "status": phase });
    if let Some(h) = state.current_handle() {
        let kv = h.kv_stats();
        body["model"] = json!(h.model_info().name);
        body["requests_in_flight"] = json!(h.in_flight());
        body["kv_cache"] = json!({
            "blocks_total": kv.blocks_total,
            "blocks_used": kv.blocks_used,
            "blocks_cached_free": kv.blocks_cached_free,
            "block_size": kv.block_size,
        });
    }
    json_body(&body)
}

/// Readiness: 200 once the model is served, 503 while it loads and again from the start of a
/// drain (a router or load balancer stops sending requests here).
async fn ready(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    match state.handle() {
        Ok(_) => json_body(&json!({ "status": "ready" })),
        Err(e) => {
            let mut body = e.body();
            body["status"] = json!(state.phase());
            let mut r = (e.status, json_body(&body)).into_response();
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(1u64));
            r
        }
    }
}

async fn metrics(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    let mut text = state
        .current_handle()
        .map_or_else(String::new, |h| h.render_prometheus());
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    state.metrics.render(&mut text);
    if state.options.metrics_compat == crate::options::MetricsCompat::Vllm {
        if let Some(h) = state.current_handle() {
            text.push_str(&h.render_prometheus_vllm());
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}
