//! `POST /v1/embeddings`: `input` as a string, strings, token ids or lists of token ids;
//! `encoding_format` `float` or `base64` (little-endian f32); `dimensions` (leading dimensions,
//! normalised again). Vectors are pooled as the model's GGUF says and have unit length.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State as Extract;
use axum::response::Response;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::error::{json_body, ApiError};
use crate::fields::Fields;
use crate::generation::embed::{embed, EmbedInput};
use crate::generation::request::open_request;
use crate::params::token_list;
use crate::state::State;

type AppState = Arc<State>;

pub(crate) async fn embeddings(
    Extract(state): Extract<AppState>,
    body: Body,
) -> Result<Response, ApiError> {
    let (handle, map, info) = open_request(&state, body).await?;
    let f = Fields::new(&map);
    let inputs = read_inputs(&f, info.vocab_size)?;
    let base64 = match f.str("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::param(
                "encoding_format",
                format!("'encoding_format' must be \"float\" or \"base64\", got {other:?}"),
            ))
        }
    };
    let dimensions = f
        .int("dimensions", 1, i64::from(u32::MAX))?
        .map(|n| n as usize);
    f.str("user")?;
    let embedded = embed(&handle, inputs, false, dimensions, "input").await?;
    let data: Vec<Value> = embedded
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(json_body(&json!({
        "object": "list",
        "data": data,
        "model": map.get("model").and_then(Value::as_str).unwrap_or(&info.name),
        "usage": {"prompt_tokens": embedded.tokens, "total_tokens": embedded.tokens},
    })))
}

/// `input`: a string, an array of strings, an array of token ids, or an array of arrays of
/// token ids.
fn read_inputs(f: &Fields<'_>, vocab_size: usize) -> Result<Vec<EmbedInput>, ApiError> {
    let expected = "a string, an array of strings, an array of token ids or an array of arrays \
                    of token ids";
    match f.get("input") {
        None => Err(ApiError::missing("input")),
        Some(Value::String(s)) => Ok(vec![EmbedInput::Text(s.clone())]),
        Some(Value::Array(a)) if a.is_empty() => Err(ApiError::param(
            "input",
            "'input' must not be an empty array",
        )),
        Some(v @ Value::Array(a)) => match &a[0] {
            Value::Number(_) => Ok(vec![EmbedInput::Tokens(token_list(
                "input",
                v,
                vocab_size,
                usize::MAX,
            )?)]),
            _ => a
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::String(s) => Ok(EmbedInput::Text(s.clone())),
                    Value::Array(_) => {
                        token_list(&format!("input[{i}]"), x, vocab_size, usize::MAX)
                            .map(EmbedInput::Tokens)
                            .map_err(|e| e.with_param("input"))
                    }
                    other => Err(
                        ApiError::wrong_type(&format!("input[{i}]"), expected, other)
                            .with_param("input"),
                    ),
                })
                .collect(),
        },
        Some(v) => Err(ApiError::wrong_type("input", expected, v)),
    }
}
