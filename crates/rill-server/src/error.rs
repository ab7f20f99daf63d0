//! Errors as OpenAI shapes them: a status code and
//! `{"error": {"message", "type", "param", "code"}}`, for every failure the server reports.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error response.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`invalid_value`, `model_not_found`, ...).
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header (429, 503).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault, with code `invalid_value`.
    pub fn param(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::invalid(message)
            .with_param(param)
            .with_code("invalid_value")
    }

    /// 400: the field has the wrong JSON type.
    pub fn wrong_type(param: &str, expected: &str, got: &serde_json::Value) -> ApiError {
        ApiError::invalid(format!(
            "'{param}' must be {expected}, got {}",
            json_type(got)
        ))
        .with_param(param)
        .with_code("invalid_type")
    }

    /// 400: a required field is absent.
    pub fn missing(param: &str) -> ApiError {
        ApiError::invalid(format!("'{param}' is required"))
            .with_param(param)
            .with_code("missing_required_parameter")
    }

    /// 404 for a model that is not served.
    pub fn model_not_found(name: &str, served: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("The model `{name}` does not exist: this server serves `{served}`"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 503 while the model loads or the server shuts down.
    pub fn unavailable(message: impl Into<String>, code: &'static str) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
            .with_code(code)
            .with_retry_after(1)
    }

    pub fn with_param(mut self, param: impl Into<String>) -> ApiError {
        self.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn with_retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    /// The JSON body: `{"error": {...}}`.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, json_body(&self.body())).into_response();
        if let Some(s) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A JSON response body with its content type.
pub(crate) fn json_body(value: &serde_json::Value) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
        .into_response()
}

/// The JSON type of a value, as an error message names it.
pub(crate) fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A job of the engine loop that never ran: the loop ended first.
pub(crate) fn job_dropped() -> ApiError {
    ApiError::unavailable("the server shut down before the job ran", "shutting_down")
}

/// The engine could not finish a request: out of KV-cache room (503, retry later) or an
/// internal failure (500).
pub(crate) fn generation_failed(message: String) -> ApiError {
    if message.starts_with("KV cache") {
        ApiError::unavailable(format!("generation failed: {message}"), "kv_cache_full")
    } else {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("generation failed: {message}"),
        )
    }
}
