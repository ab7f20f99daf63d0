//! The generation parameters both endpoints share, validated field by field into
//! [`GenerateParams`].

use rill_engine::{GenerateParams, SamplingParams, MAX_TOP_LOGPROBS};
use serde_json::Value;

use crate::error::ApiError;
use crate::fields::{int_value, seed_value, Fields};

/// Most choices one request may ask for (`n`).
pub const MAX_N: i64 = 64;
/// Most stop strings, and the longest one in bytes.
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_BYTES: usize = 1024;
/// Most `logit_bias` entries and `stop_token_ids`.
pub const MAX_TOKEN_LIST: usize = 4096;

/// Which endpoint a request came to (they differ in `logprobs` and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Chat,
    Completions,
}

/// What both endpoints read from a request, before the prompt is known.
#[derive(Debug, Clone)]
pub(crate) struct Common {
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// `max_tokens` / `max_completion_tokens` as given (the default depends on the prompt).
    pub max_tokens: Option<usize>,
    /// Alternatives per token when log-probabilities were asked for.
    pub top_logprobs: Option<usize>,
    /// Everything but `max_tokens`.
    pub params: GenerateParams,
    /// rill's `explain` extension: a `rill` object with every token (docs/glass-box-api.md).
    pub explain: bool,
}

/// A seed for a request that gave none: different for every call.
pub(crate) fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Reads and checks every shared field. `vocab_size` bounds token ids.
pub(crate) fn parse_common(
    f: &Fields<'_>,
    endpoint: Endpoint,
    vocab_size: usize,
) -> Result<Common, ApiError> {
    let stream = f.bool("stream")?.unwrap_or(false);
    let mut include_usage = false;
    if let Some(opts) = f.object("stream_options")? {
        if !stream {
            return Err(ApiError::param(
                "stream_options",
                "'stream_options' is only allowed when 'stream' is true",
            ));
        }
        include_usage = opts.bool("include_usage")?.unwrap_or(false);
    }
    let n = f.int("n", 1, MAX_N)?.unwrap_or(1) as usize;

    let max_tokens = match f.int("max_completion_tokens", 1, i64::from(u32::MAX))? {
        Some(m) => Some(m as usize),
        None => f
            .int("max_tokens", 1, i64::from(u32::MAX))?
            .map(|m| m as usize),
    };

    // OpenAI's default temperature is 1.
    let mut sampling = read_temperature_top_p(f, 1.0, 2.0)?;
    if let Some(v) = f.get("seed") {
        sampling.seed = seed_value("seed", v)?;
    }
    for (key, slot) in [
        ("presence_penalty", &mut sampling.presence_penalty),
        ("frequency_penalty", &mut sampling.frequency_penalty),
    ] {
        if let Some(x) = f.number(key, |x| (-2.0..=2.0).contains(&x), "in [-2, 2]")? {
            *slot = x as f32;
        }
    }
    if let Some(v) = f.get("logit_bias") {
        sampling.logit_bias = logit_bias(v, vocab_size)?;
    }
    // Extensions (vLLM's names).
    if let Some(k) = f.int("top_k", -1, i64::from(u32::MAX))? {
        sampling.top_k = k.max(0) as usize;
    }
    if let Some(p) = f.number(
        "min_p",
        |p| (0.0..=1.0).contains(&p),
        "in [0, 1] (0 disables it)",
    )? {
        sampling.min_p = p as f32;
    }
    if let Some(p) = f.number(
        "typical_p",
        |p| p > 0.0 && p <= 1.0,
        "in (0, 1] (1 disables it)",
    )? {
        sampling.typical_p = p as f32;
    }
    if let Some(r) = f.number(
        "repetition_penalty",
        |r| r > 0.0 && r <= 100.0,
        "in (0, 100] (1 disables it)",
    )? {
        sampling.repeat_penalty = r as f32;
    }
    if let Some(n) = f.int("repeat_last_n", -1, i64::from(u32::MAX))? {
        sampling.repeat_last_n = if n < 0 { usize::MAX } else { n as usize };
    }

    let top_logprobs = match endpoint {
        Endpoint::Chat => {
            let wanted = f.bool("logprobs")?.unwrap_or(false);
            let top = f.int("top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
            if top.is_some() && !wanted {
                return Err(ApiError::param(
                    "top_logprobs",
                    "'top_logprobs' requires 'logprobs' to be true",
                ));
            }
            wanted.then(|| top.unwrap_or(0) as usize)
        }
        Endpoint::Completions => f
            .int("logprobs", 0, MAX_TOP_LOGPROBS as i64)?
            .map(|n| n as usize),
    };

    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(v) => stop_strings(v)?,
    };
    let stop_token_ids = match f.get("stop_token_ids") {
        None => Vec::new(),
        Some(v) => token_list("stop_token_ids", v, vocab_size, MAX_TOKEN_LIST)?,
    };
    let min_tokens = f.int("min_tokens", 0, i64::from(u32::MAX))?.unwrap_or(0) as usize;
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let explain = f.bool("explain")?.unwrap_or(false);
    f.str("user")?;

    if let (Some(max), true) = (max_tokens, min_tokens > 0) {
        if min_tokens > max {
            return Err(ApiError::param(
                "min_tokens",
                format!("'min_tokens' ({min_tokens}) must not exceed 'max_tokens' ({max})"),
            ));
        }
    }

    let params = GenerateParams {
        max_tokens: max_tokens.unwrap_or(1),
        sampling,
        ignore_eos,
        min_tokens,
        stop,
        stop_token_ids,
        // Explaining shows the candidates of every token, asked for or not.
        top_logprobs: match (top_logprobs, explain) {
            (None, true) => Some(MAX_TOP_LOGPROBS),
            (Some(n), true) => Some(n.max(MAX_TOP_LOGPROBS)),
            (asked, false) => asked,
        },
        prompt_logprobs: false,
        constraint: None,
        thinking_budget: None,
    };
    params
        .validate(vocab_size)
        .map_err(|e| ApiError::invalid(e.to_string()).with_code("invalid_value"))?;
    Ok(Common {
        n,
        stream,
        include_usage,
        max_tokens,
        top_logprobs,
        params,
        explain,
    })
}

/// The default sampling at `temperature`, with a seed of its own.
pub(crate) fn fresh_sampling(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: random_seed(),
        ..SamplingParams::default()
    }
}

/// Sampling with a fresh seed, `temperature` (in [0, `max_temperature`], else
/// `default_temperature`) and `top_p`, as every dialect reads them.
pub(crate) fn read_temperature_top_p(
    f: &Fields<'_>,
    default_temperature: f32,
    max_temperature: f64,
) -> Result<SamplingParams, ApiError> {
    let mut sampling = fresh_sampling(default_temperature);
    if let Some(t) = f.number(
        "temperature",
        |t| (0.0..=max_temperature).contains(&t),
        &format!("in [0, {max_temperature}] (0 is greedy)"),
    )? {
        sampling.temperature = t as f32;
    }
    if let Some(p) = f.number(
        "top_p",
        |p| p > 0.0 && p <= 1.0,
        "in (0, 1] (1 disables it)",
    )? {
        sampling.top_p = p as f32;
    }
    Ok(sampling)
}

/// rill's (and vLLM's) extensions that every dialect reads: `ignore_eos`, `min_tokens` and
/// `seed` (what a load generator needs to ask for exactly so many tokens, repeatably).
pub(crate) fn read_extensions(f: &Fields<'_>, params: &mut GenerateParams) -> Result<(), ApiError> {
    if let Some(b) = f.bool("ignore_eos")? {
        params.ignore_eos = b;
    }
    if let Some(n) = f.int("min_tokens", 0, i64::from(u32::MAX))? {
        params.min_tokens = n as usize;
    }
    if let Some(v) = f.get("seed") {
        params.sampling.seed = seed_value("seed", v)?;
    }
    Ok(())
}

/// `stop`: a string or a list of strings.
fn stop_strings(v: &Value) -> Result<Vec<String>, ApiError> {
    let list: Vec<&Value> = match v {
        Value::String(_) => vec![v],
        Value::Array(a) => a.iter().collect(),
        _ => {
            return Err(ApiError::wrong_type(
                "stop",
                "a string or an array of strings",
                v,
            ))
        }
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::param(
            "stop",
            format!(
                "'stop' may hold at most {MAX_STOP_STRINGS} strings, got {}",
                list.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, s) in list.into_iter().enumerate() {
        let Value::String(s) = s else {
            return Err(ApiError::wrong_type(&format!("stop[{i}]"), "a string", s));
        };
        if s.is_empty() || s.len() > MAX_STOP_BYTES {
            return Err(ApiError::param(
                "stop",
                format!(
                    "each stop string must hold 1 to {MAX_STOP_BYTES} bytes, stop[{i}] has {}",
                    s.len()
                ),
            ));
        }
        out.push(s.clone());
    }
    Ok(out)
}

/// `logit_bias`: `{"token id": bias}`, biases in [-100, 100].
fn logit_bias(v: &Value, vocab_size: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Value::Object(map) = v else {
        return Err(ApiError::wrong_type(
            "logit_bias",
            "an object mapping token ids to biases",
            v,
        ));
    };
    if map.len() > MAX_TOKEN_LIST {
        return Err(ApiError::param(
            "logit_bias",
            format!(
                "'logit_bias' may hold at most {MAX_TOKEN_LIST} entries, got {}",
                map.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(map.len());
    for (key, bias) in map {
        let id = key
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&id| id < vocab_size as u64)
            .ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!(
                        "'logit_bias' keys must be token ids in [0, {}), got {key:?}",
                        vocab_size
                    ),
                )
            })?;
        let name = format!("logit_bias.{key}");
        let b = crate::fields::number_value(
            &name,
            bias,
            |b| (-100.0..=100.0).contains(&b),
            "in [-100, 100]",
        )
        .map_err(|e| e.with_param("logit_bias"))?;
        out.push((id as u32, b as f32));
    }
    Ok(out)
}

/// A list of token ids inside the vocabulary.
pub(crate) fn token_list(
    name: &str,
    v: &Value,
    vocab_size: usize,
    max_len: usize,
) -> Result<Vec<u32>, ApiError> {
    let Value::Array(a) = v else {
        return Err(ApiError::wrong_type(name, "an array of token ids", v));
    };
    if a.len() > max_len {
        return Err(ApiError::param(
            name,
            format!(
                "'{name}' may hold at most {max_len} tokens, got {}",
                a.len()
            ),
        ));
    }
    let max = vocab_size as i64 - 1;
    a.iter()
        .enumerate()
        .map(|(i, t)| {
            int_value(&format!("{name}[{i}]"), t, 0, max)
                .map(|t| t as u32)
                .map_err(|e| e.with_param(name))
        })
        .collect()
}
