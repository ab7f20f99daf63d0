//! A layer's feed-forward: dense, or routed experts (with a shared expert, or a dense branch
//! beside them), and reading it from the file.

use rill_gguf::GgufFile;

use crate::weights::{
    matrix, row_parts, shaped, split_rows, stacked, stacked_vectors, vector, Weight,
};
use crate::{ModelConfig, ModelError};

/// A layer's feed-forward: gated (gate, up, down), dense or routed; or BERT's ungated one.
#[derive(Debug, Clone)]
pub enum FeedForward {
    Dense(Expert),
    /// `down(gelu(up · h + b_up)) + b_down` (BERT: GELU by the error function).
    Plain(PlainFfn),
    /// `router` maps a row to one logit per expert; each expert is a slice of the file's
    /// stacked `ffn_*_exps` tensors; a token uses `n_used` of them.
    Routed {
        router: Weight,
        router_bias: Option<Vec<f32>>,
        /// Added to the router's scores to choose the experts, not to their weights
        /// (LFM2-MoE's `exp_probs_b`).
        selection_bias: Option<Vec<f32>>,
        experts: Vec<Expert>,
        n_used: usize,
        /// An expert every row uses, scaled by `sigmoid(gate · h)` (Qwen3.5-MoE).
        shared: Option<Box<SharedExpert>>,
        /// A dense feed-forward beside the experts, and the norms around both (Gemma 4).
        beside: Option<Box<DenseBeside>>,
        /// Per expert, a factor on its routing weight (Gemma 4's `per_expert_scale`, stored as
        /// `ffn_down_exps.scale`).
        expert_scales: Option<Vec<f32>>,
    },
}

/// Gemma 4 26B-A4B's feed-forward besides its experts: the layer's output is
/// `rms(dense(h), post_norm) + rms(experts(rms(x, routed_pre_norm)), routed_post_norm)` for
/// `h = rms(x, ffn_norm)`, the router reading `rms(x) · router_scale / √d`.
#[derive(Debug, Clone)]
pub struct DenseBeside {
    pub expert: Expert,
    /// `post_ffw_norm_1`: the dense branch's output norm.
    pub post_norm: Vec<f32>,
    /// `pre_ffw_norm_2`, `post_ffw_norm_2`: the routed branch's input and output norms.
    pub routed_pre_norm: Vec<f32>,
    pub routed_post_norm: Vec<f32>,
    /// `ffn_gate_inp.scale`: the router's input, per element.
    pub router_scale: Vec<f32>,
}

/// A shared expert and its gate's weights (`d_model`: one logit per row).
#[derive(Debug, Clone)]
pub struct SharedExpert {
    pub expert: Expert,
    pub gate: Vec<f32>,
}

/// An ungated feed-forward's matrices and biases.
#[derive(Debug, Clone)]
pub struct PlainFfn {
    pub up: Weight,
    pub down: Weight,
    pub up_bias: Option<Vec<f32>>,
    pub down_bias: Option<Vec<f32>>,
}

/// One gated feed-forward.
#[derive(Debug, Clone)]
pub struct Expert {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    /// Biases of gate, up and down (gpt-oss's experts).
    pub biases: Option<[Vec<f32>; 3]>,
}

impl Expert {
    fn matrices(&self) -> [&Weight; 3] {
        [&self.gate, &self.up, &self.down]
    }
}

impl FeedForward {
    /// Every matrix, with the share of the rows' tokens that read it on average (1 for dense
    /// matrices and the router; `n_used / n_experts` for an expert).
    pub fn matrices(&self) -> Vec<(&Weight, f64)> {
        match self {
            FeedForward::Dense(e) => e.matrices().into_iter().map(|w| (w, 1.0)).collect(),
            FeedForward::Plain(p) => vec![(&p.up, 1.0), (&p.down, 1.0)],
            FeedForward::Routed {
                router,
                experts,
                n_used,
                shared,
                beside,
                ..
            } => {
                let share = *n_used as f64 / experts.len() as f64;
                let mut out = vec![(router, 1.0)];
                if let Some(s) = shared {
                    out.extend(s.expert.matrices().into_iter().map(|w| (w, 1.0)));
                }
                if let Some(b) = beside {
                    out.extend(b.expert.matrices().into_iter().map(|w| (w, 1.0)));
                }
                for e in experts {
                    out.extend(e.matrices().into_iter().map(|w| (w, share)));
                }
                out
            }
        }
    }

    pub(crate) fn matrices_mut(&mut self) -> Vec<&mut Weight> {
        match self {
            FeedForward::Dense(e) => vec![&mut e.gate, &mut e.up, &mut e.down],
            FeedForward::Plain(p) => vec![&mut p.up, &mut p.down],
            FeedForward::Routed {
                router,
                experts,
                shared,
                beside,
                ..
            } => std::iter::once(router)
                .chain(
                    experts
                        .iter_mut()
                        .chain(shared.as_mut().map(|s| &mut s.expert))
                        .chain(beside.as_mut().map(|b| &mut b.expert))
                        .flat_map(|e| [&mut e.gate, &mut e.up, &mut e.down]),
                )
                .collect(),
        }
    }
}

/// Layer `il`'s feed-forward: `blk.N.ffn_{gate,up,down}`, or a router `blk.N.ffn_gate_inp` and
/// the experts stacked in `blk.N.ffn_{gate,up,down}_exps`.
pub(crate) fn load(
    file: &GgufFile,
    config: &ModelConfig,
    il: usize,
) -> Result<FeedForward, ModelError> {
    let d = config.d_model;
    let name = |s: &str| format!("blk.{il}.{s}.weight");
    // Gemma's GeGLU output feeding the down projection has outliers that make one 8-bit scale
    // per block coarse: measured on the references, this product alone accounts for most of its
    // fast path's divergence (mean KL 0.0073 -> 0.0019 when its input is exact), so there it
    // gets two-level activations.
    let down = |mut w: Weight| {
        w.activations = config.ffn_down_activations;
        w
    };
    let dense_here = il < config.dense_leading_layers;
    let moe = config.moe.filter(|_| !dense_here);
    let dense = |f: usize| -> Result<Expert, ModelError> {
        let [gate, up] = if config.fused_gate_up {
            row_parts(file, &name("ffn_up"), d, [f; 2])?
        } else {
            [
                matrix(file, &name("ffn_gate"), d, f)?,
                matrix(file, &name("ffn_up"), d, f)?,
            ]
        };
        Ok(Expert {
            gate,
            up,
            down: down(matrix(file, &name("ffn_down"), f, d)?),
            biases: None,
        })
    };
    if config.ungated_ffn {
        let f = config.layer_ffn_dims[il];
        let bias = |s: &str, n: usize| match file.tensor(&format!("blk.{il}.{s}.bias")) {
            Some(_) => vector(file, &format!("blk.{il}.{s}.bias"), n).map(Some),
            None => Ok(None),
        };
        return Ok(FeedForward::Plain(PlainFfn {
            up: matrix(file, &name("ffn_up"), d, f)?,
            down: down(matrix(file, &name("ffn_down"), f, d)?),
            up_bias: bias("ffn_up", f)?,
            down_bias: bias("ffn_down", d)?,
        }));
    }
    let Some(moe) = moe else {
        return Ok(FeedForward::Dense(dense(config.layer_ffn_dims[il])?));
    };
    let (n, f) = (moe.n_experts, moe.expert_ffn_dim);
    // Gate and up stacked apart, or in one tensor of twice the rows, gate first (Gemma 4).
    let (gates, ups) = if file.tensor(&name("ffn_gate_up_exps")).is_some() {
        let both = stacked(file, &name("ffn_gate_up_exps"), d, 2 * f, n)?;
        both.into_iter()
            .map(|w| {
                let [g, u] = split_rows(&w, [f, f]);
                (g, u)
            })
            .unzip()
    } else {
        (
            stacked(file, &name("ffn_gate_exps"), d, f, n)?,
            stacked(file, &name("ffn_up_exps"), d, f, n)?,
        )
    };
    let downs = stacked(file, &name("ffn_down_exps"), f, d, n)?;
    let bias_name = |s: &str| format!("blk.{il}.{s}.bias");
    let mut biases: Vec<Option<[Vec<f32>; 3]>> = vec![None; n];
    if moe.biases {
        let g = stacked_vectors(file, &bias_name("ffn_gate_exps"), f, n)?;
        let u = stacked_vectors(file, &bias_name("ffn_up_exps"), f, n)?;
        let dn = stacked_vectors(file, &bias_name("ffn_down_exps"), d, n)?;
        for (e, ((g, u), dn)) in g.into_iter().zip(u).zip(dn).enumerate() {
            biases[e] = Some([g, u, dn]);
        }
    }
    let experts = gates
        .into_iter()
        .zip(ups)
        .zip(downs)
        .zip(biases)
        .map(|(((gate, up), dw), biases)| Expert {
            gate,
            up,
            down: down(dw),
            biases,
        })
        .collect();
    let router_bias = if moe.biases {
        Some(vector(file, &bias_name("ffn_gate_inp"), n)?)
    } else {
        None
    };
    let shared = match config.shared_expert_ffn_dim {
        Some(fs) => Some(Box::new(SharedExpert {
            expert: Expert {
                gate: matrix(file, &name("ffn_gate_shexp"), d, fs)?,
                up: matrix(file, &name("ffn_up_shexp"), d, fs)?,
                down: down(matrix(file, &name("ffn_down_shexp"), fs, d)?),
                biases: None,
            },
            gate: {
                let (info, ty) = shaped(file, &name("ffn_gate_inp_shexp"), &[d, 1])?;
                let mut g = vec![0.0; d];
                rill_kernels::dequantize_row(ty, file.tensor_data(info), &mut g)?;
                g
            },
        })),
        None => None,
    };
    let selection_bias = match file.tensor(&format!("blk.{il}.exp_probs_b.bias")) {
        Some(_) => Some(vector(file, &format!("blk.{il}.exp_probs_b.bias"), n)?),
        None => None,
    };
    let scale = |s: &str| format!("blk.{il}.{s}.scale");
    let beside = if config.dense_beside_experts {
        Some(Box::new(DenseBeside {
            expert: dense(config.layer_ffn_dims[il])?,
            post_norm: vector(file, &name("post_ffw_norm_1"), d)?,
            routed_pre_norm: vector(file, &name("pre_ffw_norm_2"), d)?,
            routed_post_norm: vector(file, &name("post_ffw_norm_2"), d)?,
            router_scale: vector(file, &scale("ffn_gate_inp"), d)?,
        }))
    } else {
        None
    };
    let expert_scales = match file.tensor(&scale("ffn_down_exps")) {
        Some(_) => Some(vector(file, &scale("ffn_down_exps"), n)?),
        None => None,
    };
    Ok(FeedForward::Routed {
        router: matrix(file, &name("ffn_gate_inp"), d, n)?,
        router_bias,
        selection_bias,
        experts,
        n_used: moe.n_used,
        shared,
        beside,
        expert_scales,
    })
}
