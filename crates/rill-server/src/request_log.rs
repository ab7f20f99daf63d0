//! One line per request, as the servers people run write them: method, path, status, client,
//! total time and, for generations, the model, prompt and output tokens, time to first token
//! and finish reasons. Written when the response's body is done (sent, or dropped by a client
//! that left), so a stream's line carries its whole time.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes};
use serde_json::json;

/// How requests are logged.
#[derive(Clone)]
pub struct RequestLog {
    pub format: RequestLogFormat,
    /// Where each line goes (`rill serve`: standard error).
    pub sink: Arc<dyn Fn(String) + Send + Sync>,
}

impl std::fmt::Debug for RequestLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RequestLog({:?})", self.format)
    }
}

/// A line's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestLogFormat {
    /// `POST /v1/chat/completions 200 127.0.0.1:51234 0.412s model=smollm2 prompt=31 ...`
    Text,
    /// One JSON object per line.
    Json,
}

/// The client's address, put in each request's extensions by the connection loop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClientAddr(pub SocketAddr);

/// What a generation adds to its request's line (shared with the handler).
#[derive(Clone, Default)]
pub(crate) struct GenerationNote(Arc<Mutex<NoteData>>);

#[derive(Default)]
struct NoteData {
    model: Option<String>,
    prompt_tokens: usize,
    output_tokens: usize,
    cached_tokens: usize,
    first_token: Option<Instant>,
    finish: Vec<String>,
}

impl GenerationNote {
    fn with<T>(&self, f: impl FnOnce(&mut NoteData) -> T) -> Option<T> {
        self.0.lock().ok().map(|mut d| f(&mut d))
    }

    /// The first token came now (the earliest call counts).
    pub(crate) fn first_token(&self) {
        self.with(|d| {
            d.first_token.get_or_insert_with(Instant::now);
        });
    }

    /// The generation's model, usage and each choice's finish reason.
    pub(crate) fn finish(
        &self,
        model: &str,
        (prompt, output, cached): (usize, usize, usize),
        reasons: Vec<String>,
    ) {
        self.with(|d| {
            d.model = Some(model.to_string());
            d.prompt_tokens = prompt;
            d.output_tokens = output;
            d.cached_tokens = cached;
            d.finish = reasons;
        });
    }
}

/// A request's line, written when dropped.
pub(crate) struct Record {
    log: RequestLog,
    method: String,
    path: String,
    status: u16,
    client: Option<SocketAddr>,
    started: Instant,
    note: GenerationNote,
}

impl Record {
    pub(crate) fn new(
        log: RequestLog,
        (method, path): (String, String),
        status: u16,
        client: Option<SocketAddr>,
        started: Instant,
        note: GenerationNote,
    ) -> Record {
        Record {
            log,
            method,
            path,
            status,
            client,
            started,
            note,
        }
    }

    fn line(&self) -> String {
        let total = self.started.elapsed().as_secs_f64();
        let client = self.client.map(|a| a.to_string());
        let note = self.note.0.lock().ok();
        let note = note.as_deref();
        let ttft = note
            .and_then(|n| n.first_token)
            .map(|t| t.duration_since(self.started).as_secs_f64());
        match self.log.format {
            RequestLogFormat::Json => {
                let mut v = json!({
                    "method": self.method,
                    "path": self.path,
                    "status": self.status,
                    "client": client,
                    "seconds": total,
                });
                if let Some(n) = note.filter(|n| n.model.is_some()) {
                    v["model"] = json!(n.model);
                    v["prompt_tokens"] = json!(n.prompt_tokens);
                    v["cached_tokens"] = json!(n.cached_tokens);
                    v["output_tokens"] = json!(n.output_tokens);
                    v["ttft_seconds"] = json!(ttft);
                    v["finish"] = json!(n.finish);
                }
                v.to_string()
            }
            RequestLogFormat::Text => {
                let mut line = format!(
                    "{} {} {} {} {total:.3}s",
                    self.method,
                    self.path,
                    self.status,
                    client.as_deref().unwrap_or("-")
                );
                if let Some(n) = note.filter(|n| n.model.is_some()) {
                    line.push_str(&format!(
                        " model={} prompt={} cached={} output={} ttft={} finish={}",
                        n.model.as_deref().unwrap_or("-"),
                        n.prompt_tokens,
                        n.cached_tokens,
                        n.output_tokens,
                        ttft.map_or("-".into(), |t| format!("{t:.3}s")),
                        if n.finish.is_empty() {
                            "-".into()
                        } else {
                            n.finish.join(",")
                        },
                    ));
                }
                line
            }
        }
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let line = self.line();
        (self.log.sink)(line);
    }
}

/// A response body that writes its request's line when it is done.
pub(crate) struct LoggedBody {
    inner: Body,
    record: Option<Record>,
}

impl LoggedBody {
    pub(crate) fn new(inner: Body, record: Record) -> LoggedBody {
        LoggedBody {
            inner,
            record: Some(record),
        }
    }
}

impl http_body::Body for LoggedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            // Done: the line now, not whenever the connection lets go of the body.
            self.record.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
