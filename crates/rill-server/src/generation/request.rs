//! What every endpoint does with an HTTP request before the engine sees it: the body read as
//! a JSON object (within the size limit), the engine's handle (503 while loading or shutting
//! down), the `model` checked against the served names, and CPU work run off the async threads.

use axum::body::Body;
use axum::http::StatusCode;
use futures::StreamExt;
use rill_engine::serve::{ModelInfo, ServeHandle};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::fields::Fields;
use crate::state::State;

pub(crate) fn unix_time() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn request_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", crate::params::random_seed())
}

/// Reads a body of at most `limit` bytes and parses it as a JSON object.
pub(crate) async fn read_json(body: Body, limit: usize) -> Result<Map<String, Value>, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("The request body is larger than the limit of {limit} bytes"),
        )
        .with_code("request_too_large")
    };
    let mut bytes = Vec::new();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::invalid(format!("cannot read the request body: {e}")).with_code("bad_body")
        })?;
        if bytes.len() + chunk.len() > limit {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(
            ApiError::invalid("The request body is empty: send a JSON object")
                .with_code("invalid_json"),
        );
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ApiError::invalid(format!(
            "The request body must be a JSON object, got {}",
            crate::error::json_type(&other)
        ))
        .with_code("invalid_json")),
        Err(e) => Err(ApiError::invalid(format!(
            "We could not parse the JSON body of your request: {e}"
        ))
        .with_code("invalid_json")),
    }
}

/// What every JSON endpoint starts with: the engine's handle (503 while loading or shutting
/// down), the body as a JSON object, and its `model` checked against the served one.
pub(crate) async fn open_request(
    state: &State,
    body: Body,
) -> Result<(ServeHandle, Map<String, Value>, ModelInfo), ApiError> {
    let handle = state.handle()?;
    let map = read_json(body, state.options.max_body_bytes).await?;
    let info = handle.model_info();
    check_model(state, &Fields::new(&map), &info.name)?;
    Ok((handle, map, info))
}

/// Checks a request's `model` (absent or one of the served names); returns the served name.
pub(crate) fn check_model(state: &State, f: &Fields<'_>, served: &str) -> Result<(), ApiError> {
    let Some(name) = f.str("model")? else {
        return Ok(());
    };
    if name.is_empty()
        || state.options.accept_any_model
        || crate::options::MODEL_PLACEHOLDERS.contains(&name)
        || state.serves(name, served)
    {
        Ok(())
    } else {
        Err(ApiError::model_not_found(name, served))
    }
}

/// Runs CPU work (tokenization, templates) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("internal error: {e}"),
        ))
    })
}
