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

/// One token of the gated delta rule for one head (see [`delta_rule_step_scalar`]).
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_step(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::has_avx2_fma_f16c() {
        // SAFETY: the CPU has AVX2.
        return unsafe { avx2::delta_rule_step(state, q, k, v, decay, beta, out, scratch) };
    }
    delta_rule_step_body(state, q, k, v, decay, beta, out, scratch)
}

/// Scalar twin of [`delta_rule_step`].
#[allow(clippy::too_many_arguments)]
pub fn delta_rule_step_scalar(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    delta_rule_step_body(state, q, k, v, decay, beta, out, scratch)
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
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn delta_rule_step(
        state: &mut [f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        decay: f32,
        beta: f32,
        out: &mut [f32],
        scratch: &mut [f32],
    ) {
        super::delta_rule_step_body(state, q, k, v, decay, beta, out, scratch)
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

/// One token of the gated delta rule for one head. `state` is `d_k × d_v` (row `i` for key
/// dimension `i`); `q` is already scaled, `q` and `k` normalised. With `a = exp(g)`:
/// `S ← a·S`, `u = Sᵀk`, `δ = β(v − u)`, `S ← S + k δᵀ`, `out = Sᵀq`. `scratch` holds `d_v`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn delta_rule_step_body(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: f32,
    beta: f32,
    out: &mut [f32],
    scratch: &mut [f32],
) {
    let dv = v.len();
    debug_assert_eq!(state.len(), k.len() * dv);
    let mem = &mut scratch[..dv];
    mem.fill(0.0);
    for (row, &ki) in state.chunks_exact_mut(dv).zip(k) {
        for (s, m) in row.iter_mut().zip(mem.iter_mut()) {
            *s *= decay;
            *m += *s * ki;
        }
    }
    for (m, &vj) in mem.iter_mut().zip(v) {
        *m = (vj - *m) * beta;
    }
    out.fill(0.0);
    for ((row, &ki), &qi) in state.chunks_exact_mut(dv).zip(k).zip(q) {
        for ((s, &dj), o) in row.iter_mut().zip(mem.iter()).zip(out.iter_mut()) {
            *s += ki * dj;
            *o += *s * qi;
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
        let (mut out, mut scratch) = (vec![0.0; dv], vec![0.0; dv]);
        delta_rule_step(&mut state, &q, &k, &v, decay, beta, &mut out, &mut scratch);
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
            let (mut sa, mut sb) = (vec![0.0; dv], vec![0.0; dv]);
            for _ in 0..3 {
                delta_rule_step(&mut a, &q, &k, &v, 0.93, 0.4, &mut oa, &mut sa);
                delta_rule_step_scalar(&mut b, &q, &k, &v, 0.93, 0.4, &mut ob, &mut sb);
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{dk}x{dv}");
            assert_eq!(bits(&oa), bits(&ob), "{dk}x{dv}");
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
