//! Embedding requests of any dialect: texts (or token ids) tokenized, embedded by the engine
//! loop as one job between its steps (its inputs packed into passes of the loop's batch size,
//! [`rill_engine::Engine::embed`]), and optionally cut to fewer dimensions.

use rill_engine::serve::ServeHandle;
use rill_engine::EngineError;

use crate::error::{job_dropped, ApiError};
use crate::generation::request::blocking;

/// Most inputs one request may embed (OpenAI's limit).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// One input.
#[derive(Debug, Clone)]
pub(crate) enum EmbedInput {
    Text(String),
    Tokens(Vec<u32>),
}

/// The embedded inputs and the tokens they took.
pub(crate) struct Embedded {
    pub vectors: Vec<Vec<f32>>,
    pub tokens: usize,
}

/// Embeds `inputs`. An input longer than the context is cut to it when `truncate`, else a 400
/// naming `field`; `dimensions` keeps that many leading dimensions, normalised again (what
/// Matryoshka-trained models allow).
pub(crate) async fn embed(
    handle: &ServeHandle,
    inputs: Vec<EmbedInput>,
    truncate: bool,
    dimensions: Option<usize>,
    field: &'static str,
) -> Result<Embedded, ApiError> {
    if inputs.is_empty() {
        return Err(ApiError::param(
            field,
            format!("'{field}' must not be empty"),
        ));
    }
    if inputs.len() > MAX_EMBEDDING_INPUTS {
        return Err(ApiError::param(
            field,
            format!(
                "at most {MAX_EMBEDDING_INPUTS} inputs per request, got {}",
                inputs.len()
            ),
        ));
    }
    let d = handle.model_summary().config.d_model;
    if let Some(n) = dimensions {
        if n == 0 || n > d {
            return Err(ApiError::param(
                "dimensions",
                format!("'dimensions' must be in 1..={d} (the model's embedding size), got {n}"),
            ));
        }
    }
    let context = handle.model_info().context;
    let tokenizer = handle.tokenizer();
    let ids = blocking(move || {
        inputs
            .into_iter()
            .enumerate()
            .map(|(i, input)| {
                let mut ids = match input {
                    EmbedInput::Text(t) => tokenizer.encode_with_special(&t, true, false),
                    EmbedInput::Tokens(t) => t,
                };
                if ids.is_empty() {
                    return Err(ApiError::param(
                        field,
                        format!("{field}[{i}] is empty: there is nothing to embed"),
                    ));
                }
                if ids.len() > context {
                    if !truncate {
                        return Err(ApiError::param(
                            field,
                            format!(
                                "{field}[{i}] has {} tokens but the context holds {context}",
                                ids.len()
                            ),
                        )
                        .with_code("context_length_exceeded"));
                    }
                    ids.truncate(context);
                }
                Ok(ids)
            })
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await?;
    let tokens = ids.iter().map(Vec::len).sum();
    let max_rows = handle.config().max_batch_tokens;
    let embedded = handle
        .run_job(move |engine| {
            let pooling = engine.pooling();
            engine.embed(&ids, pooling, max_rows)
        })
        .map_err(|e| {
            crate::generation::submit::submit_error(crate::params::Endpoint::Completions, e)
        })?
        .await
        .map_err(|_| job_dropped())?
        .map_err(|e| match e {
            EngineError::TokenOutOfVocab { .. } | EngineError::EmptyPrompt => {
                ApiError::param(field, e.to_string())
            }
            e => ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("embedding failed: {e}"),
            ),
        })?;
    let vectors = match dimensions {
        Some(n) if n < d => (embedded.vectors.iter())
            .map(|v| rill_engine::leading_dimensions(v, n))
            .collect(),
        _ => embedded.vectors,
    };
    Ok(Embedded { vectors, tokens })
}
