//! The glass-box web page: plain HTML, CSS and JavaScript modules built into the binary (see
//! `build.rs`), served at `/` with no build step and nothing fetched from elsewhere. With
//! [`crate::ServerOptions::web_dir`] the files are read from that folder instead, at every
//! request.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::state::State;

include!(concat!(env!("OUT_DIR"), "/web_assets.rs"));

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("json") => "application/json",
        _ => "application/octet-stream",
    }
}

/// `GET /`: the page.
pub(crate) async fn index(
    axum::extract::State(state): axum::extract::State<std::sync::Arc<State>>,
) -> Response {
    match file(&state, "/index.html").await {
        Some(r) => r,
        None => (
            StatusCode::NOT_FOUND,
            "the web page is not built into this binary",
        )
            .into_response(),
    }
}

/// The file at URL `path`, if the page has one.
pub(crate) async fn file(state: &State, path: &str) -> Option<Response> {
    let bytes: Vec<u8> = match &state.options.web_dir {
        Some(dir) => {
            // Only the page's own two folders, and no way out of them.
            let rel = path.strip_prefix('/')?;
            let parts: Vec<&str> = rel.split('/').collect();
            let ok = match parts.as_slice() {
                [name] | ["js", name] => {
                    !name.is_empty() && !name.starts_with('.') && !name.contains('\\')
                }
                _ => false,
            };
            if !ok {
                return None;
            }
            let full = dir.join(rel);
            tokio::task::spawn_blocking(move || std::fs::read(full))
                .await
                .ok()?
                .ok()?
        }
        None => ASSETS
            .iter()
            .find(|(url, _)| *url == path)
            .map(|(_, b)| b.to_vec())?,
    };
    Some(
        (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(content_type(path)),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                (
                    header::HeaderName::from_static("x-content-type-options"),
                    HeaderValue::from_static("nosniff"),
                ),
            ],
            bytes,
        )
            .into_response(),
    )
}
