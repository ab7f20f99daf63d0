//! Reproducibility receipts: everything a generation's tokens depended on (the model file's
//! sha256, rill's version, the kernel paths, the precision and KV types, the prompt's token ids,
//! every sampling and stop parameter with the seed) and the tokens each choice produced. A replay
//! generates again from the receipt and compares the tokens bit for bit; batch invariance and
//! bit-exact kernels are what make that hold on any machine, thread count and server load.
//! Written by `rill run --receipt` and the server (`/v1/rill/receipts/ID`), checked by
//! `rill replay` and `/v1/rill/replay`.

use rill_model::{KvDtype, KvTypes, Precision};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::{GenerateParams, SamplingParams, Stage};

/// The receipt format this build writes and reads.
pub const RECEIPT_VERSION: u64 = 1;

/// A receipt that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptError {
    #[error("not a rill receipt (version {RECEIPT_VERSION}): {0}")]
    NotAReceipt(String),
    #[error("the receipt has no {0:?}")]
    Missing(String),
    #[error("the receipt's {field:?} {problem}")]
    Bad { field: String, problem: String },
}

fn bad(field: &str, problem: impl Into<String>) -> ReceiptError {
    ReceiptError::Bad {
        field: field.into(),
        problem: problem.into(),
    }
}

/// Which model file: its sha256 decides, the path and name are for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    pub sha256: String,
    pub bytes: u64,
    pub path: Option<String>,
    pub name: Option<String>,
}

impl ModelIdentity {
    /// The identity of a file's bytes (the mapped model file itself: the very bytes loaded).
    pub fn of_bytes(bytes: &[u8]) -> ModelIdentity {
        ModelIdentity {
            sha256: sha256_hex(bytes),
            bytes: bytes.len() as u64,
            path: None,
            name: None,
        }
    }
}

/// Lowercase hex sha256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Lowercase hex sha256 of a file and its size, read in 1 MiB pieces.
pub fn sha256_file(path: &std::path::Path) -> std::io::Result<(String, u64)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    let hex = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((hex, total))
}

/// What one choice produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptChoice {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish: String,
}

/// A generation's receipt.
#[derive(Debug, Clone)]
pub struct Receipt {
    pub model: ModelIdentity,
    pub rill_version: String,
    /// The kernel paths of the machine that generated (informational: any path gives the same
    /// bits).
    pub kernels: String,
    pub precision: Precision,
    /// None in receipts from before KV types were recorded (the precision's default).
    pub kv_types: Option<KvTypes>,
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// Choice `c` sampled with seed `params.sampling.seed + c`.
    pub choices: Vec<ReceiptChoice>,
    /// The server response it belongs to, if any.
    pub response_id: Option<String>,
}

/// Which kernel paths this CPU runs (the same bits on every one of them).
pub fn kernel_paths() -> String {
    let mut paths = vec![format!("{:?}", rill_kernels::cpu_path())];
    if rill_kernels::has_vnni() {
        paths.push("AVX512-VNNI".into());
    }
    if rill_kernels::wide_tiles() {
        paths.push("512-bit tiles".into());
        if rill_kernels::has_amx() {
            paths.push("AMX tiles".into());
        }
    }
    paths.join(", ")
}

pub fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Exact => "exact",
        Precision::Fast => "fast",
    }
}

/// How a replay compares with its receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayVerdict {
    /// Every choice's tokens are the receipt's: how many tokens in all.
    Identical { tokens: usize },
    /// The first difference: choice, generated-token index, and the two tokens there (None past
    /// an end).
    Differs {
        choice: usize,
        at: usize,
        got: Option<u32>,
        want: Option<u32>,
        got_len: usize,
        want_len: usize,
    },
}

impl Receipt {
    /// Compares replayed tokens, one list per choice, with the receipt's.
    pub fn verdict(&self, replayed: &[Vec<u32>]) -> ReplayVerdict {
        for (c, want) in self.choices.iter().enumerate() {
            let got = replayed.get(c).map_or(&[][..], Vec::as_slice);
            if got != want.tokens.as_slice() {
                let at = got
                    .iter()
                    .zip(&want.tokens)
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(want.tokens.len()));
                return ReplayVerdict::Differs {
                    choice: c,
                    at,
                    got: got.get(at).copied(),
                    want: want.tokens.get(at).copied(),
                    got_len: got.len(),
                    want_len: want.tokens.len(),
                };
            }
        }
        ReplayVerdict::Identical {
            tokens: self.choices.iter().map(|c| c.tokens.len()).sum(),
        }
    }

    pub fn to_json(&self) -> Value {
        let p = &self.params;
        let s = &p.sampling;
        let first = self.choices.first();
        let mut v = json!({
            "rill_receipt": RECEIPT_VERSION,
            "rill_version": self.rill_version,
            "model": {
                "path": self.model.path,
                "name": self.model.name,
                "sha256": self.model.sha256,
                "bytes": self.model.bytes,
            },
            "kernels": self.kernels,
            "precision": precision_name(self.precision),
            "prompt_token_ids": self.prompt,
            "params": {
                "max_tokens": p.max_tokens,
                "temperature": s.temperature,
                "seed": s.seed,
                "top_k": s.top_k,
                "top_p": s.top_p,
                "min_p": s.min_p,
                "typical_p": s.typical_p,
                "repeat_penalty": s.repeat_penalty,
                "repeat_last_n": if s.repeat_last_n == usize::MAX { -1 } else { s.repeat_last_n as i64 },
                "presence_penalty": s.presence_penalty,
                "frequency_penalty": s.frequency_penalty,
                "logit_bias": s.logit_bias,
                "banned_tokens": s.banned_tokens,
                "order": s.order.iter().map(|o| o.name()).collect::<Vec<_>>(),
                "ignore_eos": p.ignore_eos,
                "min_tokens": p.min_tokens,
                "stop": p.stop,
                "stop_token_ids": p.stop_token_ids,
            },
            "tokens": first.map(|c| c.tokens.clone()).unwrap_or_default(),
            "text": first.map(|c| c.text.clone()).unwrap_or_default(),
            "finish": first.map(|c| c.finish.clone()).unwrap_or_default(),
        });
        if let Some(t) = self.kv_types {
            v["kv_types"] = json!({ "keys": t.keys.name(), "values": t.values.name() });
        }
        if self.choices.len() > 1 {
            v["n"] = json!(self.choices.len());
            v["choices"] = self
                .choices
                .iter()
                .map(|c| json!({ "tokens": c.tokens, "text": c.text, "finish": c.finish }))
                .collect();
        }
        if let Some(id) = &self.response_id {
            v["response_id"] = json!(id);
        }
        v
    }

    pub fn from_json(v: &Value) -> Result<Receipt, ReceiptError> {
        if !v.is_object() {
            return Err(ReceiptError::NotAReceipt("not a JSON object".into()));
        }
        if v.get("rill_receipt").and_then(Value::as_u64) != Some(RECEIPT_VERSION) {
            return Err(ReceiptError::NotAReceipt(
                "no \"rill_receipt\": 1 field".into(),
            ));
        }
        let model = field(v, "model")?;
        let opt_str = |key: &str| model.get(key).and_then(Value::as_str).map(str::to_string);
        let identity = ModelIdentity {
            sha256: str_of(model, "sha256")?.to_string(),
            bytes: model.get("bytes").and_then(Value::as_u64).unwrap_or(0),
            path: opt_str("path"),
            name: opt_str("name"),
        };
        let precision = match str_of(v, "precision")? {
            "exact" => Precision::Exact,
            "fast" => Precision::Fast,
            other => return Err(bad("precision", format!("is {other:?}, not exact or fast"))),
        };
        let kv_types = match v.get("kv_types") {
            None | Some(Value::Null) => None,
            Some(types) => {
                let of = |key: &str| -> Result<KvDtype, ReceiptError> {
                    let name = types.get(key).and_then(Value::as_str).unwrap_or("");
                    KvDtype::parse(name)
                        .ok_or_else(|| bad("kv_types", format!("names an unknown type {name:?}")))
                };
                Some(KvTypes {
                    keys: of("keys")?,
                    values: of("values")?,
                })
            }
        };
        let choice_of = |c: &Value| -> Result<ReceiptChoice, ReceiptError> {
            Ok(ReceiptChoice {
                tokens: ids_of(c, "tokens")?,
                text: c.get("text").and_then(Value::as_str).unwrap_or("").into(),
                finish: c.get("finish").and_then(Value::as_str).unwrap_or("").into(),
            })
        };
        let choices = match v.get("choices") {
            Some(Value::Array(list)) => list.iter().map(choice_of).collect::<Result<_, _>>()?,
            Some(_) => return Err(bad("choices", "is not an array")),
            None => vec![choice_of(v)?],
        };
        if choices.is_empty() || choices.len() > crate::MAX_CHOICES {
            return Err(bad(
                "choices",
                format!("must hold 1 to {} choices", crate::MAX_CHOICES),
            ));
        }
        Ok(Receipt {
            model: identity,
            rill_version: v
                .get("rill_version")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .into(),
            kernels: v
                .get("kernels")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .into(),
            precision,
            kv_types,
            prompt: ids_of(v, "prompt_token_ids")?,
            params: params_of(field(v, "params")?)?,
            choices,
            response_id: v
                .get("response_id")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

fn field<'a>(v: &'a Value, key: &str) -> Result<&'a Value, ReceiptError> {
    v.get(key).ok_or_else(|| ReceiptError::Missing(key.into()))
}

fn str_of<'a>(v: &'a Value, key: &str) -> Result<&'a str, ReceiptError> {
    field(v, key)?
        .as_str()
        .ok_or_else(|| bad(key, "is not a string"))
}

fn f32_of(v: &Value, key: &str) -> Result<f32, ReceiptError> {
    Ok(field(v, key)?
        .as_f64()
        .ok_or_else(|| bad(key, "is not a number"))? as f32)
}

fn u64_of(v: &Value, key: &str) -> Result<u64, ReceiptError> {
    field(v, key)?
        .as_u64()
        .ok_or_else(|| bad(key, "is not a non-negative integer"))
}

fn ids_of(v: &Value, key: &str) -> Result<Vec<u32>, ReceiptError> {
    field(v, key)?
        .as_array()
        .ok_or_else(|| bad(key, "is not an array"))?
        .iter()
        .map(|x| {
            x.as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| bad(key, "holds a value that is not a token id"))
        })
        .collect()
}

/// The generation parameters a receipt records.
fn params_of(p: &Value) -> Result<GenerateParams, ReceiptError> {
    let order = field(p, "order")?
        .as_array()
        .ok_or_else(|| bad("order", "is not an array"))?
        .iter()
        .map(|o| {
            o.as_str()
                .ok_or_else(|| bad("order", "holds a stage that is not a string"))?
                .parse::<Stage>()
                .map_err(|e| bad("order", e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let logit_bias = field(p, "logit_bias")?
        .as_array()
        .ok_or_else(|| bad("logit_bias", "is not an array"))?
        .iter()
        .map(|e| {
            let id = e[0]
                .as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| bad("logit_bias", "holds an entry without a token id"))?;
            let b = e[1]
                .as_f64()
                .ok_or_else(|| bad("logit_bias", "holds an entry without a bias"))?;
            Ok((id, b as f32))
        })
        .collect::<Result<Vec<_>, ReceiptError>>()?;
    let repeat_last_n = match field(p, "repeat_last_n")?.as_i64() {
        Some(-1) => usize::MAX,
        Some(n) if n >= 0 => n as usize,
        _ => return Err(bad("repeat_last_n", "is not an integer >= -1")),
    };
    let stop = field(p, "stop")?
        .as_array()
        .ok_or_else(|| bad("stop", "is not an array"))?
        .iter()
        .map(|s| {
            s.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad("stop", "holds a value that is not a string"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(GenerateParams {
        max_tokens: u64_of(p, "max_tokens")? as usize,
        sampling: SamplingParams {
            temperature: f32_of(p, "temperature")?,
            seed: u64_of(p, "seed")?,
            top_k: u64_of(p, "top_k")? as usize,
            top_p: f32_of(p, "top_p")?,
            min_p: f32_of(p, "min_p")?,
            typical_p: f32_of(p, "typical_p")?,
            repeat_penalty: f32_of(p, "repeat_penalty")?,
            repeat_last_n,
            presence_penalty: f32_of(p, "presence_penalty")?,
            frequency_penalty: f32_of(p, "frequency_penalty")?,
            logit_bias,
            banned_tokens: ids_of(p, "banned_tokens")?,
            order,
        },
        ignore_eos: field(p, "ignore_eos")?
            .as_bool()
            .ok_or_else(|| bad("ignore_eos", "is not a boolean"))?,
        min_tokens: u64_of(p, "min_tokens")? as usize,
        stop,
        stop_token_ids: ids_of(p, "stop_token_ids")?,
        ..GenerateParams::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt() -> Receipt {
        Receipt {
            model: ModelIdentity::of_bytes(b"model"),
            rill_version: "0.1.0".into(),
            kernels: kernel_paths(),
            precision: Precision::Fast,
            kv_types: Some(KvTypes {
                keys: KvDtype::Q8_0,
                values: KvDtype::F16,
            }),
            prompt: vec![1, 2, 3],
            params: GenerateParams {
                max_tokens: 9,
                stop: vec!["\n".into()],
                ..GenerateParams::default()
            },
            choices: vec![
                ReceiptChoice {
                    tokens: vec![4, 5],
                    text: "ab".into(),
                    finish: "length".into(),
                },
                ReceiptChoice {
                    tokens: vec![6],
                    text: "c".into(),
                    finish: "stop".into(),
                },
            ],
            response_id: Some("cmpl-1".into()),
        }
    }

    #[test]
    fn a_receipt_reads_back_what_it_wrote() {
        let r = receipt();
        let back = Receipt::from_json(&r.to_json()).unwrap();
        assert_eq!(back.to_json(), r.to_json());
        assert_eq!(back.choices, r.choices);
        // Python: hashlib.sha256(b"model").hexdigest()
        assert_eq!(
            r.model.sha256,
            "9372c470eeadd5ecd9c3c74c2b3cb633f8e2f2fad799250a0f70d652b6b825e4"
        );
    }

    #[test]
    fn the_verdict_names_the_first_difference() {
        let r = receipt();
        assert_eq!(
            r.verdict(&[vec![4, 5], vec![6]]),
            ReplayVerdict::Identical { tokens: 3 }
        );
        assert_eq!(
            r.verdict(&[vec![4, 5], vec![7]]),
            ReplayVerdict::Differs {
                choice: 1,
                at: 0,
                got: Some(7),
                want: Some(6),
                got_len: 1,
                want_len: 1
            }
        );
        assert_eq!(
            r.verdict(&[vec![4]]),
            ReplayVerdict::Differs {
                choice: 0,
                at: 1,
                got: None,
                want: Some(5),
                got_len: 1,
                want_len: 2
            }
        );
    }

    #[test]
    fn broken_receipts_are_named_errors() {
        assert!(matches!(
            Receipt::from_json(&json!([1])),
            Err(ReceiptError::NotAReceipt(_))
        ));
        let mut v = receipt().to_json();
        v["params"]["order"] = json!(["nonsense"]);
        assert!(matches!(
            Receipt::from_json(&v),
            Err(ReceiptError::Bad { .. })
        ));
        let mut v = receipt().to_json();
        v.as_object_mut().unwrap().remove("prompt_token_ids");
        assert!(matches!(
            Receipt::from_json(&v),
            Err(ReceiptError::Missing(_))
        ));
        let mut v = receipt().to_json();
        v["choices"] = json!([]);
        assert!(Receipt::from_json(&v).is_err());
    }
}
