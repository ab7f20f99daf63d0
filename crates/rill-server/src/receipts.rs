//! Reproducibility receipts of the server's responses: every completion of one prompt without a
//! constraint or tools is recorded (its prompt ids, every parameter with the seed actually used,
//! each choice's tokens), named by the response's id in its `x-rill-receipt` header.
//! `GET /v1/rill/receipts/ID` gives the receipt (the format `rill replay` reads);
//! `POST /v1/rill/replay` generates it again through the serving loop, beside whatever else runs,
//! and compares the tokens bit for bit (batch invariance is what makes that hold).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, State as Extract};
use axum::http::StatusCode;
use axum::response::Response;
use rill_engine::serve::{ServeEvent, ServeHandle, ServeRequest, Trace};
use rill_engine::{
    kernel_paths, GenerateParams, ModelIdentity, Receipt, ReceiptChoice, ReplayVerdict,
};
use serde_json::json;

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::glass::job_dropped;
use crate::routes::open_request;
use crate::State;

type AppState = Arc<State>;

/// Receipts kept (the newest; older ones are forgotten). A receipt holds its prompt's ids, so
/// this bounds their memory at about 4 bytes per prompt token each.
pub const RECEIPTS_KEPT: usize = 256;

/// A response's receipt before its tokens: made when the request is submitted.
pub(crate) struct ReceiptDraft(Receipt);

impl ReceiptDraft {
    /// The draft for response `id` of `prompts` with `params` (as submitted, `max_tokens`
    /// resolved), if it is recorded: one prompt, no constraint (tools and structured output ride
    /// on one).
    pub(crate) fn new(
        state: &State,
        handle: &ServeHandle,
        id: &str,
        prompts: &[Vec<u32>],
        params: &GenerateParams,
    ) -> Option<ReceiptDraft> {
        let [prompt] = prompts else {
            return None;
        };
        if params.constraint.is_some() {
            return None;
        }
        let summary = handle.model_summary();
        Some(ReceiptDraft(Receipt {
            model: ModelIdentity {
                sha256: String::new(),
                bytes: 0,
                path: state.model_path(),
                name: Some(handle.model_info().name),
            },
            rill_version: env!("CARGO_PKG_VERSION").into(),
            kernels: kernel_paths(),
            precision: summary.precision,
            kv_types: Some(summary.kv_types),
            prompt: prompt.clone(),
            params: params.clone(),
            choices: Vec::new(),
            response_id: Some(id.to_string()),
        }))
    }

    /// The `x-rill-receipt` header's value.
    pub(crate) fn path(&self) -> String {
        format!(
            "/v1/rill/receipts/{}",
            self.0.response_id.as_deref().unwrap_or("")
        )
    }
}

/// The newest receipts by response id.
#[derive(Default)]
pub(crate) struct ReceiptStore {
    entries: VecDeque<(String, Receipt)>,
}

impl ReceiptStore {
    fn insert(&mut self, id: String, receipt: Receipt) {
        if self.entries.len() == RECEIPTS_KEPT {
            self.entries.pop_front();
        }
        self.entries.push_back((id, receipt));
    }

    fn get(&self, id: &str) -> Option<Receipt> {
        self.entries
            .iter()
            .rev()
            .find(|(i, _)| i == id)
            .map(|(_, r)| r.clone())
    }
}

impl State {
    /// Records a finished response's receipt (the model identity is filled in when asked for).
    pub(crate) fn store_receipt(
        &self,
        draft: ReceiptDraft,
        tokenizer: &rill_tokenizer::Tokenizer,
        choices: Vec<(Vec<u32>, String)>,
    ) {
        let mut receipt = draft.0;
        receipt.choices = choices
            .into_iter()
            .map(|(tokens, finish)| ReceiptChoice {
                text: tokenizer.decode(&tokens),
                tokens,
                finish,
            })
            .collect();
        let id = receipt.response_id.clone().unwrap_or_default();
        self.receipts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, receipt);
    }

    /// The served model file's sha256 and size, computed once: from the file on disk off the
    /// engine loop when the server knows its path ([`crate::Server::set_model_path`]), else from
    /// the loaded bytes in a job of the loop (which pauses generation for the hash, about 0.3 s
    /// per 100 MB, once).
    async fn model_identity(&self, handle: &ServeHandle) -> Result<ModelIdentity, ApiError> {
        let path = self.model_path();
        self.model_identity
            .get_or_try_init(|| async {
                if let Some(path) = path {
                    let file = path.clone();
                    let (sha256, bytes) = crate::routes::blocking(move || {
                        rill_engine::receipt::sha256_file(std::path::Path::new(&file)).map_err(
                            |e| {
                                ApiError::unavailable(
                                    format!("cannot hash the model file {file}: {e}"),
                                    "engine_error",
                                )
                            },
                        )
                    })
                    .await?;
                    return Ok(ModelIdentity {
                        sha256,
                        bytes,
                        path: Some(path),
                        name: None,
                    });
                }
                handle
                    .run_job(|engine| ModelIdentity::of_bytes(engine.model.file().bytes()))
                    .map_err(|_| job_dropped())?
                    .await
                    .map_err(|_| job_dropped())
            })
            .await
            .cloned()
    }
}

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
        .map_err(|e| crate::generate::submit_error(crate::params::Endpoint::Completions, e))?;
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

/// Receipts kept by the server, shared by its handlers.
pub(crate) type Receipts = Mutex<ReceiptStore>;
