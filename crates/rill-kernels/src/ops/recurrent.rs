//! Recurrent layers' inner loops: a causal depthwise convolution step, the gated delta rule's
//! step, Mamba-2's state-space step, and their norms. Loops along contiguous rows with no
//! reassociated sums and no fused multiply-adds, so the compiler's vectorisation does not
//! change their arithmetic: the AVX2 versions are the same code compiled for 256-bit registers
//! (chosen at run time), bit for bit the scalar twins (`*_scalar`), as the tests hold.

/// One step of a causal depthwise convolution of kernel `k` over `x`'s channels (`c` of
/// them). `window` holds the previous `k - 1` inputs, oldest first (`(k - 1) × c`);
/// `weights` holds each channel's kernel (`c × k`, oldest tap first). Writes the output into
/// `x` and shifts the input into the window.
pub fn causal_conv_step(window: &mut [f32], weights: &[f32], k: usize, x: &mut [f32]) {
    let c = x.len();
    debug_assert_eq!(window.len(), (k - 1) * c);
    debug_assert_eq!(weights.len(), k * c);
    for (ch, xv) in x.iter_mut().enumerate() {
        let w = &weights[ch * k..(ch + 1) * k];
        let mut acc = 0.0f32;
        for (r, &wr) in w[..k - 1].iter().enumerate() {
            acc += wr * window[r * c + ch];
        }
        let input = *xv;
        acc += w[k - 1] * input;
        // Shift this channel's column: the oldest input leaves, this one enters.
        for r in 0..k.saturating_sub(2) {
            window[r * c + ch] = window[(r + 1) * c + ch];
        }
        if k > 1 {
            window[(k - 2) * c + ch] = input;
        }
        *xv = acc;
    }
}

/// `x / sqrt(sum(x²) + eps)` in place (the sum in f64).
pub fn l2_normalize(x: &mut [f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let inv = (1.0 / (sum + f64::from(eps)).sqrt()) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `ln(1 + e^x)`, as PyTorch's softplus (linear past 20).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// One token of the gated delta rule for one head (see [`delta_rule_step_scalar`]): `qkv` the
/// token's query, key and value, `next` the next token's key and decay when the same head takes
/// it next (its `u` is left in `carry`).
pub fn delta_rule_step(
    state: &mut [f32],
    qkv: (&[f32], &[f32], &[f32]),
    (decay, beta): (f32, f32),
    out: &mut [f32],
    carry: &mut DeltaCarry,
    next: Option<(&[f32], f32)>,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2.
        return unsafe { avx2::delta_rule_step(state, qkv, decay, beta, out, carry, next) };
    }
    delta_rule_step_body(state, qkv, decay, beta, out, carry, next)
}

/// Scalar twin of [`delta_rule_step`].
pub fn delta_rule_step_scalar(
    state: &mut [f32],
    qkv: (&[f32], &[f32], &[f32]),
    (decay, beta): (f32, f32),
    out: &mut [f32],
    carry: &mut DeltaCarry,
    next: Option<(&[f32], f32)>,
) {
    delta_rule_step_body(state, qkv, decay, beta, out, carry, next)
}

/// Mamba-2's step for one head (see [`ssd_step_scalar`]).
#[allow(clippy::too_many_arguments)]
pub fn ssd_step(
    state: &mut [f32],
    x: &[f32],
    b: &[f32],
    c: &[f32],
    decay: f32,
    dt: f32,
    d: f32,
    y: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2.
        return unsafe { avx2::ssd_step(state, x, b, c, decay, dt, d, y) };
    }
    ssd_step_body(state, x, b, c, decay, dt, d, y)
}

/// Scalar twin of [`ssd_step`].
#[allow(clippy::too_many_arguments)]
pub fn ssd_step_scalar(
    state: &mut [f32],
    x: &[f32],
    b: &[f32],
    c: &[f32],
    decay: f32,
    dt: f32,
    d: f32,
    y: &mut [f32],
) {
    ssd_step_body(state, x, b, c, decay, dt, d, y)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    /// [`super::delta_rule_step_body`] compiled for AVX2 (no FMA contraction: the same bits).
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn delta_rule_step(
        state: &mut [f32],
        qkv: (&[f32], &[f32], &[f32]),
        decay: f32,
        beta: f32,
        out: &mut [f32],
        carry: &mut super::DeltaCarry,
        next: Option<(&[f32], f32)>,
    ) {
        super::delta_rule_step_body(state, qkv, decay, beta, out, carry, next)
    }

    /// [`super::ssd_step_body`] compiled for AVX2.
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn ssd_step(
        state: &mut [f32],
        x: &[f32],
        b: &[f32],
        c: &[f32],
        decay: f32,
        dt: f32,
        d: f32,
        y: &mut [f32],
    ) {
        super::ssd_step_body(state, x, b, c, decay, dt, d, y)
    }
}

/// What a step of the gated delta rule leaves for the next token of the same head: `(a·S)ᵀk` of
/// that token over the state after the step (`ready` when the step was told it), so that step
/// reads the state once instead of twice.
#[derive(Debug, Clone, Default)]
pub struct DeltaCarry {
    mem: Vec<f32>,
    ready: bool,
}

impl DeltaCarry {
    /// A carry for heads of `d_v` values.
    pub fn new(dv: usize) -> DeltaCarry {
        DeltaCarry {
            mem: vec![0.0; dv],
            ready: false,
        }
    }
}

/// One token of the gated delta rule for one head. `state` is `d_k × d_v` (row `i` for key
/// dimension `i`); `q` is already scaled, `q` and `k` normalised. With `a = exp(g)`:
/// `S ← a·S`, `u = Sᵀk`, `δ = β(v − u)`, `S ← S + k δᵀ`, `out = Sᵀq`. The update, the output
/// and the next token's `u` (when `next` gives its key and decay) go in one pass over the
/// state; `u` comes from `carry` when the previous step was given this token, else from a
/// pass of its own, with the same operations in the same order either way (the bits do not
/// depend on which).
#[inline(always)]
fn delta_rule_step_body(
    state: &mut [f32],
    (q, k, v): (&[f32], &[f32], &[f32]),
    decay: f32,
    beta: f32,
    out: &mut [f32],
    carry: &mut DeltaCarry,
    next: Option<(&[f32], f32)>,
) {
    let dv = v.len();
    debug_assert_eq!(state.len(), k.len() * dv);
    let DeltaCarry { mem, ready } = carry;
    let mem = &mut mem[..dv];
    if !*ready {
        mem.fill(0.0);
        for (row, &ki) in state.chunks_exact(dv).zip(k) {
            for (&s, m) in row.iter().zip(mem.iter_mut()) {
                *m += (s * decay) * ki;
            }
        }
    }
    // δ, in place of u.
    for (m, &vj) in mem.iter_mut().zip(v) {
        *m = (vj - *m) * beta;
    }
    out.fill(0.0);
    match next {
        Some((kn, decay_next)) => {
            // The next token's u, gathered as the rows go by (then δ's place is free).
            let mut next_mem = [0.0f32; 256];
            let mut heap = Vec::new();
            let next_mem = if dv <= next_mem.len() {
                &mut next_mem[..dv]
            } else {
                heap.resize(dv, 0.0);
                &mut heap[..]
            };
            for (((row, &ki), &qi), &kni) in state.chunks_exact_mut(dv).zip(k).zip(q).zip(kn) {
                for (((s, &dj), o), nm) in row
                    .iter_mut()
                    .zip(mem.iter())
                    .zip(out.iter_mut())
                    .zip(next_mem.iter_mut())
                {
                    *s = *s * decay + ki * dj;
                    *o += *s * qi;
                    *nm += (*s * decay_next) * kni;
                }
            }
            mem.copy_from_slice(next_mem);
            *ready = true;
        }
        None => {
            for ((row, &ki), &qi) in state.chunks_exact_mut(dv).zip(k).zip(q) {
                for ((s, &dj), o) in row.iter_mut().zip(mem.iter()).zip(out.iter_mut()) {
                    *s = *s * decay + ki * dj;
                    *o += *s * qi;
                }
            }
            *ready = false;
        }
    }
}

/// One token of a Mamba-2 head: `S ← a·S + dt · x Bᵀ` (`S` is `head_dim × d_state`, row `p`
/// for the head's channel `p`), `y = S C + d·x`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn ssd_step_body(
    state: &mut [f32],
    x: &[f32],
    b: &[f32],
    c: &[f32],
    decay: f32,
    dt: f32,
    d: f32,
    y: &mut [f32],
) {
    let ds = b.len();
    debug_assert_eq!(state.len(), x.len() * ds);
    for ((row, &xp), yp) in state.chunks_exact_mut(ds).zip(x).zip(y.iter_mut()) {
        let dx = dt * xp;
        let mut acc = 0.0f32;
        for ((s, &bn), &cn) in row.iter_mut().zip(b).zip(c) {
            *s = *s * decay + dx * bn;
            acc += *s * cn;
        }
        *yp = acc + d * xp;
    }
}

/// `RMSNorm(x) · weight · silu(z)` in place (Qwen3.5's gated norm of a head's output).
pub fn gated_rms_norm(x: &mut [f32], z: &[f32], weight: &[f32], eps: f32) {
    super::rms_norm_inplace(x, weight, eps);
    for (v, &g) in x.iter_mut().zip(z) {
        *v *= super::silu(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The step equals the rule written out with whole matrices, in f64.
    #[test]
    fn delta_rule_step_matches_the_rule_written_out() {
        let (dk, dv) = (3, 4);
        let mut state: Vec<f32> = (0..dk * dv).map(|i| (i as f32 * 0.37).sin()).collect();
        let q = [0.3, -0.2, 0.5];
        let k = [0.6, 0.0, -0.8];
        let v = [1.0, -1.0, 0.5, 0.25];
        let (decay, beta) = (0.9f32, 0.7f32);
        let s0: Vec<f64> = state
            .iter()
            .map(|&x| f64::from(x) * f64::from(decay))
            .collect();
        let mut u = vec![0.0f64; dv];
        for i in 0..dk {
            for j in 0..dv {
                u[j] += s0[i * dv + j] * f64::from(k[i]);
            }
        }
        let delta: Vec<f64> = (0..dv)
            .map(|j| (f64::from(v[j]) - u[j]) * f64::from(beta))
            .collect();
        let mut want = vec![0.0f64; dv];
        let mut s1 = s0.clone();
        for i in 0..dk {
            for j in 0..dv {
                s1[i * dv + j] += f64::from(k[i]) * delta[j];
                want[j] += s1[i * dv + j] * f64::from(q[i]);
            }
        }
        let mut out = vec![0.0; dv];
        let mut carry = DeltaCarry::new(dv);
        delta_rule_step(
            &mut state,
            (&q, &k, &v),
            (decay, beta),
            &mut out,
            &mut carry,
            None,
        );
        for j in 0..dv {
            assert!((f64::from(out[j]) - want[j]).abs() < 1e-6, "{j}");
        }
        for (a, b) in state.iter().zip(&s1) {
            assert!((f64::from(*a) - b).abs() < 1e-6);
        }
    }

    /// The dispatched steps (AVX2 where the CPU has it) give their scalar twins' bits.
    #[test]
    fn dispatched_steps_equal_their_scalar_twins_bit_for_bit() {
        let mut seed = 12345u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 20001) as f32 / 10000.0 - 1.0
        };
        for (dk, dv) in [(128, 128), (16, 16), (3, 5), (64, 37)] {
            let state: Vec<f32> = (0..dk * dv).map(|_| rnd()).collect();
            let q: Vec<f32> = (0..dk).map(|_| rnd()).collect();
            let k: Vec<f32> = (0..dk).map(|_| rnd()).collect();
            let v: Vec<f32> = (0..dv).map(|_| rnd()).collect();
            let (mut a, mut b) = (state.clone(), state.clone());
            let (mut oa, mut ob) = (vec![0.0; dv], vec![0.0; dv]);
            let (mut ca, mut cb) = (DeltaCarry::new(dv), DeltaCarry::new(dv));
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            // Three tokens told their next (the state read once per token), then one not.
            for step in 0..4 {
                let next = (step < 3).then_some((k.as_slice(), 0.93));
                delta_rule_step(&mut a, (&q, &k, &v), (0.93, 0.4), &mut oa, &mut ca, next);
                delta_rule_step_scalar(&mut b, (&q, &k, &v), (0.93, 0.4), &mut ob, &mut cb, next);
                assert_eq!(bits(&a), bits(&b), "{dk}x{dv}");
                assert_eq!(bits(&oa), bits(&ob), "{dk}x{dv}");
            }
            // Without the carry (each step reading the state itself): the same bits.
            let (mut c, mut oc, mut cc) = (state.clone(), vec![0.0; dv], DeltaCarry::new(dv));
            let mut d_ = state.clone();
            let (mut od, mut cd) = (vec![0.0; dv], DeltaCarry::new(dv));
            for step in 0..4 {
                let next = (step < 3).then_some((k.as_slice(), 0.93));
                delta_rule_step(&mut c, (&q, &k, &v), (0.93, 0.4), &mut oc, &mut cc, next);
                delta_rule_step(&mut d_, (&q, &k, &v), (0.93, 0.4), &mut od, &mut cd, None);
                assert_eq!(bits(&c), bits(&d_), "{dk}x{dv} carried or not");
                assert_eq!(bits(&oc), bits(&od), "{dk}x{dv} carried or not");
            }
            // Mamba-2's step on the same shapes (head_dim x d_state).
            let (mut a, mut b) = (state.clone(), state);
            let (mut ya, mut yb) = (vec![0.0; dk], vec![0.0; dk]);
            let x: Vec<f32> = (0..dk).map(|_| rnd()).collect();
            let bb: Vec<f32> = (0..dv).map(|_| rnd()).collect();
            let c: Vec<f32> = (0..dv).map(|_| rnd()).collect();
            for _ in 0..3 {
                ssd_step(&mut a, &x, &bb, &c, 0.9, 0.3, 0.7, &mut ya);
                ssd_step_scalar(&mut b, &x, &bb, &c, 0.9, 0.3, 0.7, &mut yb);
            }
            assert_eq!(bits(&a), bits(&b), "ssd {dk}x{dv}");
            assert_eq!(bits(&ya), bits(&yb), "ssd {dk}x{dv}");
        }
    }

    /// Step by step over a sequence equals the convolution over the whole (zero-padded) input.
    #[test]
    fn conv_steps_equal_the_whole_convolution() {
        let (c, k, t) = (3, 4, 7);
        let weights: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.61).cos()).collect();
        let xs: Vec<f32> = (0..c * t).map(|i| (i as f32 * 0.23).sin()).collect();
        let mut window = vec![0.0; (k - 1) * c];
        for step in 0..t {
            let mut x = xs[step * c..(step + 1) * c].to_vec();
            causal_conv_step(&mut window, &weights, k, &mut x);
            for ch in 0..c {
                let mut want = 0.0f64;
                for tap in 0..k {
                    let at = step as isize - (k - 1 - tap) as isize;
                    if at >= 0 {
                        want +=
                            f64::from(weights[ch * k + tap]) * f64::from(xs[at as usize * c + ch]);
                    }
                }
                assert!(
                    (f64::from(x[ch]) - want).abs() < 1e-6,
                    "step {step} ch {ch}"
                );
            }
        }
    }
}
