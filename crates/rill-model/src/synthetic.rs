//! Tiny models with deterministic pseudo-random weights, for tests and demos.
//!
//! A [`SyntheticSpec`] describes the shape of a `llama` or `gemma3` model; [`SyntheticSpec::build`]
//! turns it into a [`SyntheticModel`]: the complete GGUF contents (metadata and tensors), still
//! editable, so a test can change or remove any entry before writing the file with
//! [`SyntheticModel::to_bytes`], [`SyntheticModel::write_to_path`] or
//! [`SyntheticModel::to_writer`]. The same spec and seed always give the same bytes.
//!
//! The vocabulary is byte-level BPE in GPT-2's byte alphabet (`tokenizer.ggml.model = gpt2`, no
//! merges): token `b` (for `b < 256`) is the single byte `b`, followed by the control tokens
//! [`CONTROL_TOKENS`] (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`), and a ChatML
//! `tokenizer.chat_template`. Any text therefore tokenizes to its UTF-8 bytes.
//!
//! Weights are uniform in `±scale / sqrt(cols)` (so every matrix product keeps activations of order
//! one), the token embedding in `±1`, and norm weights in `1 ± 0.2` (Gemma's GGUF norms already
//! include its `+1`). Matrices are stored as [`SyntheticSpec::weight_type`] (quantized with simple
//! reference quantizers written into ggml's block layouts); norms are always F32.
//!
//! ```
//! use rill_model::synthetic::SyntheticSpec;
//! let bytes = SyntheticSpec::llama_tiny().to_bytes().unwrap();
//! let file = rill_gguf::GgufFile::from_bytes(bytes).unwrap();
//! let model = rill_model::Model::from_file(file, 1).unwrap();
//! assert_eq!(model.config().vocab_size, rill_model::synthetic::VOCAB_SIZE);
//! ```

use std::path::Path;

use half::{bf16, f16};
use rill_gguf::{GgmlType, GgufError, GgufWriter, Value};

/// Control tokens after the 256 byte tokens, in id order (ids 256, 257, 258).
pub const CONTROL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// Id of `<|endoftext|>` (also the BOS id).
pub const ENDOFTEXT_ID: u32 = 256;
/// Id of `<|im_start|>`.
pub const IM_START_ID: u32 = 257;
/// Id of `<|im_end|>` (the EOS id).
pub const IM_END_ID: u32 = 258;
/// Vocabulary size of every synthetic model.
pub const VOCAB_SIZE: usize = 256 + CONTROL_TOKENS.len();

/// The ChatML template written as `tokenizer.chat_template`.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Errors building a synthetic model.
#[derive(Debug, thiserror::Error)]
pub enum SyntheticError {
    #[error("invalid synthetic model spec: {0}")]
    Spec(String),
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// The shape and numerics of a synthetic model.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSpec {
    /// `"llama"` or `"gemma3"` (written as `general.architecture`).
    pub architecture: String,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub context_length: usize,
    /// `{arch}.attention.sliding_window`, written when set.
    pub sliding_window: Option<usize>,
    /// `{arch}.attention.sliding_window_pattern`: layer `il` is global when
    /// `il % pattern == pattern - 1`. Written when `sliding_window` is set.
    pub sliding_window_pattern: usize,
    /// No `output.weight`: the head is the token embedding.
    pub tied_output: bool,
    /// Storage type of the matrices (token embedding and head included): F32, F16, BF16, Q8_0,
    /// Q4_0 or Q4_1. The quantized types need `d_model`, `n_heads * head_dim` and `ffn_dim` to be
    /// multiples of 32.
    pub weight_type: GgmlType,
    /// `{arch}.rope.freq_base`.
    pub rope_freq_base: f32,
    /// `{arch}.rope.freq_base_swa` (RoPE base of sliding-window layers), written when set.
    pub rope_freq_base_swa: Option<f32>,
    /// `{arch}.attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// Multiplier of the `1 / sqrt(cols)` range of matrix weights.
    pub weight_scale: f32,
    pub seed: u64,
}

impl SyntheticSpec {
    /// A 2-layer llama: 4 query heads sharing 2 KV heads (GQA), head size 16, untied head, Q8_0.
    pub fn llama_tiny() -> SyntheticSpec {
        SyntheticSpec {
            architecture: "llama".into(),
            n_layers: 2,
            d_model: 64,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            ffn_dim: 128,
            context_length: 256,
            sliding_window: None,
            sliding_window_pattern: 1,
            tied_output: false,
            weight_type: GgmlType::Q8_0,
            rope_freq_base: 10_000.0,
            rope_freq_base_swa: None,
            rms_eps: 1e-5,
            weight_scale: 1.5,
            seed: 0x5eed_11a3a,
        }
    }

    /// A 3-layer gemma3: 4 query heads on one KV head, head size 32 (so `n_heads * head_dim` is
    /// not `d_model`), tied head, sliding window 4 on layers 0 and 1 (pattern 3: layer 2 is
    /// global), global RoPE base 1e6 and the default local base 10000, Q8_0.
    pub fn gemma3_tiny() -> SyntheticSpec {
        SyntheticSpec {
            architecture: "gemma3".into(),
            n_layers: 3,
            d_model: 64,
            n_heads: 4,
            n_kv_heads: 1,
            head_dim: 32,
            ffn_dim: 96,
            context_length: 256,
            sliding_window: Some(4),
            sliding_window_pattern: 3,
            tied_output: true,
            weight_type: GgmlType::Q8_0,
            rope_freq_base: 1_000_000.0,
            rope_freq_base_swa: None,
            rms_eps: 1e-6,
            weight_scale: 1.5,
            seed: 0x9e33a3,
        }
    }

    /// Checks the spec describes a model rill can load.
    pub fn validate(&self) -> Result<(), SyntheticError> {
        let bad = |m: String| Err(SyntheticError::Spec(m));
        if !matches!(self.architecture.as_str(), "llama" | "gemma3") {
            return bad(format!(
                "architecture {:?} (expected llama or gemma3)",
                self.architecture
            ));
        }
        for (name, v) in [
            ("n_layers", self.n_layers),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("ffn_dim", self.ffn_dim),
            ("context_length", self.context_length),
            ("sliding_window_pattern", self.sliding_window_pattern),
        ] {
            if v == 0 {
                return bad(format!("{name} is 0"));
            }
        }
        let ungrouped = self.n_heads % self.n_kv_heads;
        if ungrouped != 0 {
            return bad(format!(
                "{} KV heads do not divide {} heads",
                self.n_kv_heads, self.n_heads
            ));
        }
        if self.head_dim & 1 == 1 {
            return bad(format!("head_dim {} is odd", self.head_dim));
        }
        if self.sliding_window == Some(0) {
            return bad("sliding_window is 0".into());
        }
        let block = match self.weight_type {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => 32,
            other => {
                return bad(format!(
                    "weight type {other} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"
                ))
            }
        };
        for (name, v) in [
            ("d_model", self.d_model),
            ("n_heads * head_dim", self.n_heads * self.head_dim),
            ("ffn_dim", self.ffn_dim),
        ] {
            if v % block != 0 {
                return bad(format!(
                    "{name} = {v} is not a multiple of {block} ({})",
                    self.weight_type
                ));
            }
        }
        Ok(())
    }

    /// The model's metadata and tensors, ready to be edited or written.
    pub fn build(&self) -> Result<SyntheticModel, SyntheticError> {
        self.validate()?;
        let arch = self.architecture.as_str();
        let gemma = arch == "gemma3";
        let mut m = SyntheticModel::default();
        let u32v = |v: usize| Value::U32(v as u32);
        let k = |s: &str| format!("{arch}.{s}");

        m.set_metadata("general.architecture", Value::String(arch.into()));
        m.set_metadata(
            "general.name",
            Value::String(format!("rill synthetic {arch}")),
        );
        m.set_metadata(k("block_count"), u32v(self.n_layers));
        m.set_metadata(k("context_length"), u32v(self.context_length));
        m.set_metadata(k("embedding_length"), u32v(self.d_model));
        m.set_metadata(k("feed_forward_length"), u32v(self.ffn_dim));
        m.set_metadata(k("attention.head_count"), u32v(self.n_heads));
        m.set_metadata(k("attention.head_count_kv"), u32v(self.n_kv_heads));
        m.set_metadata(k("attention.key_length"), u32v(self.head_dim));
        m.set_metadata(k("attention.value_length"), u32v(self.head_dim));
        m.set_metadata(
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(self.rms_eps),
        );
        m.set_metadata(k("rope.freq_base"), Value::F32(self.rope_freq_base));
        if let Some(b) = self.rope_freq_base_swa {
            m.set_metadata(k("rope.freq_base_swa"), Value::F32(b));
        }
        if let Some(w) = self.sliding_window {
            m.set_metadata(k("attention.sliding_window"), u32v(w));
            m.set_metadata(
                k("attention.sliding_window_pattern"),
                u32v(self.sliding_window_pattern),
            );
        }
        m.set_metadata(k("vocab_size"), u32v(VOCAB_SIZE));
        for (key, value) in tokenizer_metadata() {
            m.set_metadata(key, value);
        }

        let mut rng = Rng::new(self.seed);
        let d = self.d_model;
        let q_dim = self.n_heads * self.head_dim;
        let kv_dim = self.n_kv_heads * self.head_dim;
        let mut matrix =
            |m: &mut SyntheticModel, name: String, cols: usize, rows: usize, scale: f32| {
                let values: Vec<f32> = (0..rows * cols).map(|_| rng.uniform() * scale).collect();
                let data = encode(self.weight_type, &values, cols);
                m.tensors.push(SyntheticTensor {
                    name,
                    dims: vec![cols as u64, rows as u64],
                    ggml_type: self.weight_type,
                    data,
                });
            };
        let ws = |cols: usize| self.weight_scale / (cols as f32).sqrt();
        matrix(&mut m, "token_embd.weight".into(), d, VOCAB_SIZE, 1.0);
        for il in 0..self.n_layers {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            matrix(&mut m, n("attn_q"), d, q_dim, ws(d));
            matrix(&mut m, n("attn_k"), d, kv_dim, ws(d));
            matrix(&mut m, n("attn_v"), d, kv_dim, ws(d));
            matrix(&mut m, n("attn_output"), q_dim, d, ws(q_dim));
            matrix(&mut m, n("ffn_gate"), d, self.ffn_dim, ws(d));
            matrix(&mut m, n("ffn_up"), d, self.ffn_dim, ws(d));
            matrix(&mut m, n("ffn_down"), self.ffn_dim, d, ws(self.ffn_dim));
        }
        if !self.tied_output {
            matrix(&mut m, "output.weight".into(), d, VOCAB_SIZE, ws(d) * 4.0);
        }
        let mut norm = |m: &mut SyntheticModel, name: String, n: usize| {
            let values: Vec<f32> = (0..n).map(|_| 1.0 + 0.2 * rng.uniform()).collect();
            m.tensors.push(SyntheticTensor {
                name,
                dims: vec![n as u64],
                ggml_type: GgmlType::F32,
                data: encode(GgmlType::F32, &values, n),
            });
        };
        norm(&mut m, "output_norm.weight".into(), d);
        for il in 0..self.n_layers {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            norm(&mut m, n("attn_norm"), d);
            norm(&mut m, n("ffn_norm"), d);
            if gemma {
                norm(&mut m, n("attn_q_norm"), self.head_dim);
                norm(&mut m, n("attn_k_norm"), self.head_dim);
                norm(&mut m, n("post_attention_norm"), d);
                norm(&mut m, n("post_ffw_norm"), d);
            }
        }
        Ok(m)
    }

    /// [`build`](Self::build) then [`SyntheticModel::to_writer`].
    pub fn writer(&self) -> Result<GgufWriter, SyntheticError> {
        self.build()?.to_writer()
    }

    /// The complete GGUF file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, SyntheticError> {
        self.build()?.to_bytes()
    }

    /// Writes the GGUF file to `path`.
    pub fn write_to_path(&self, path: impl AsRef<Path>) -> Result<(), SyntheticError> {
        self.build()?.write_to_path(path)
    }
}

/// One tensor of a [`SyntheticModel`]: `dims` in ggml order (`[cols, rows]`), `data` exactly the
/// bytes its type and shape need (unless a test breaks that on purpose; the writer checks it).
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub data: Vec<u8>,
}

/// The contents of a synthetic GGUF file, in file order, free to edit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SyntheticModel {
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<SyntheticTensor>,
}

impl SyntheticModel {
    /// Sets a metadata entry (replacing it in place if present, else appending it).
    pub fn set_metadata(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Removes a metadata entry, returning its value.
    pub fn remove_metadata(&mut self, key: &str) -> Option<Value> {
        let i = self.metadata.iter().position(|(k, _)| k == key)?;
        Some(self.metadata.remove(i).1)
    }

    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&SyntheticTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    pub fn tensor_mut(&mut self, name: &str) -> Option<&mut SyntheticTensor> {
        self.tensors.iter_mut().find(|t| t.name == name)
    }

    /// Removes a tensor, returning it.
    pub fn remove_tensor(&mut self, name: &str) -> Option<SyntheticTensor> {
        let i = self.tensors.iter().position(|t| t.name == name)?;
        Some(self.tensors.remove(i))
    }

    /// A writer holding every entry and tensor.
    pub fn to_writer(&self) -> Result<GgufWriter, SyntheticError> {
        let mut w = GgufWriter::new();
        for (k, v) in &self.metadata {
            w.add_metadata(k.clone(), v.clone())?;
        }
        for t in &self.tensors {
            w.add_tensor(t.name.clone(), &t.dims, t.ggml_type, t.data.clone())?;
        }
        Ok(w)
    }

    /// The complete GGUF file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, SyntheticError> {
        Ok(self.to_writer()?.to_bytes()?)
    }

    /// Writes the GGUF file to `path`.
    pub fn write_to_path(&self, path: impl AsRef<Path>) -> Result<(), SyntheticError> {
        Ok(self.to_writer()?.write_to_path(path)?)
    }
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the others are shifted
/// to code points 256 and up, in byte order.
pub fn gpt2_byte_char(b: u8) -> char {
    let printable = |c: u32| {
        (0x21..=0x7E).contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c)
    };
    let b = u32::from(b);
    if printable(b) {
        return char::from_u32(b).expect("a byte is a valid code point");
    }
    let shifted = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + shifted).expect("below 0x200")
}

/// The `tokenizer.*` entries of every synthetic model.
fn tokenizer_metadata() -> Vec<(String, Value)> {
    let mut tokens: Vec<Value> = (0..=255u8)
        .map(|b| Value::String(gpt2_byte_char(b).to_string()))
        .collect();
    let mut types: Vec<Value> = vec![Value::I32(1); 256];
    for t in CONTROL_TOKENS {
        tokens.push(Value::String(t.into()));
        types.push(Value::I32(3));
    }
    let s = |v: &str| Value::String(v.into());
    vec![
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("gpt-2")),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(Vec::new())),
        (
            "tokenizer.ggml.bos_token_id".into(),
            Value::U32(ENDOFTEXT_ID),
        ),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(IM_END_ID)),
        (
            "tokenizer.ggml.padding_token_id".into(),
            Value::U32(ENDOFTEXT_ID),
        ),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
        ("tokenizer.chat_template".into(), s(CHATML_TEMPLATE)),
    ]
}

/// SplitMix64: tiny, fast, and good enough for test weights.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        // 24 random bits: exactly representable in f32.
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        2.0 * u - 1.0
    }
}

/// Encodes `values` (rows of `cols`) as `ty`. The type and `cols` were validated.
fn encode(ty: GgmlType, values: &[f32], cols: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q4_1 => {
            debug_assert_eq!(cols % 32, 0);
            let mut out = Vec::new();
            for block in values.chunks_exact(32) {
                // The kernels' quantizers round as ggml's reference ones do.
                let quantized =
                    |f: fn(&[f32], &mut [u8]) -> Result<(), _>, bytes, out: &mut Vec<u8>| {
                        let at = out.len();
                        out.resize(at + bytes, 0);
                        f(block, &mut out[at..]).expect("one whole block");
                    };
                match ty {
                    GgmlType::Q8_0 => quantized(rill_kernels::quantize_row_q8_0, 34, &mut out),
                    GgmlType::Q4_0 => quantized(rill_kernels::quantize_row_q4_0, 18, &mut out),
                    _ => quantize_block_q4_1(block, &mut out),
                }
            }
            out
        }
        other => unreachable!("validate() rejects {other}"),
    }
}

/// ggml's `quantize_row_q4_1_ref`: `d = (max - min) / 15`, `m = min`,
/// `q = min(15, trunc((x - min) / d + 0.5))`, nibbles as in Q4_0.
fn quantize_block_q4_1(x: &[f32], out: &mut Vec<u8>) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
    let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
    out.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
        let qt = rill_kernels::QuantType::from_ggml_id(ty.id()).unwrap();
        let mut out = vec![0.0; n];
        rill_kernels::dequantize_row(qt, bytes, &mut out).unwrap();
        out
    }

    #[test]
    fn quantizers_round_trip_within_a_step() {
        let mut rng = Rng::new(7);
        let x: Vec<f32> = (0..256).map(|_| rng.uniform() * 0.3).collect();
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_1,
        ] {
            let bytes = encode(ty, &x, 256);
            assert_eq!(bytes.len() as u64, ty.bytes_for(256).unwrap(), "{ty}");
            let y = dequant(ty, &bytes, 256);
            for (bx, by) in x.chunks(32).zip(y.chunks(32)) {
                let amax = bx.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let min = bx.iter().copied().fold(f32::INFINITY, f32::min);
                let max = bx.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                for (&a, &b) in bx.iter().zip(by) {
                    // Half a quantization step, plus the rounding of the f16 scale (and min).
                    let tol = match ty {
                        GgmlType::F32 => 0.0,
                        GgmlType::F16 => a.abs() / 2048.0,
                        GgmlType::BF16 => a.abs() / 256.0,
                        GgmlType::Q8_0 => amax / 127.0 * 0.6,
                        // The level +8 does not exist: values opposite the extreme clamp to +7.
                        GgmlType::Q4_0 => amax / 8.0 * 1.05,
                        _ => (max - min) / 15.0 * 0.6 + min.abs() / 2048.0,
                    };
                    assert!((a - b).abs() <= tol, "{ty}: {a} vs {b} (tol {tol})");
                }
            }
        }
    }

    #[test]
    fn gpt2_alphabet_is_a_bijection() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(gpt2_byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(gpt2_byte_char(b' '), 'Ġ');
        assert_eq!(gpt2_byte_char(b'\n'), 'Ċ');
        assert_eq!(gpt2_byte_char(b'a'), 'a');
    }

    #[test]
    fn same_spec_same_bytes_and_the_seed_matters() {
        let a = SyntheticSpec::llama_tiny().to_bytes().unwrap();
        let b = SyntheticSpec::llama_tiny().to_bytes().unwrap();
        assert_eq!(a, b);
        let c = SyntheticSpec {
            seed: 1,
            ..SyntheticSpec::llama_tiny()
        }
        .to_bytes()
        .unwrap();
        assert_eq!(a.len(), c.len());
        assert_ne!(a, c);
    }

    #[test]
    fn bad_specs_are_rejected() {
        let q = SyntheticSpec {
            d_model: 48,
            ..SyntheticSpec::llama_tiny()
        };
        assert!(matches!(q.build(), Err(SyntheticError::Spec(_))));
        let a = SyntheticSpec {
            architecture: "mamba".into(),
            ..SyntheticSpec::llama_tiny()
        };
        assert!(a.build().is_err());
        let t = SyntheticSpec {
            weight_type: GgmlType::Q4_K,
            ..SyntheticSpec::llama_tiny()
        };
        assert!(t.build().is_err());
    }
}
