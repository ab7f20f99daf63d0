//! Delivering a job's output: whole (every event collected first) or streamed as server-sent
//! events, with the response's receipt header, and the metrics of clients that left early.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures::stream::SelectAll;
use futures::StreamExt;
use serde_json::Value;

use super::output::Output;
use crate::error::generation_failed;
use crate::error::{json_body, ApiError};
use crate::generation::deliver::Tracker;
use crate::generation::receipts::ReceiptDraft;
use crate::generation::submit::Events;
use crate::state::State;

type AppState = Arc<State>;

/// Collects every event and answers with the whole response.
pub(super) async fn collect(
    state: AppState,
    out: Output,
    mut events: Events,
) -> Result<Response, ApiError> {
    let mut out = out;
    let header = out.receipt.as_ref().map(ReceiptDraft::path);
    let mut tracker = Tracker::new(state.clone(), false);
    let result = async {
        while let Some((p, e)) = events.next().await {
            out.on_event(p, e, false)?;
            if out.enough_calls() {
                // Dropping the streams cancels the request.
                events = SelectAll::new();
                out.on_event(0, allowed_calls_made(), false)?;
            }
        }
        out.note_finish();
        if out.unfinished() {
            return Err(generation_failed(
                "the engine ended the request without finishing it".into(),
            ));
        }
        let mut response = json_body(&out.response());
        if let Some(path) = header.and_then(|p| HeaderValue::from_str(&p).ok()) {
            out.store_receipt(&state);
            response.headers_mut().insert(RECEIPT_HEADER, path);
        }
        Ok(response)
    }
    .await;
    tracker.finish();
    result
}

/// A streamed response's state.
struct Sse {
    out: Output,
    events: Events,
    queue: VecDeque<Bytes>,
    ended: bool,
    tracker: Tracker,
}

impl Sse {
    fn push(&mut self, v: &Value) {
        self.queue.push_back(Bytes::from(format!("data: {v}\n\n")));
    }

    /// The closing events: an error if the engine stopped early, usage, `[DONE]`.
    fn end(&mut self, error: Option<ApiError>) {
        // Dropping the streams cancels whatever still runs.
        self.events = SelectAll::new();
        self.out.note_finish();
        let error = error.or_else(|| {
            self.out.unfinished().then(|| {
                generation_failed("the engine ended the request without finishing it".into())
            })
        });
        match error {
            Some(e) => self.push(&e.body()),
            None => self.out.store_receipt(self.tracker.state()),
        }
        if self.out.include_usage {
            let mut v = self.out.chunk(Vec::new());
            v["usage"] = self.out.usage().json();
            self.push(&v);
        }
        self.queue
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.ended = true;
    }
}

/// Answers with server-sent events: one chunk per token, a final chunk per choice, usage when
/// asked for, then `[DONE]`. When the client goes away the body is dropped, and with it the
/// engine's streams, which cancels the request.
pub(super) fn sse(state: AppState, out: Output, events: Events) -> Response {
    let receipt = out
        .receipt
        .as_ref()
        .and_then(|d| HeaderValue::from_str(&d.path()).ok());
    let mut s = Sse {
        out,
        events,
        queue: VecDeque::new(),
        ended: false,
        tracker: Tracker::new(state, true),
    };
    for chunk in s.out.opening_chunks() {
        s.push(&chunk);
    }
    let body = futures::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(b) = s.queue.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if s.ended {
                s.tracker.finish();
                return None;
            }
            match s.events.next().await {
                Some((p, e)) => match s.out.on_event(p, e, true) {
                    Ok(chunk) => {
                        if let Some(chunk) = chunk {
                            s.push(&chunk);
                        }
                        for extra in std::mem::take(&mut s.out.extra) {
                            s.push(&extra);
                        }
                        if s.out.enough_calls() {
                            // Dropping the streams cancels the request.
                            s.events = SelectAll::new();
                            if let Ok(Some(chunk)) = s.out.on_event(0, allowed_calls_made(), true) {
                                s.push(&chunk);
                            }
                            for extra in std::mem::take(&mut s.out.extra) {
                                s.push(&extra);
                            }
                        }
                    }
                    Err(e) => s.end(Some(e)),
                },
                None => s.end(None),
            }
        }
    });
    let mut response = (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        Body::from_stream(body),
    )
        .into_response();
    if let Some(path) = receipt {
        response.headers_mut().insert(RECEIPT_HEADER, path);
    }
    response
}

/// The finish of an answer that made the calls it may (one, or one before a repeat): it stops
/// by itself, with its calls.
fn allowed_calls_made() -> rill_engine::serve::ServeEvent {
    rill_engine::serve::ServeEvent::Done {
        choice: 0,
        finish_reason: rill_engine::FinishReason::Stop,
        cause: rill_engine::FinishCause::Cancelled,
    }
}

/// Names a response's reproducibility receipt (`GET` it, or `POST` its id to `/v1/rill/replay`).
const RECEIPT_HEADER: header::HeaderName = header::HeaderName::from_static("x-rill-receipt");
