//! The HTTP server over real loopback connections, on synthetic models: response and chunk
//! formats, streaming, concurrency, cancellation on disconnect, backpressure, validation of every
//! field, authentication, body limits and graceful shutdown.

#[path = "../common/mod.rs"]
mod common;

use common::*;
use rill_engine::serve::ServeConfig;
use rill_server::ServerOptions;
use serde_json::{json, Value};

fn user(text: &str) -> Value {
    json!([{ "role": "user", "content": text }])
}

mod api;
mod bad_input;
mod limits_and_shutdown;
