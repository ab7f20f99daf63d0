//! Reproducibility receipts of the server's responses: every completion of one prompt without a
//! constraint or tools is recorded (its prompt ids, every parameter with the seed actually used,
//! each choice's tokens), named by the response's id in its `x-rill-receipt` header.
//! `GET /v1/rill/receipts/ID` gives the receipt (the format `rill replay` reads);
//! `POST /v1/rill/replay` generates it again through the serving loop, beside whatever else runs,
//! and compares the tokens bit for bit (batch invariance is what makes that hold).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::Response;
use rill_engine::serve::{ServeEvent, ServeRequest, Trace};
use rill_engine::{kernel_paths, Receipt, ReplayVerdict};
use serde_json::json;

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generation::request::open_request;
use crate::state::{State, RECEIPTS_KEPT};

type AppState = Arc<State>;

/// `GET /v1/rill/receipts/ID`: the receipt of response `ID` (while it is among the newest
/// [`RECEIPTS_KEPT`]).
pub(crate) async fn get(
    Extract(state): Extract<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let handle = state.handle()?;
    let mut receipt = state
        .receipts
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .ok_or_else(|| unknown_receipt(&id))?;
    let identity = state.model_identity(&handle).await?;
    receipt.model.sha256 = identity.sha256;
    receipt.model.bytes = identity.bytes;
    Ok(json_body(&receipt.to_json()))
}

fn unknown_receipt(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        format!(
            "no receipt for {id:?}: receipts are kept for the newest {RECEIPTS_KEPT} responses \
             of one prompt without a constraint or tools"
        ),
    )
}

fn conflict(message: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message)
        .with_code("receipt_mismatch")
}

/// `POST /v1/rill/replay`: `{"id": "..."}` (a receipt this server keeps) or `{"receipt": {...}}`
/// (one from anywhere: `rill run --receipt`, another replica) is generated again through the
/// serving loop and compared token by token.
pub(crate) async fn replay(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let receipt = match (f.str("id")?, f.get("receipt")) {
        (Some(id), None) => state
            .receipts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .ok_or_else(|| unknown_receipt(id))?,
        (None, Some(v)) => {
            Receipt::from_json(v).map_err(|e| ApiError::param("receipt", e.to_string()))?
        }
        _ => {
            return Err(ApiError::param(
                "id",
                "give the 'id' of a response whose receipt this server keeps, or a 'receipt'",
            ))
        }
    };
    let identity = state.model_identity(&handle).await?;
    if !receipt.model.sha256.is_empty() && receipt.model.sha256 != identity.sha256 {
        return Err(conflict(format!(
            "the receipt is for the model file with sha256 {}; this server runs {}",
            receipt.model.sha256, identity.sha256
        )));
    }
    let summary = handle.model_summary();
    if receipt.precision != summary.precision {
        return Err(conflict(format!(
            "the receipt was generated with the {} path; this server runs the {} path \
             (`rill replay` replays it with either)",
            rill_engine::receipt::precision_name(receipt.precision),
            rill_engine::receipt::precision_name(summary.precision),
        )));
    }
    let types = receipt.kv_types.unwrap_or(summary.kv_types);
    if types != summary.kv_types {
        return Err(conflict(format!(
            "the receipt's KV cache held {} keys and {} values; this server's holds {} and {}",
            types.keys.name(),
            types.values.name(),
            summary.kv_types.keys.name(),
            summary.kv_types.values.name(),
        )));
    }
    if receipt
        .prompt
        .len()
        .saturating_add(receipt.params.max_tokens)
        > info.context
    {
        return Err(ApiError::param(
            "receipt",
            format!(
                "the receipt's prompt ({}) and max_tokens ({}) do not fit the context of {}",
                receipt.prompt.len(),
                receipt.params.max_tokens,
                info.context
            ),
        ));
    }
    receipt
        .params
        .validate(info.vocab_size)
        .map_err(|e| ApiError::param("receipt", e.to_string()))?;
    let n = receipt.choices.len();
    let mut stream = handle
        .submit(ServeRequest {
            prompt: receipt.prompt.clone(),
            params: receipt.params.clone(),
            n,
            trace: Trace::default(),
        })
        .map_err(|e| {
            crate::generation::submit::submit_error(crate::params::Endpoint::Completions, e)
        })?;
    let mut replayed = vec![Vec::new(); n];
    while let Some(event) = stream.recv().await {
        match event {
            ServeEvent::Token { choice, token, .. } => {
                if let Some(c) = replayed.get_mut(choice) {
                    c.push(token);
                }
            }
            ServeEvent::Error { message } => {
                return Err(ApiError::unavailable(
                    format!("the replay failed: {message}"),
                    "engine_error",
                ))
            }
            _ => {}
        }
    }
    let mut body = json!({
        "response_id": receipt.response_id,
        "kernels": kernel_paths(),
        "recorded_kernels": receipt.kernels,
        "rill_version": env!("CARGO_PKG_VERSION"),
        "recorded_rill_version": receipt.rill_version,
    });
    match receipt.verdict(&replayed) {
        ReplayVerdict::Identical { tokens } => {
            body["identical"] = json!(true);
            body["tokens"] = json!(tokens);
        }
        ReplayVerdict::Differs {
            choice,
            at,
            got,
            want,
            got_len,
            want_len,
        } => {
            body["identical"] = json!(false);
            body["tokens"] = json!(replayed.iter().map(Vec::len).sum::<usize>());
            body["first_difference"] = json!({
                "choice": choice, "index": at, "token": got, "receipt_token": want,
                "tokens": got_len, "receipt_tokens": want_len,
            });
        }
    }
    Ok(json_body(&body))
}
