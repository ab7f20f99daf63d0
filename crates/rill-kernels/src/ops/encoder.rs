//! What BERT-style encoders add to the elementwise operations: LayerNorm with a bias, and GELU
//! by the error function (BERT's `gelu`, not the tanh approximation Gemma's GeGLU uses).

/// LayerNorm in place: `x[i] = (x[i] - mean) / sqrt(var + eps) * weight[i] + bias[i]`, the mean
/// and the (biased) variance over `x` accumulated in f64.
pub fn layer_norm_inplace(x: &mut [f32], weight: &[f32], bias: &[f32], eps: f32) {
    let n = x.len().max(1) as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = (x.iter().map(|&v| (f64::from(v) - mean).powi(2))).sum::<f64>() / n;
    let inv = 1.0 / (var + f64::from(eps)).sqrt();
    for ((v, &w), &b) in x.iter_mut().zip(weight).zip(bias) {
        *v = ((f64::from(*v) - mean) * inv) as f32 * w + b;
    }
}

/// The error function, to f64's precision: its Maclaurin series below 3, the continued
/// fraction of `erfc` above (both converge fast there), ±1 past 6.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let value = if a < 3.0 {
        // erf(a) = 2/√π · Σ (-1)^n a^(2n+1) / (n! (2n+1))
        let (a2, mut term, mut sum) = (a * a, a, a);
        for n in 1..200 {
            term *= -a2 / n as f64;
            let add = term / (2 * n + 1) as f64;
            sum += add;
            if add.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else if a < 6.0 {
        // erfc(a) = e^(-a²)/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + 2/(a + ...))))), from the tail
        let mut frac = a;
        for k in (1..80).rev() {
            frac = a + (k as f64 / 2.0) / frac;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * frac)
    } else {
        1.0
    };
    value.copysign(x)
}

/// GELU by the error function: `x · Φ(x) = x/2 · (1 + erf(x/√2))`.
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    let x = f64::from(x);
    (0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// [`gelu_erf`] of every element, in place.
pub fn gelu_erf_inplace(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu_erf(*v));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Python's math.erf (libm).
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (2.999, 0.999_977_769_831_400_2),
            (3.0, 0.999_977_909_503_001_4),
            (4.0, 0.999_999_984_582_742_1),
            (-1.5, -0.966_105_146_475_310_7),
        ] {
            assert!((erf(x) - want).abs() < 1e-10, "erf({x}) = {}", erf(x));
        }
        // Continuous across the switch from the series to the fraction.
        assert!((erf(3.0 - 1e-12) - erf(3.0)).abs() < 1e-12);
    }

    #[test]
    fn gelu_and_layer_norm_known_values() {
        assert_eq!(gelu_erf(0.0), 0.0);
        assert!((gelu_erf(1.0) - 0.841_344_7).abs() < 1e-7);
        assert!((gelu_erf(-1.0) + 0.158_655_26).abs() < 1e-7);
        let mut x = [1.0, 2.0, 3.0, 4.0];
        layer_norm_inplace(&mut x, &[1.0, 1.0, 2.0, 1.0], &[0.0, 0.5, 0.0, 0.0], 0.0);
        let s = 1.0 / 1.25f32.sqrt();
        let want = [-1.5 * s, -0.5 * s + 0.5, 0.5 * s * 2.0, 1.5 * s];
        for (o, w) in x.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{x:?}");
        }
    }
}
