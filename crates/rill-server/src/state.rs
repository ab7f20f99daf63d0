//! What every handler shares: the server's [`State`] (its options, the engine's handle once a
//! model is served, its phase, metrics, the constraint compiler and the newest receipts).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};

use rill_engine::serve::ServeHandle;
use rill_engine::Receipt;

use crate::error::ApiError;
use crate::options::ServerOptions;

/// What every handler shares.
pub(crate) struct State {
    pub(crate) options: ServerOptions,
    pub(crate) handle: RwLock<Option<ServeHandle>>,
    /// Not ready any more: new requests get 503 while the running ones finish.
    pub(crate) draining: AtomicBool,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) metrics: crate::metrics::HttpMetrics,
    /// [`ServerOptions::model_aliases`] and those added since.
    pub(crate) aliases: RwLock<Vec<String>>,
    /// Unix time the model became ready (`created` of `/v1/models`).
    pub(crate) created: std::sync::atomic::AtomicU64,
    /// The `x-rill-replica` header's value ([`ServerOptions::replica_id`]).
    pub(crate) replica_header: Option<axum::http::HeaderValue>,
    /// Compiles structured-output constraints for the served vocabulary (built on first use).
    pub(crate) constrainer: std::sync::Mutex<Option<std::sync::Arc<rill_constrain::Constrainer>>>,
    /// The newest responses' reproducibility receipts.
    pub(crate) receipts: Receipts,
    /// The Responses API's stored responses.
    pub(crate) responses: Mutex<crate::stored_responses::ResponseStore>,
    /// The served model file's hash, computed when a receipt first needs it.
    pub(crate) model_identity: tokio::sync::OnceCell<rill_engine::ModelIdentity>,
    /// The served model file's path, for receipts ([`Server::set_model_path`]).
    pub(crate) model_path: RwLock<Option<String>>,
}

impl State {
    /// The constraint compiler of the served model's vocabulary: built by the first request
    /// that asks for structured output (a walk over the vocabulary), then shared.
    pub(crate) fn constrainer(
        &self,
        tokenizer: std::sync::Arc<rill_tokenizer::Tokenizer>,
    ) -> Result<std::sync::Arc<rill_constrain::Constrainer>, rill_constrain::ConstraintError> {
        let mut slot = self.constrainer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = std::sync::Arc::new(rill_constrain::Constrainer::with_limits(
            tokenizer,
            self.options.constraint_limits,
        )?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// The engine's handle, or 503 while the model loads or the server shuts down.
    pub(crate) fn handle(&self) -> Result<ServeHandle, ApiError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable(
                "the server is shutting down",
                "shutting_down",
            ));
        }
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable(
                "the server is draining before it stops: send the request to another replica",
                "draining",
            ));
        }
        match self
            .handle
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(h) => Ok(h.clone()),
            None => Err(ApiError::unavailable(
                "the model is still loading",
                "model_loading",
            )),
        }
    }

    /// Whether `/health` should say the server is draining, shutting down or loading.
    pub(crate) fn phase(&self) -> &'static str {
        if self.shutting_down.load(Ordering::SeqCst) {
            "shutting_down"
        } else if self.draining.load(Ordering::SeqCst) {
            "draining"
        } else if self.current_handle().is_none() {
            "loading"
        } else {
            "ok"
        }
    }

    /// Whether requests may name the model `name` (its own name or an alias).
    pub(crate) fn serves(&self, name: &str, served: &str) -> bool {
        name == served
            || self
                .aliases
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|a| a == name)
    }

    pub(crate) fn model_path(&self) -> Option<String> {
        self.model_path
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn current_handle(&self) -> Option<ServeHandle> {
        self.handle
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Receipts kept (the newest; older ones are forgotten). A receipt holds its prompt's ids, so
/// this bounds their memory at about 4 bytes per prompt token each.
pub const RECEIPTS_KEPT: usize = 256;

/// The newest receipts by response id.
#[derive(Default)]
pub(crate) struct ReceiptStore {
    entries: VecDeque<(String, Receipt)>,
}

impl ReceiptStore {
    pub(crate) fn insert(&mut self, id: String, receipt: Receipt) {
        if self.entries.len() == RECEIPTS_KEPT {
            self.entries.pop_front();
        }
        self.entries.push_back((id, receipt));
    }

    pub(crate) fn get(&self, id: &str) -> Option<Receipt> {
        self.entries
            .iter()
            .rev()
            .find(|(i, _)| i == id)
            .map(|(_, r)| r.clone())
    }
}

/// The newest receipts, shared by the handlers.
pub(crate) type Receipts = Mutex<ReceiptStore>;
