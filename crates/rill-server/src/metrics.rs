//! The HTTP layer's own counters, appended to the engine's Prometheus text on `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Default)]
pub(crate) struct HttpMetrics {
    /// Responses by (route, status).
    responses: Mutex<BTreeMap<(String, u16), u64>>,
    /// Streamed responses being sent now.
    pub streams_active: AtomicU64,
    /// Responses (streamed or not) whose client went away before the end.
    pub client_disconnects: AtomicU64,
}

impl HttpMetrics {
    pub(crate) fn count(&self, route: &str, status: u16) {
        let mut m = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((route.to_string(), status)).or_insert(0) += 1;
    }

    pub(crate) fn render(&self, out: &mut String) {
        let m = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(
            out,
            "# HELP rill_http_responses_total HTTP responses, by route and status code.\n\
             # TYPE rill_http_responses_total counter"
        );
        for ((route, status), n) in m.iter() {
            let _ = writeln!(
                out,
                "rill_http_responses_total{{route=\"{}\",status=\"{status}\"}} {n}",
                escape_label(route)
            );
        }
        let _ = writeln!(
            out,
            "# HELP rill_http_streams_active Streamed responses being sent.\n\
             # TYPE rill_http_streams_active gauge\n\
             rill_http_streams_active {}",
            self.streams_active.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP rill_http_client_disconnects_total Responses whose client went away before \
             the end (their requests were cancelled).\n\
             # TYPE rill_http_client_disconnects_total counter\n\
             rill_http_client_disconnects_total {}",
            self.client_disconnects.load(Ordering::Relaxed)
        );
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
