//! Every architecture feature on tiny synthetic models, checked against a deliberately plain
//! reference forward pass written here (f64, weights dequantized once, the whole sequence
//! recomputed for every call, textbook attention), plus prefill/decode/chunk agreement, batch
//! invariance, KV-cache fork and truncate, and errors that leave the cache usable.

#[allow(dead_code)] // the KV-cache binaries use the rest of it
#[path = "../common/mod.rs"]
mod common;

use common::extend;
use rill_gguf::{GgmlType, GgufFile};
use rill_kernels::QuantType;
use rill_model::synthetic::{SyntheticSpec, VOCAB_SIZE};
use rill_model::{Batch, KvCache, KvDtype, KvError, KvTypes, Model, ModelError, Precision};

// ---------------------------------------------------------------------------------------------
// The reference.

/// What the reference computes, read from the spec (not from rill's config parsing), so each
/// feature can be switched off to show that the synthetic models exercise it.
#[derive(Clone, Debug)]
struct RefConfig {
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    eps: f64,
    /// NeoX (half-split) rotary pairs instead of adjacent pairs.
    rope_neox: bool,
    rope_base: f64,
    rope_base_local: f64,
    gelu: bool,
    embed_scale: bool,
    qk_norm: bool,
    post_norms: bool,
    window: Option<usize>,
    pattern: usize,
}

impl RefConfig {
    fn from_spec(s: &SyntheticSpec) -> RefConfig {
        let gemma = s.architecture == "gemma3";
        RefConfig {
            n_heads: s.n_heads,
            n_kv_heads: s.n_kv_heads,
            head_dim: s.head_dim,
            eps: f64::from(s.rms_eps),
            rope_neox: gemma,
            rope_base: f64::from(s.rope_freq_base),
            rope_base_local: if gemma {
                f64::from(s.rope_freq_base_swa.unwrap_or(10_000.0))
            } else {
                f64::from(s.rope_freq_base)
            },
            gelu: gemma,
            embed_scale: gemma,
            qk_norm: gemma,
            post_norms: gemma,
            window: if gemma { s.sliding_window } else { None },
            pattern: s.sliding_window_pattern,
        }
    }

    fn is_sliding(&self, il: usize) -> bool {
        self.window.is_some() && il % self.pattern != self.pattern - 1
    }
}

/// A dense matrix: `rows` rows of `cols`.
struct Mat {
    rows: usize,
    cols: usize,
    w: Vec<f64>,
}

impl Mat {
    fn mul(&self, x: &[f64]) -> Vec<f64> {
        assert_eq!(x.len(), self.cols);
        (0..self.rows)
            .map(|r| {
                self.w[r * self.cols..(r + 1) * self.cols]
                    .iter()
                    .zip(x)
                    .map(|(a, b)| a * b)
                    .sum()
            })
            .collect()
    }

    fn row(&self, r: usize) -> &[f64] {
        &self.w[r * self.cols..(r + 1) * self.cols]
    }
}

struct RefLayer {
    attn_norm: Vec<f64>,
    wq: Mat,
    wk: Mat,
    wv: Mat,
    wo: Mat,
    q_norm: Option<Vec<f64>>,
    k_norm: Option<Vec<f64>>,
    post_attn_norm: Option<Vec<f64>>,
    ffn_norm: Vec<f64>,
    gate: Mat,
    up: Mat,
    down: Mat,
    post_ffn_norm: Option<Vec<f64>>,
}

struct Reference {
    cfg: RefConfig,
    embd: Mat,
    output: Mat,
    output_norm: Vec<f64>,
    layers: Vec<RefLayer>,
}

fn dequant(file: &GgufFile, name: &str) -> Mat {
    let info = file
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} missing"));
    let cols = info.dims[0] as usize;
    let rows = info.dims.get(1).copied().unwrap_or(1) as usize;
    let ty = QuantType::from_ggml_id(info.ggml_type.id()).unwrap();
    let mut w = vec![0f32; rows * cols];
    rill_kernels::dequantize_row(ty, file.tensor_data(info), &mut w).unwrap();
    Mat {
        rows,
        cols,
        w: w.into_iter().map(f64::from).collect(),
    }
}

impl Reference {
    fn new(spec: &SyntheticSpec, file: &GgufFile) -> Reference {
        let cfg = RefConfig::from_spec(spec);
        let vec = |n: &str| dequant(file, n).w;
        let opt = |n: String| file.tensor(&n).map(|_| vec(&n));
        let embd = dequant(file, "token_embd.weight");
        let output = if file.tensor("output.weight").is_some() {
            dequant(file, "output.weight")
        } else {
            dequant(file, "token_embd.weight")
        };
        let layers = (0..spec.n_layers)
            .map(|il| {
                let n = |s: &str| format!("blk.{il}.{s}.weight");
                RefLayer {
                    attn_norm: vec(&n("attn_norm")),
                    wq: dequant(file, &n("attn_q")),
                    wk: dequant(file, &n("attn_k")),
                    wv: dequant(file, &n("attn_v")),
                    wo: dequant(file, &n("attn_output")),
                    q_norm: opt(n("attn_q_norm")),
                    k_norm: opt(n("attn_k_norm")),
                    post_attn_norm: opt(n("post_attention_norm")),
                    ffn_norm: vec(&n("ffn_norm")),
                    gate: dequant(file, &n("ffn_gate")),
                    up: dequant(file, &n("ffn_up")),
                    down: dequant(file, &n("ffn_down")),
                    post_ffn_norm: opt(n("post_ffw_norm")),
                }
            })
            .collect();
        Reference {
            cfg,
            embd,
            output,
            output_norm: vec("output_norm.weight"),
            layers,
        }
    }

    /// Logits after every position of `tokens` (positions 0..), computed from scratch.
    fn forward(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let c = &self.cfg;
        let d = self.embd.cols;
        let hd = c.head_dim;
        let n = tokens.len();
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| {
                let scale = if c.embed_scale {
                    (d as f64).sqrt()
                } else {
                    1.0
                };
                self.embd
                    .row(t as usize)
                    .iter()
                    .map(|v| v * scale)
                    .collect()
            })
            .collect();
        for (il, l) in self.layers.iter().enumerate() {
            let sliding = c.is_sliding(il);
            let base = if sliding {
                c.rope_base_local
            } else {
                c.rope_base
            };
            let mut q = Vec::new();
            let mut k = Vec::new();
            let mut v = Vec::new();
            for (pos, xt) in x.iter().enumerate() {
                let h = rms_norm(xt, &l.attn_norm, c.eps);
                let mut qt = l.wq.mul(&h);
                let mut kt = l.wk.mul(&h);
                for head in qt.chunks_mut(hd) {
                    if let (true, Some(w)) = (c.qk_norm, &l.q_norm) {
                        head.copy_from_slice(&rms_norm(head, w, c.eps));
                    }
                    rope(head, pos, base, c.rope_neox);
                }
                for head in kt.chunks_mut(hd) {
                    if let (true, Some(w)) = (c.qk_norm, &l.k_norm) {
                        head.copy_from_slice(&rms_norm(head, w, c.eps));
                    }
                    rope(head, pos, base, c.rope_neox);
                }
                q.push(qt);
                k.push(kt);
                v.push(l.wv.mul(&h));
            }
            let group = c.n_heads / c.n_kv_heads;
            for t in 0..n {
                let mut attn = vec![0.0; c.n_heads * hd];
                for head in 0..c.n_heads {
                    let kvh = head / group;
                    let qh = &q[t][head * hd..(head + 1) * hd];
                    // Causal, and within the window on sliding layers.
                    let visible: Vec<usize> = (0..=t)
                        .filter(|&s| !sliding || t - s < c.window.unwrap())
                        .collect();
                    let scores: Vec<f64> = visible
                        .iter()
                        .map(|&s| {
                            let kh = &k[s][kvh * hd..(kvh + 1) * hd];
                            qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (&s, p) in visible.iter().zip(&e) {
                        for i in 0..hd {
                            attn[head * hd + i] += p / z * v[s][kvh * hd + i];
                        }
                    }
                }
                let mut o = l.wo.mul(&attn);
                if let (true, Some(w)) = (c.post_norms, &l.post_attn_norm) {
                    o = rms_norm(&o, w, c.eps);
                }
                add(&mut x[t], &o);
                let h = rms_norm(&x[t], &l.ffn_norm, c.eps);
                let g = l.gate.mul(&h);
                let u = l.up.mul(&h);
                let a: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(&g, &u)| if c.gelu { gelu_tanh(g) } else { silu(g) } * u)
                    .collect();
                let mut y = l.down.mul(&a);
                if let (true, Some(w)) = (c.post_norms, &l.post_ffn_norm) {
                    y = rms_norm(&y, w, c.eps);
                }
                add(&mut x[t], &y);
            }
        }
        x.iter()
            .map(|xt| self.output.mul(&rms_norm(xt, &self.output_norm, c.eps)))
            .collect()
    }
}

fn rms_norm(x: &[f64], w: &[f64], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * s * w).collect()
}

/// Rotates pairs (2i, 2i+1) (adjacent) or (i, i + d/2) (NeoX) by `pos / base^(2i/d)`.
fn rope(head: &mut [f64], pos: usize, base: f64, neox: bool) {
    let d = head.len();
    for i in 0..d / 2 {
        let theta = pos as f64 * base.powf(-2.0 * i as f64 / d as f64);
        let (a, b) = if neox {
            (i, i + d / 2)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * theta.cos() - x1 * theta.sin();
        head[b] = x0 * theta.sin() + x1 * theta.cos();
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

fn add(x: &mut [f64], y: &[f64]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

// ---------------------------------------------------------------------------------------------
// Helpers.

fn file_of(spec: &SyntheticSpec) -> GgufFile {
    GgufFile::from_bytes(spec.to_bytes().unwrap()).unwrap()
}

fn model_of(spec: &SyntheticSpec) -> Model {
    Model::from_file(file_of(spec), 2).unwrap()
}

/// Pseudo-random tokens over the whole vocabulary (control tokens included).
fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| {
            (i.wrapping_mul(2_654_435_761)
                .wrapping_add(salt.wrapping_mul(40_503))
                >> 7)
                % VOCAB_SIZE as u32
        })
        .collect()
}

/// Tolerance: 1e-4 of the largest reference logit magnitude.
fn tolerance(reference: &[Vec<f64>]) -> f64 {
    1e-4 * reference
        .iter()
        .flatten()
        .fold(0.0f64, |m, v| m.max(v.abs()))
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - y).abs())
        .fold(0.0, f64::max)
}

fn assert_close(what: &str, got: &[f32], want: &[Vec<f64>], tol: f64) {
    let want: Vec<f64> = want.iter().flatten().copied().collect();
    let diff = max_diff(got, &want);
    assert!(
        diff <= tol,
        "{what}: max |rill - reference| = {diff:e} > {tol:e}"
    );
}

fn assert_close_f32(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let diff = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
        .fold(0.0, f64::max);
    assert!(diff <= tol, "{what}: max diff {diff:e} > {tol:e}");
}

/// Bit-identical logits, or a short message naming the first difference.
fn assert_same(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    let diffs: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&i) = diffs.first() {
        panic!(
            "{what}: {} of {} logits differ; first at position {} token {}: {} vs {}",
            diffs.len(),
            got.len(),
            i / VOCAB_SIZE,
            i % VOCAB_SIZE,
            got[i],
            want[i]
        );
    }
}

/// All-position logits of a fresh sequence, prefilled in one batch.
fn prefill(model: &mut Model, toks: &[u32], precision: Precision) -> Vec<f32> {
    let mut kv = model.new_kv_cache(toks.len(), precision).unwrap();
    kv.add_sequence(0).unwrap();
    let mut logits = Vec::new();
    model
        .forward(
            &Batch::prompt(0, toks, 0, true),
            &mut kv,
            precision,
            &mut logits,
        )
        .unwrap();
    logits
}

fn spec_with(base: SyntheticSpec, ty: GgmlType, tied: bool) -> SyntheticSpec {
    SyntheticSpec {
        weight_type: ty,
        tied_output: tied,
        ..base
    }
}

const SEQ_LEN: usize = 12;

fn tail(all: &[f32], from_pos: usize) -> &[f32] {
    &all[from_pos * VOCAB_SIZE..]
}

fn decode_one_by_one(model: &mut Model, toks: &[u32], precision: Precision) -> Vec<f32> {
    let mut kv = model.new_kv_cache(toks.len(), precision).unwrap();
    kv.add_sequence(0).unwrap();
    let mut all = Vec::new();
    let mut logits = Vec::new();
    for (pos, &t) in toks.iter().enumerate() {
        let mut b = Batch::new();
        b.push(0, t, pos, true);
        model.forward(&b, &mut kv, precision, &mut logits).unwrap();
        all.extend_from_slice(&logits);
    }
    all
}

mod against_reference;
mod batch_invariance;
mod errors;
mod kv_cache;
mod prefill_decode_chunks;
