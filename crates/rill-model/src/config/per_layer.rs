//! Reading per-layer arrays and bounded counts from GGUF metadata.

use rill_gguf::Metadata;

use super::LayerKind;
use crate::ModelError;

/// One value per layer from the array under `key` (`None` when the key holds no array), each
/// read by `item` (`None`: the wrong kind, named by `expected`).
pub(super) fn per_layer<T>(
    meta: &Metadata,
    key: &str,
    n_layers: usize,
    expected: &str,
    item: impl Fn(&rill_gguf::Value) -> Option<T>,
) -> Result<Option<Vec<T>>, ModelError> {
    let bad = |reason: String| ModelError::BadMetadata {
        key: key.to_string(),
        reason,
    };
    let Some(rill_gguf::Value::Array(items)) = meta.get(key) else {
        return Ok(None);
    };
    if items.len() != n_layers {
        return Err(bad(format!(
            "{} entries for {n_layers} layers",
            items.len()
        )));
    }
    items
        .iter()
        .map(|v| {
            item(v).ok_or_else(|| bad(format!("expected {expected}, found {}", v.type_name())))
        })
        .collect::<Result<Vec<T>, _>>()
        .map(Some)
}

/// Layer kinds where a file says them only through per-layer KV head counts (LFM2, Granite
/// 4.0-H, as llama.cpp reads them): 0 KV heads is a `recurrent` layer, any other attention.
pub(super) fn kinds_by_kv_heads(
    counts: &Option<Vec<usize>>,
    recurrent: LayerKind,
    key: &dyn Fn(&str) -> String,
) -> Result<Vec<LayerKind>, ModelError> {
    let counts = counts.as_ref().ok_or_else(|| ModelError::BadMetadata {
        key: key("attention.head_count_kv"),
        reason: "a hybrid gives one KV head count per layer (0: a recurrent layer)".into(),
    })?;
    Ok(counts
        .iter()
        .map(|&c| {
            if c == 0 {
                recurrent
            } else {
                LayerKind::Attention
            }
        })
        .collect())
}

/// A per-layer array of counts under `key` (LFM2's and Granite 4.0-H's KV heads), when the file
/// has an array there.
pub(super) fn per_layer_counts(
    meta: &Metadata,
    key: &str,
    n_layers: usize,
) -> Result<Option<Vec<usize>>, ModelError> {
    per_layer(meta, key, n_layers, "counts", |v| {
        v.as_u64().filter(|&c| c <= 1 << 16).map(|c| c as usize)
    })
}

/// Qwen3.5's recurrent layers: one bool per layer under `key`, else every layer but each
/// `full_attention_interval`-th (4 by default, the converter's).
pub(super) fn recurrent_layers(
    meta: &Metadata,
    key: &str,
    n_layers: usize,
) -> Result<Vec<bool>, ModelError> {
    if let Some(v) = meta.get(key) {
        return per_layer(meta, key, n_layers, "bools", rill_gguf::Value::as_bool)?.ok_or_else(
            || ModelError::BadMetadata {
                key: key.to_string(),
                reason: format!("expected a bool array, found {}", v.type_name()),
            },
        );
    }
    let interval_key = key.replace("attention.recurrent_layers", "full_attention_interval");
    let interval = meta.get_u64(&interval_key)?.unwrap_or(4).max(1) as usize;
    Ok((0..n_layers).map(|il| (il + 1) % interval != 0).collect())
}

/// Which layers use the sliding window: `attention.sliding_window_pattern` is either a period `p`
/// (every `p`-th layer is global: `il % p == p - 1`; `default_period` when absent) or, in newer
/// files, one bool per layer (true: sliding).
pub(super) fn sliding_layers(
    meta: &Metadata,
    key: &str,
    n_layers: usize,
    default_period: usize,
) -> Result<Vec<bool>, ModelError> {
    if let Some(layers) = per_layer(meta, key, n_layers, "bools", rill_gguf::Value::as_bool)? {
        return Ok(layers);
    }
    let period = match meta.get(key) {
        Some(v) => {
            let period = v.as_u64().ok_or_else(|| ModelError::BadMetadata {
                key: key.to_string(),
                reason: format!(
                    "expected an integer or a bool array, found {}",
                    v.type_name()
                ),
            })?;
            positive(key, period)?
        }
        None => default_period,
    };
    Ok((0..n_layers).map(|il| il % period != period - 1).collect())
}

pub(super) fn positive(key: &str, v: u64) -> Result<usize, ModelError> {
    // Bounded well above any real model so later size arithmetic cannot overflow.
    const MAX: u64 = 1 << 24;
    if v == 0 || v > MAX {
        return Err(ModelError::BadMetadata {
            key: key.to_string(),
            reason: format!("{v} is outside 1..={MAX}"),
        });
    }
    Ok(v as usize)
}
