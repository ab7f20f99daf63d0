//! Recording reproducibility receipts: every completion of one prompt without a constraint or
//! tools is recorded (its prompt ids, every parameter with the seed actually used, each choice's
//! tokens), named by the response's id in its `x-rill-receipt` header. The endpoints that read
//! and replay them are the glass box's (`glass::receipts`).

use rill_engine::serve::ServeHandle;
use rill_engine::{kernel_paths, GenerateParams, ModelIdentity, Receipt, ReceiptChoice};

use crate::error::{job_dropped, ApiError};
use crate::state::State;

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
    pub(crate) async fn model_identity(
        &self,
        handle: &ServeHandle,
    ) -> Result<ModelIdentity, ApiError> {
        let path = self.model_path();
        self.model_identity
            .get_or_try_init(|| async {
                if let Some(path) = path {
                    let file = path.clone();
                    let (sha256, bytes) = crate::generation::request::blocking(move || {
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
