//! Every architecture feature on tiny synthetic models, checked against a deliberately plain
//! reference forward pass written here (f64, weights dequantized once, the whole sequence
//! recomputed for every call, textbook attention), plus prefill/decode/chunk agreement, batch
//! invariance, KV-cache fork and truncate, and errors that leave the cache usable.

#[allow(dead_code)] // the KV-cache binaries use the rest of it
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

// ---------------------------------------------------------------------------------------------
// Against the reference.

fn check_against_reference(spec: &SyntheticSpec) {
    let file = file_of(spec);
    let reference = Reference::new(spec, &file);
    let mut model = Model::from_file(file, 2).unwrap();
    let toks = tokens(SEQ_LEN, 1);
    let want = reference.forward(&toks);
    let tol = tolerance(&want);
    assert!(tol > 1e-4, "logits are degenerate");
    let got = prefill(&mut model, &toks, Precision::Exact);
    assert_close(
        &format!(
            "{} {} tied={}",
            spec.architecture, spec.weight_type, spec.tied_output
        ),
        &got,
        &want,
        tol,
    );
}

#[test]
fn llama_matches_the_reference() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        for tied in [false, true] {
            check_against_reference(&spec_with(SyntheticSpec::llama_tiny(), ty, tied));
        }
    }
}

#[test]
fn gemma3_matches_the_reference() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        for tied in [false, true] {
            check_against_reference(&spec_with(SyntheticSpec::gemma3_tiny(), ty, tied));
        }
    }
}

#[test]
fn gemma3_with_an_explicit_local_rope_base_and_other_window_matches_the_reference() {
    let spec = SyntheticSpec {
        rope_freq_base_swa: Some(500.0),
        sliding_window: Some(5),
        sliding_window_pattern: 2,
        n_layers: 4,
        ..SyntheticSpec::gemma3_tiny()
    };
    check_against_reference(&spec);
}

#[test]
fn a_window_at_least_the_sequence_changes_nothing() {
    // With the window covering the whole sequence, sliding layers equal global ones except
    // for their RoPE base: set that equal too, and the result equals a model without windows.
    let spec = SyntheticSpec {
        sliding_window: Some(SEQ_LEN),
        rope_freq_base_swa: Some(1_000_000.0),
        ..SyntheticSpec::gemma3_tiny()
    };
    let no_window = SyntheticSpec {
        sliding_window: None,
        ..spec.clone()
    };
    let toks = tokens(SEQ_LEN, 2);
    let a = prefill(&mut model_of(&spec), &toks, Precision::Exact);
    let b = prefill(&mut model_of(&no_window), &toks, Precision::Exact);
    assert_same(&a, &b, "logits");
}

/// Each feature, switched off in the reference, makes it disagree with rill by far more than
/// the tolerance: the synthetic models really exercise all of them.
#[test]
fn every_feature_matters() {
    type Tweak = fn(&mut RefConfig);
    let gemma: [(&str, Tweak); 8] = [
        ("adjacent rope", |c| c.rope_neox = false),
        ("no sliding window", |c| c.window = None),
        ("one rope base", |c| c.rope_base_local = c.rope_base),
        ("silu", |c| c.gelu = false),
        ("no embedding scale", |c| c.embed_scale = false),
        ("no qk norm", |c| c.qk_norm = false),
        ("no post norms", |c| c.post_norms = false),
        ("window pattern off by one", |c| c.pattern += 1),
    ];
    let llama: [(&str, Tweak); 2] = [
        ("neox rope", |c| c.rope_neox = true),
        ("gelu", |c| c.gelu = true),
    ];
    for (spec, tweaks) in [
        (SyntheticSpec::gemma3_tiny(), &gemma[..]),
        (SyntheticSpec::llama_tiny(), &llama[..]),
    ] {
        let file = file_of(&spec);
        let mut reference = Reference::new(&spec, &file);
        let mut model = Model::from_file(file, 2).unwrap();
        let toks = tokens(SEQ_LEN, 3);
        let got = prefill(&mut model, &toks, Precision::Exact);
        let tol = tolerance(&reference.forward(&toks));
        let original = reference.cfg.clone();
        for (what, tweak) in tweaks {
            tweak(&mut reference.cfg);
            let want: Vec<f64> = reference.forward(&toks).into_iter().flatten().collect();
            let diff = max_diff(&got, &want);
            assert!(
                diff > 100.0 * tol,
                "{}: reference with {what} still agrees (diff {diff:e}, tol {tol:e})",
                spec.architecture
            );
            reference.cfg = original.clone();
        }
        // The GQA mapping: query head h reads KV head h / group, not h % n_kv.
        if spec.n_kv_heads > 1 {
            let mut swapped = Reference::new(&spec, &file_of(&spec));
            for l in &mut swapped.layers {
                // Swap the two KV heads of K: equivalent to a different head mapping.
                let hd = spec.head_dim;
                let cols = l.wk.cols;
                let (a, b) = l.wk.w.split_at_mut(hd * cols);
                a.swap_with_slice(&mut b[..hd * cols]);
            }
            let want: Vec<f64> = swapped.forward(&toks).into_iter().flatten().collect();
            assert!(
                max_diff(&got, &want) > 100.0 * tol,
                "KV head mapping does not matter"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Prefill, decode, chunks.

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

fn chunked(model: &mut Model, toks: &[u32], sizes: &[usize], precision: Precision) -> Vec<f32> {
    let mut kv = model.new_kv_cache(toks.len(), precision).unwrap();
    kv.add_sequence(0).unwrap();
    let mut all = Vec::new();
    let mut logits = Vec::new();
    let mut pos = 0;
    for &n in sizes {
        let b = Batch::prompt(0, &toks[pos..pos + n], pos, true);
        model.forward(&b, &mut kv, precision, &mut logits).unwrap();
        assert_eq!(logits.len(), n * VOCAB_SIZE);
        all.extend_from_slice(&logits);
        pos += n;
    }
    assert_eq!(pos, toks.len());
    all
}

#[test]
fn prefill_decode_and_chunks_agree() {
    // 21 tokens: more than a KV block (16), so chunks cross a block boundary.
    let toks = tokens(21, 4);
    for base in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        for (ty, precision) in [
            (GgmlType::F32, Precision::Exact),
            (GgmlType::Q4_0, Precision::Exact),
            (GgmlType::Q8_0, Precision::Fast),
            (GgmlType::Q4_0, Precision::Fast),
        ] {
            let spec = spec_with(base.clone(), ty, base.tied_output);
            let file = file_of(&spec);
            let reference = Reference::new(&spec, &file);
            let tol = tolerance(&reference.forward(&toks));
            let mut model = Model::from_file(file, 2).unwrap();
            let what = format!("{} {ty} {precision:?}", spec.architecture);
            let whole = prefill(&mut model, &toks, precision);
            let one_by_one = decode_one_by_one(&mut model, &toks, precision);
            let chunks = chunked(&mut model, &toks, &[5, 1, 9, 2, 4], precision);
            assert_close_f32(
                &format!("{what}: decode vs prefill"),
                &one_by_one,
                &whole,
                tol,
            );
            assert_close_f32(&format!("{what}: chunks vs prefill"), &chunks, &whole, tol);
            // Rows are independent of their batch, so these agree exactly.
            assert_same(
                &one_by_one,
                &whole,
                &format!("{what}: decode vs prefill not bit-identical"),
            );
            assert_same(
                &chunks,
                &whole,
                &format!("{what}: chunks vs prefill not bit-identical"),
            );
        }
    }
}

#[test]
fn logits_only_for_rows_that_ask() {
    let mut model = model_of(&SyntheticSpec::gemma3_tiny());
    let toks = tokens(8, 5);
    let all = prefill(&mut model, &toks, Precision::Exact);
    let mut kv = model.new_kv_cache(8, Precision::Exact).unwrap();
    kv.add_sequence(0).unwrap();
    let mut b = Batch::new();
    for (pos, &t) in toks.iter().enumerate() {
        b.push(0, t, pos, pos % 3 == 1);
    }
    let mut logits = Vec::new();
    model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap();
    let want: Vec<f32> = [1, 4, 7]
        .iter()
        .flat_map(|&p| all[p * VOCAB_SIZE..(p + 1) * VOCAB_SIZE].to_vec())
        .collect();
    assert_same(&logits, &want, "logits");
    // No logits at all: an empty output, but the cache advanced.
    let mut b = Batch::new();
    b.push(0, 3, 8, false);
    model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap();
    assert!(logits.is_empty());
    assert_eq!(kv.seq_len(0).unwrap(), 9);
}

// ---------------------------------------------------------------------------------------------
// Batch invariance.

/// Runs sequences 0 (`a`), 1 (`b`) and 2 (`c`) interleaved: a first batch with every prompt's
/// rows alternating, then decode steps with one row per sequence. Returns sequence 0's logits.
fn interleaved(
    model: &mut Model,
    a: &[u32],
    b: &[u32],
    c: &[u32],
    split: usize,
    precision: Precision,
) -> Vec<f32> {
    let mut kv = model.new_kv_cache(64, precision).unwrap();
    let seqs = [a, b, c];
    for s in 0..3 {
        kv.add_sequence(s).unwrap();
    }
    let mut out = Vec::new();
    let mut logits = Vec::new();
    // Prefill: the first `split` tokens of each, rows interleaved.
    let mut batch = Batch::new();
    for i in 0..split {
        for (s, toks) in seqs.iter().enumerate() {
            if i < toks.len() {
                batch.push(s as u64, toks[i], i, true);
            }
        }
    }
    model
        .forward(&batch, &mut kv, precision, &mut logits)
        .unwrap();
    for (k, row) in batch.rows.iter().enumerate() {
        if row.seq == 0 {
            out.extend_from_slice(&logits[k * VOCAB_SIZE..(k + 1) * VOCAB_SIZE]);
        }
    }
    // Decode: one row per sequence per step, sequence 0 in the middle.
    for i in split..a.len() {
        let mut batch = Batch::new();
        for s in [1usize, 0, 2] {
            if let Some(&t) = seqs[s].get(i) {
                batch.push(s as u64, t, i, true);
            }
        }
        model
            .forward(&batch, &mut kv, precision, &mut logits)
            .unwrap();
        let at = batch.rows.iter().position(|r| r.seq == 0).unwrap();
        out.extend_from_slice(&logits[at * VOCAB_SIZE..(at + 1) * VOCAB_SIZE]);
    }
    out
}

/// Sequence 0's logits alone equal those computed beside other sequences, in prefill batches
/// split anywhere and in decode steps, bit for bit.
fn assert_batch_invariant(model: &mut Model, precision: Precision, what: &str) {
    let a = tokens(14, 6);
    let b = tokens(17, 7);
    let c = tokens(9, 8);
    let alone = prefill(model, &a, precision);
    for split in [1, 6, 14] {
        let mixed = interleaved(model, &a, &b, &c, split, precision);
        assert_eq!(alone.len(), mixed.len());
        let first = alone
            .iter()
            .zip(&mixed)
            .position(|(x, y)| x.to_bits() != y.to_bits());
        assert!(
            first.is_none(),
            "{what}, split {split}: differs at logit {first:?}"
        );
    }
}

#[test]
fn batch_invariance() {
    for base in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        for (ty, precision) in [
            (GgmlType::F32, Precision::Exact),
            (GgmlType::Q8_0, Precision::Exact),
            (GgmlType::Q8_0, Precision::Fast),
            (GgmlType::Q4_0, Precision::Fast),
            (GgmlType::Q4_1, Precision::Fast),
        ] {
            let spec = spec_with(base.clone(), ty, base.tied_output);
            let mut model = model_of(&spec);
            let what = format!("{} {ty} {precision:?}", spec.architecture);
            assert_batch_invariant(&mut model, precision, &what);
        }
    }
}

/// Logits of every position of `toks`, computed in passes of the given sizes (a size of 1
/// is a decode step), sequence 0 sharing each pass with rows of sequence 1.
fn in_passes(model: &mut Model, toks: &[u32], passes: &[usize], precision: Precision) -> Vec<f32> {
    let other = tokens(toks.len(), 99);
    let mut kv = model.new_kv_cache(2 * toks.len() + 32, precision).unwrap();
    kv.add_sequence(0).unwrap();
    kv.add_sequence(1).unwrap();
    let (mut out, mut logits, mut at) = (Vec::new(), Vec::new(), 0);
    for &n in passes.iter().cycle() {
        if at == toks.len() {
            break;
        }
        let n = n.min(toks.len() - at);
        let mut batch = Batch::new();
        for i in at..at + n {
            batch.push(1, other[i], i, false);
            batch.push(0, toks[i], i, true);
        }
        model
            .forward(&batch, &mut kv, precision, &mut logits)
            .unwrap();
        out.extend_from_slice(&logits);
        at += n;
    }
    out
}

/// Past one block of keys (the fast path's tiled attention takes 64 at a time, with an online
/// softmax) a row still gets the same bits however its prompt is split into passes, whatever
/// shares them, and in decode steps; sliding windows (Gemma 3's) skip whole blocks.
/// Past one chunk of keys too (600 positions: a decoding row's chunks of 256 are reduced on
/// different threads and merged after, a prompt's in turn within its tile).
#[test]
fn batch_invariance_across_key_blocks() {
    let toks = tokens(600, 21);
    for (spec, kv_types) in [
        (SyntheticSpec::llama_tiny(), None),
        (SyntheticSpec::gemma3_tiny(), None),
        (SyntheticSpec::gemma3_tiny(), Some(KvDtype::Q8_0.into())),
    ] {
        let spec = SyntheticSpec {
            sliding_window: spec.sliding_window.map(|_| 300),
            context_length: 1024,
            ..spec_with(spec, GgmlType::Q8_0, true)
        };
        let mut model = model_of(&spec);
        model.set_kv_types(kv_types).unwrap();
        for precision in [Precision::Fast, Precision::Exact] {
            let whole = in_passes(&mut model, &toks, &[600], precision);
            for passes in [&[70, 61, 69][..], &[430, 1], &[1], &[17, 3, 64]] {
                let split = in_passes(&mut model, &toks, passes, precision);
                let first = whole
                    .iter()
                    .zip(&split)
                    .position(|(x, y)| x.to_bits() != y.to_bits());
                assert!(
                    first.is_none(),
                    "{} {kv_types:?} {precision:?} passes {passes:?}: differs at logit {first:?}",
                    spec.architecture
                );
            }
        }
    }
}

/// A quantized KV cache keeps batch invariance: keys and values are quantized per position
/// and read back the same whatever shares the batch.
#[test]
fn batch_invariance_with_quantized_kv() {
    let spec = spec_with(SyntheticSpec::gemma3_tiny(), GgmlType::Q8_0, true);
    let mut model = model_of(&spec);
    for types in [
        KvTypes::from(KvDtype::Q8_0),
        KvTypes::from(KvDtype::Q4_0),
        KvTypes {
            keys: KvDtype::Q8_0,
            values: KvDtype::F16,
        },
        KvTypes {
            keys: KvDtype::F16,
            values: KvDtype::Q4_0,
        },
    ] {
        model.set_kv_types(Some(types)).unwrap();
        for precision in [Precision::Fast, Precision::Exact] {
            assert_batch_invariant(&mut model, precision, &format!("KV {types} {precision:?}"));
        }
    }
}

/// A quantized KV cache changes the logits a little, not wholesale: against the f32 cache on
/// the same (exact) path, the relative error stays near the types' resolution.
#[test]
fn quantized_kv_is_close_to_f32() {
    let spec = spec_with(SyntheticSpec::gemma3_tiny(), GgmlType::F32, true);
    let mut model = model_of(&spec);
    let toks = tokens(20, 3);
    let exact = prefill(&mut model, &toks, Precision::Exact);
    let norm = exact.iter().map(|x| x * x).sum::<f32>().sqrt();
    let mut errors = Vec::new();
    for dtype in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        model.set_kv_types(Some(dtype.into())).unwrap();
        let got = prefill(&mut model, &toks, Precision::Exact);
        let diff = exact
            .iter()
            .zip(&got)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f32>()
            .sqrt();
        errors.push(diff / norm);
    }
    eprintln!("relative logit error f16, q8_0, q4_0: {errors:?}");
    // Each coarser type errs more, and each stays under its rounding step relative to what it
    // stores (f16: 2^-11; Q8_0: 1/127 of a block's largest value; Q4_0: 1/8 of it).
    assert!(errors[0] < errors[1] && errors[1] < errors[2], "{errors:?}");
    assert!(
        errors[0] < 2f32.powi(-11) && errors[1] < 1.0 / 127.0 && errors[2] < 1.0 / 8.0,
        "{errors:?}"
    );
}

/// Block types need heads that are whole blocks of 32: a model with heads of 16 refuses them
/// with an error that names the type, and keeps working.
#[test]
fn quantized_kv_needs_heads_of_whole_blocks() {
    let mut model = model_of(&SyntheticSpec::llama_tiny());
    let err = model
        .set_kv_types(Some(KvDtype::Q8_0.into()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("q8_0") && err.contains("16"), "{err}");
    assert_eq!(model.kv_types(Precision::Fast), KvDtype::F16.into());
    prefill(&mut model, &tokens(5, 1), Precision::Fast);
}

// ---------------------------------------------------------------------------------------------
// The KV cache.

fn tail(all: &[f32], from_pos: usize) -> &[f32] {
    &all[from_pos * VOCAB_SIZE..]
}

#[test]
fn fork_then_diverge_equals_fresh_sequences() {
    for spec in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        let mut model = model_of(&spec);
        // Prefixes ending inside a block, on a block boundary, and past one.
        for prefix_len in [5, 16, 20] {
            let prefix = tokens(prefix_len, 9);
            let x = tokens(7, 10);
            let y = tokens(4, 11);
            let mut kv = model.new_kv_cache(96, Precision::Exact).unwrap();
            kv.add_sequence(1).unwrap();
            extend(&mut model, &mut kv, 1, &prefix, 0);
            kv.fork(1, 2).unwrap();
            // Interleave the continuations, one row of each per call at first.
            let mut lx = extend(&mut model, &mut kv, 2, &y[..1], prefix_len);
            let mut l1 = extend(&mut model, &mut kv, 1, &x[..1], prefix_len);
            l1.extend(extend(&mut model, &mut kv, 1, &x[1..], prefix_len + 1));
            lx.extend(extend(&mut model, &mut kv, 2, &y[1..], prefix_len + 1));
            let fresh_x = prefill(
                &mut model,
                &[prefix.clone(), x.clone()].concat(),
                Precision::Exact,
            );
            let fresh_y = prefill(
                &mut model,
                &[prefix.clone(), y.clone()].concat(),
                Precision::Exact,
            );
            let what = format!("{} prefix {prefix_len}", spec.architecture);
            assert_same(
                &l1,
                tail(&fresh_x, prefix_len),
                &format!("{what}: original after fork"),
            );
            assert_same(&lx, tail(&fresh_y, prefix_len), &format!("{what}: fork"));
            // A second fork of the original, continued with y, also equals the fresh run.
            kv.fork(1, 3).unwrap();
            kv.truncate(3, prefix_len).unwrap();
            let l3 = extend(&mut model, &mut kv, 3, &y, prefix_len);
            assert_same(
                &l3,
                tail(&fresh_y, prefix_len),
                &format!("{what}: fork of a longer sequence, truncated"),
            );
            // And the original is still intact.
            let more = tokens(3, 12);
            let l1b = extend(&mut model, &mut kv, 1, &more, prefix_len + x.len());
            let fresh = prefill(
                &mut model,
                &[prefix.clone(), x.clone(), more].concat(),
                Precision::Exact,
            );
            assert_same(
                &l1b,
                tail(&fresh, prefix_len + x.len()),
                &format!("{what}: original after its forks"),
            );
        }
    }
}

#[test]
fn truncate_and_recompute() {
    for spec in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        let mut model = model_of(&spec);
        let toks = tokens(22, 13);
        let full = prefill(&mut model, &toks, Precision::Exact);
        let mut kv = model.new_kv_cache(32, Precision::Exact).unwrap();
        kv.add_sequence(0).unwrap();
        extend(&mut model, &mut kv, 0, &toks, 0);
        for keep in [17, 16, 9, 0] {
            kv.truncate(0, keep).unwrap();
            assert_eq!(kv.seq_len(0).unwrap(), keep);
            // The same tokens again: the same logits.
            let again = extend(&mut model, &mut kv, 0, &toks[keep..], keep);
            assert_same(
                &again,
                tail(&full, keep),
                &format!("{} keep {keep}", spec.architecture),
            );
            // Different tokens: the logits of a fresh run of the edited sequence.
            kv.truncate(0, keep).unwrap();
            let other = tokens(22 - keep, 14);
            let edited = extend(&mut model, &mut kv, 0, &other, keep);
            let fresh = prefill(
                &mut model,
                &[&toks[..keep], &other[..]].concat(),
                Precision::Exact,
            );
            assert_same(
                &edited,
                tail(&fresh, keep),
                &format!("{} keep {keep}, edited", spec.architecture),
            );
            kv.truncate(0, keep).unwrap();
            extend(&mut model, &mut kv, 0, &toks[keep..], keep);
        }
        // Every block comes back when the sequence goes.
        kv.remove_sequence(0).unwrap();
        assert_eq!(kv.free_blocks(), kv.total_blocks());
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

/// After a failed call, the cache holds what it held before: sequence 0 continues exactly as
/// a fresh run would.
fn assert_usable(model: &mut Model, kv: &mut KvCache, prefix: &[u32], what: &str) {
    assert_eq!(
        kv.seq_len(0).unwrap(),
        prefix.len(),
        "{what}: length changed"
    );
    let next = tokens(3, 15);
    let got = extend(model, kv, 0, &next, prefix.len());
    let fresh = prefill(model, &[prefix, &next[..]].concat(), Precision::Exact);
    assert_same(
        &got,
        tail(&fresh, prefix.len()),
        &format!("{what}: cache corrupted"),
    );
    kv.truncate(0, prefix.len()).unwrap();
}

#[test]
fn bad_batches_are_errors_and_leave_the_cache_usable() {
    let mut model = model_of(&SyntheticSpec::gemma3_tiny());
    let prefix = tokens(6, 16);
    let mut kv = model.new_kv_cache(32, Precision::Exact).unwrap();
    kv.add_sequence(0).unwrap();
    extend(&mut model, &mut kv, 0, &prefix, 0);
    let mut logits = vec![1.0; 5];

    // A token outside the vocabulary (after a valid row, which must not be applied either).
    let mut b = Batch::new();
    b.push(0, 1, 6, true);
    b.push(0, VOCAB_SIZE as u32, 7, true);
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::TokenOutOfRange { id, vocab_size } if id == VOCAB_SIZE as u32 && vocab_size == VOCAB_SIZE),
        "{e}"
    );
    assert!(
        logits.is_empty(),
        "logits of a failed call must not be left behind"
    );
    assert_usable(&mut model, &mut kv, &prefix, "token out of range");
    let e = model
        .forward(
            &Batch::prompt(0, &[u32::MAX], 6, true),
            &mut kv,
            Precision::Exact,
            &mut logits,
        )
        .unwrap_err();
    assert!(matches!(e, ModelError::TokenOutOfRange { .. }), "{e}");

    // A gap in positions: inside the batch, and between the cache and the batch.
    let mut b = Batch::new();
    b.push(0, 1, 6, false);
    b.push(0, 2, 8, true);
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(matches!(e, ModelError::BadBatch { row: 1, .. }), "{e}");
    assert_usable(&mut model, &mut kv, &prefix, "gap inside the batch");
    let e = model
        .forward(
            &Batch::prompt(0, &[1, 2], 9, true),
            &mut kv,
            Precision::Exact,
            &mut logits,
        )
        .unwrap_err();
    assert!(matches!(e, ModelError::BadBatch { row: 0, .. }), "{e}");
    // Rewriting an already cached position, or going backwards.
    let e = model
        .forward(
            &Batch::prompt(0, &[1], 3, true),
            &mut kv,
            Precision::Exact,
            &mut logits,
        )
        .unwrap_err();
    assert!(matches!(e, ModelError::BadBatch { .. }), "{e}");
    let mut b = Batch::new();
    b.push(0, 1, 6, false);
    b.push(0, 2, 6, true);
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(matches!(e, ModelError::BadBatch { row: 1, .. }), "{e}");
    assert_usable(&mut model, &mut kv, &prefix, "repeated position");

    // An unknown sequence (after a valid row of a known one).
    let mut b = Batch::new();
    b.push(0, 1, 6, true);
    b.push(42, 1, 0, true);
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::Kv(KvError::UnknownSequence(42))),
        "{e}"
    );
    assert_usable(&mut model, &mut kv, &prefix, "unknown sequence");

    // Cache operations on unknown sequences.
    assert_eq!(kv.fork(42, 43), Err(KvError::UnknownSequence(42)));
    assert_eq!(kv.fork(0, 0), Err(KvError::SequenceExists(0)));
    assert_eq!(kv.truncate(42, 0), Err(KvError::UnknownSequence(42)));
    assert_eq!(kv.add_sequence(0), Err(KvError::SequenceExists(0)));

    // An empty batch is fine and changes nothing.
    model
        .forward(&Batch::new(), &mut kv, Precision::Exact, &mut logits)
        .unwrap();
    assert!(logits.is_empty());
    assert_usable(&mut model, &mut kv, &prefix, "empty batch");
}

#[test]
fn a_full_cache_is_an_error_and_leaves_the_cache_usable() {
    for spec in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        let mut model = model_of(&spec);
        // Two blocks of 16 positions.
        let mut kv = model.new_kv_cache(32, Precision::Exact).unwrap();
        assert_eq!(kv.total_blocks(), 2);
        kv.add_sequence(0).unwrap();
        let prefix = tokens(20, 17);
        extend(&mut model, &mut kv, 0, &prefix, 0);
        let mut logits = Vec::new();
        let e = model
            .forward(
                &Batch::prompt(0, &tokens(13, 18), 20, true),
                &mut kv,
                Precision::Exact,
                &mut logits,
            )
            .unwrap_err();
        assert!(
            matches!(
                e,
                ModelError::Kv(KvError::OutOfBlocks {
                    needed: 1,
                    free: 0,
                    ..
                })
            ),
            "{e}"
        );
        assert_usable(&mut model, &mut kv, &prefix, "full cache");
        // Filling it exactly works.
        let rest = tokens(12, 19);
        let got = extend(&mut model, &mut kv, 0, &rest, 20);
        let fresh = prefill(
            &mut model,
            &[prefix.clone(), rest].concat(),
            Precision::Exact,
        );
        assert_same(&got, tail(&fresh, 20), "logits");
        // A fork that writes into its shared last block needs a copy: no room.
        kv.truncate(0, 20).unwrap();
        kv.fork(0, 1).unwrap();
        let e = model
            .forward(
                &Batch::prompt(1, &[5], 20, true),
                &mut kv,
                Precision::Exact,
                &mut logits,
            )
            .unwrap_err();
        assert!(
            matches!(e, ModelError::Kv(KvError::OutOfBlocks { .. })),
            "{e}"
        );
        assert_eq!(kv.seq_len(1).unwrap(), 20);
        kv.remove_sequence(1).unwrap();
        assert_usable(&mut model, &mut kv, &prefix, "fork without room");
    }
}

/// A batch in which one sequence's reservation succeeds and a later one's fails must not leave
/// the cache in a state where a fork and two continuations share a block they both write.
#[test]
fn a_failed_multi_sequence_batch_then_fork_keeps_sequences_apart() {
    let spec = SyntheticSpec::llama_tiny();
    let mut model = model_of(&spec);
    // Three blocks: sequence 0 fills one exactly, sequence 1 one, one block free.
    let mut kv = model.new_kv_cache(48, Precision::Exact).unwrap();
    kv.add_sequence(0).unwrap();
    kv.add_sequence(1).unwrap();
    let p0 = tokens(16, 20);
    let p1 = tokens(16, 21);
    extend(&mut model, &mut kv, 0, &p0, 0);
    extend(&mut model, &mut kv, 1, &p1, 0);
    // Sequence 0 needs the free block, sequence 1 needs two: out of blocks.
    let mut b = Batch::new();
    b.push(0, 7, 16, true);
    for (i, &t) in tokens(17, 22).iter().enumerate() {
        b.push(1, t, 16 + i, true);
    }
    let mut logits = Vec::new();
    let e = model
        .forward(&b, &mut kv, Precision::Exact, &mut logits)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::Kv(KvError::OutOfBlocks { .. })),
        "{e}"
    );
    assert_eq!(kv.seq_len(0).unwrap(), 16);
    // Free sequence 1 to make room, fork 0, and continue both with different tokens.
    kv.remove_sequence(1).unwrap();
    kv.fork(0, 2).unwrap();
    let x = tokens(3, 23);
    let y = tokens(3, 24);
    let lx = extend(&mut model, &mut kv, 0, &x, 16);
    let ly = extend(&mut model, &mut kv, 2, &y, 16);
    let lx2 = extend(&mut model, &mut kv, 0, &[9], 19);
    let fresh_x = prefill(
        &mut model,
        &[p0.clone(), x.clone(), vec![9]].concat(),
        Precision::Exact,
    );
    let fresh_y = prefill(&mut model, &[p0.clone(), y].concat(), Precision::Exact);
    assert_same(&ly, tail(&fresh_y, 16), "fork");
    assert_same(
        &[lx, lx2].concat(),
        tail(&fresh_x, 16),
        "original: the fork overwrote its keys",
    );
}

/// A row's logits do not depend on the number of threads: one pass, token by token, and any
/// thread count give the same bits.
#[test]
fn thread_count_does_not_change_logits() {
    let toks = tokens(19, 6);
    for base in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        for (ty, precision) in [
            (GgmlType::Q8_0, Precision::Fast),
            (GgmlType::Q4_1, Precision::Fast),
            (GgmlType::Q4_0, Precision::Exact),
        ] {
            let spec = spec_with(base.clone(), ty, base.tied_output);
            let what = format!("{} {ty} {precision:?}", spec.architecture);
            let mut one = Model::from_file(file_of(&spec), 1).unwrap();
            let reference = prefill(&mut one, &toks, precision);
            for threads in [2, 3] {
                let mut many = Model::from_file(file_of(&spec), threads).unwrap();
                assert_same(
                    &prefill(&mut many, &toks, precision),
                    &reference,
                    &format!("{what}: prefill on {threads} threads vs 1"),
                );
                assert_same(
                    &decode_one_by_one(&mut many, &toks, precision),
                    &reference,
                    &format!("{what}: decode on {threads} threads vs prefill on 1"),
                );
            }
        }
    }
}

/// Profiling times every stage without changing a bit of the output, and counts the passes,
/// rows and arithmetic it covered.
#[test]
fn profiling_reports_every_stage_and_changes_nothing() {
    use rill_model::Stage;
    for spec in [SyntheticSpec::llama_tiny(), SyntheticSpec::gemma3_tiny()] {
        let mut model = model_of(&spec);
        let toks = tokens(SEQ_LEN, 3);
        let plain = prefill(&mut model, &toks, Precision::Fast);
        assert!(model.stage_times().is_none());
        model.set_profiling(true);
        let profiled = prefill(&mut model, &toks, Precision::Fast);
        assert_same(&profiled, &plain, "logits with profiling on");
        let p = model.stage_times().expect("profiling is on").clone();
        assert_eq!((p.passes, p.rows), (1, SEQ_LEN as u64));
        let cfg = model.config();
        let (d, layers) = (cfg.d_model as u64, cfg.n_layers as u64);
        assert_eq!(
            p.flops(Stage::Down),
            2 * SEQ_LEN as u64 * layers * cfg.ffn_dim as u64 * d
        );
        assert_eq!(
            p.flops(Stage::Head),
            2 * SEQ_LEN as u64 * d * cfg.vocab_size as u64
        );
        assert!(p.flops(Stage::Attention) > 0);
        for stage in [Stage::Qkv, Stage::Attention, Stage::GateUp, Stage::Down] {
            assert!(p.time(stage).as_nanos() > 0, "{} untimed", stage.name());
        }
        model.reset_stage_times();
        assert_eq!(model.stage_times().unwrap().passes, 0);
        model.set_profiling(false);
        assert!(model.stage_times().is_none());
    }
}
