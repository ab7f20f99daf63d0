//! Delivering an answer as a stream in a dialect's framing (server-sent events, NDJSON): the
//! dialect renders events into frames ([`StreamRender`]); this drives the answer, counts the
//! stream in the metrics, and cancels the request when the client goes away (the body is
//! dropped, and with it the engine's streams).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::generation::answer::{Answer, Event, Usage};
use crate::state::State;

/// Counts a response whose client left before its end (on drop, unless finished).
pub(crate) struct Tracker {
    state: Arc<State>,
    finished: bool,
    stream: bool,
}

impl Tracker {
    pub(crate) fn new(state: Arc<State>, stream: bool) -> Tracker {
        if stream {
            state.metrics.streams_active.fetch_add(1, Ordering::Relaxed);
        }
        Tracker {
            state,
            finished: false,
            stream,
        }
    }

    /// The response was delivered whole.
    pub(crate) fn finish(&mut self) {
        self.finished = true;
    }

    pub(crate) fn state(&self) -> &Arc<State> {
        &self.state
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if self.stream {
            self.state
                .metrics
                .streams_active
                .fetch_sub(1, Ordering::Relaxed);
        }
        if !self.finished {
            self.state
                .metrics
                .client_disconnects
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A dialect's stream: the frames of each step of an answer.
pub(crate) trait StreamRender: Send + 'static {
    /// Frames the stream starts with.
    fn start(&mut self) -> Vec<String>;
    /// Frames of the answer's next events.
    fn events(&mut self, events: Vec<Event>, usage: Usage) -> Vec<String>;
    /// Frames that end the stream after every choice finished.
    fn end(&mut self, usage: Usage) -> Vec<String>;
    /// Frames that end the stream with an error.
    fn error(&mut self, error: &ApiError) -> Vec<String>;
}

/// How a stream's frames are carried.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Framing {
    ServerSentEvents,
    /// Newline-delimited JSON (Ollama).
    Ndjson,
}

struct Streaming<R> {
    answer: Answer,
    render: R,
    queue: VecDeque<Bytes>,
    ended: bool,
    tracker: Tracker,
}

/// The answer streamed in `render`'s frames.
pub(crate) fn stream<R: StreamRender>(
    state: Arc<State>,
    answer: Answer,
    mut render: R,
    framing: Framing,
) -> Response {
    let queue = render.start().into_iter().map(Bytes::from).collect();
    let s = Streaming {
        answer,
        render,
        queue,
        ended: false,
        tracker: Tracker::new(state, true),
    };
    let body = futures::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(b) = s.queue.pop_front() {
                return Some((Ok::<Bytes, Infallible>(b), s));
            }
            if s.ended {
                s.tracker.finish();
                return None;
            }
            let frames = match s.answer.next().await {
                Some(Ok(events)) => {
                    let usage = s.answer.usage();
                    s.render.events(events, usage)
                }
                Some(Err(e)) => {
                    s.ended = true;
                    s.render.error(&e)
                }
                None => {
                    s.ended = true;
                    let usage = s.answer.usage();
                    s.render.end(usage)
                }
            };
            s.queue.extend(frames.into_iter().map(Bytes::from));
        }
    });
    let content_type = match framing {
        Framing::ServerSentEvents => "text/event-stream",
        Framing::Ndjson => "application/x-ndjson",
    };
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// A whole answer through `render` (its frames dropped: the renderer keeps what the whole
/// response needs); the usage at the end.
pub(crate) async fn collect<R: StreamRender>(
    state: Arc<State>,
    mut answer: Answer,
    render: &mut R,
) -> Result<Usage, ApiError> {
    let mut tracker = Tracker::new(state, false);
    while let Some(events) = answer.next().await {
        render.events(events?, answer.usage());
    }
    tracker.finish();
    Ok(answer.usage())
}

/// One server-sent event with a name.
pub(crate) fn sse_event(name: &str, data: &serde_json::Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}
