//! matmul drivers: agreement with vec_dot (float weights: with their float-activation tiles'
//! twin) / dequantized reference, batch invariance, errors.

mod common;

use common::*;
use rill_kernels::*;

/// What one (row, token) of a product must be: the pair kernel's value, or for float weights
/// (which run in float-activation tiles) their dequantized twin's.
fn row_value(ty: QuantType, w: &[u8], a: &[u8], n: usize) -> f32 {
    if ty.vec_dot_type() == Some(QuantType::F32) {
        let twin = rill_kernels::dot::registry::Twin::Dequantized;
        return twin.eval(ty, w, a, n).unwrap();
    }
    vec_dot(ty, w, a, n).unwrap()
}

const N_ROWS: usize = 37;
const N_COLS: usize = 512;
const N_TOK: usize = 7;

fn setup(ty: QuantType, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng(seed);
    let w = random_matrix(ty, N_ROWS, N_COLS, &mut rng, -3);
    let x = random_acts(N_COLS * N_TOK, &mut rng);
    (w, x)
}

#[test]
fn matmul_quant_equals_vec_dot_and_is_batch_invariant() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    for ty in weight_types() {
        let (w, x) = setup(ty, 42 + ty.ggml_id() as u64);
        let rb = ty.row_bytes(N_COLS).unwrap();
        let mut scratch = Vec::new();

        // One token at a time, single thread.
        let mut single = vec![0f32; N_ROWS * N_TOK];
        for t in 0..N_TOK {
            let xt = &x[t * N_COLS..(t + 1) * N_COLS];
            let out = &mut single[t * N_ROWS..(t + 1) * N_ROWS];
            matmul_quant(
                Matrix::new(ty, &w, N_ROWS, N_COLS),
                xt,
                1,
                out,
                &mut scratch,
                &pools[0],
            )
            .unwrap();
            // Each output is exactly vec_dot on the quantized activation row.
            let (a, _) = quantize_acts(ty, xt);
            for r in 0..N_ROWS {
                let v = row_value(ty, &w[r * rb..(r + 1) * rb], &a, N_COLS);
                assert_eq!(v.to_bits(), out[r].to_bits(), "{ty} row {r}");
            }
        }
        // Whole batch and sub-batches, any thread count: bit-identical.
        for pool in &pools {
            let mut batch = vec![0f32; N_ROWS * N_TOK];
            matmul_quant(
                Matrix::new(ty, &w, N_ROWS, N_COLS),
                &x,
                N_TOK,
                &mut batch,
                &mut scratch,
                pool,
            )
            .unwrap();
            assert!(
                batch
                    .iter()
                    .zip(&single)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty}: batch of {N_TOK} on {} threads differs from single-token results",
                pool.n_threads()
            );
            let (t0, t1) = (2, 5);
            let mut sub = vec![0f32; N_ROWS * (t1 - t0)];
            matmul_quant(
                Matrix::new(ty, &w, N_ROWS, N_COLS),
                &x[t0 * N_COLS..t1 * N_COLS],
                t1 - t0,
                &mut sub,
                &mut scratch,
                pool,
            )
            .unwrap();
            assert_eq!(
                sub.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                single[t0 * N_ROWS..t1 * N_ROWS]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>(),
                "{ty}: sub-batch differs"
            );
        }
    }
}

#[test]
fn matmul_exact_matches_dequantized_reference_and_is_batch_invariant() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for ty in weight_types() {
        let (w, x) = setup(ty, 7 + ty.ggml_id() as u64);
        let rb = ty.row_bytes(N_COLS).unwrap();
        let mut wd = vec![0f32; N_ROWS * N_COLS];
        for r in 0..N_ROWS {
            dequantize_row(
                ty,
                &w[r * rb..(r + 1) * rb],
                &mut wd[r * N_COLS..(r + 1) * N_COLS],
            )
            .unwrap();
        }
        let mut first: Option<Vec<f32>> = None;
        for pool in &pools {
            let mut out = vec![0f32; N_ROWS * N_TOK];
            matmul_exact(
                Matrix::new(ty, &w, N_ROWS, N_COLS),
                &x,
                N_TOK,
                &mut out,
                pool,
            )
            .unwrap();
            for t in 0..N_TOK {
                for r in 0..N_ROWS {
                    let (wr, xt) = (
                        &wd[r * N_COLS..(r + 1) * N_COLS],
                        &x[t * N_COLS..(t + 1) * N_COLS],
                    );
                    let exact: f64 = wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let bound: f64 = wr
                        .iter()
                        .zip(xt)
                        .map(|(a, b)| (*a as f64 * *b as f64).abs())
                        .sum();
                    let got = out[t * N_ROWS + r] as f64;
                    assert!(
                        (got - exact).abs() <= 1e-5 * bound + 1e-30,
                        "{ty} t{t} r{r}: {got} vs {exact}"
                    );
                }
            }
            // Single token gives the same bits as inside the batch.
            let mut one = vec![0f32; N_ROWS];
            matmul_exact(
                Matrix::new(ty, &w, N_ROWS, N_COLS),
                &x[3 * N_COLS..4 * N_COLS],
                1,
                &mut one,
                pool,
            )
            .unwrap();
            assert!(one
                .iter()
                .zip(&out[3 * N_ROWS..4 * N_ROWS])
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            if let Some(f) = &first {
                assert!(
                    f.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty}: thread count changed bits"
                );
            } else {
                first = Some(out);
            }
        }
    }
}

#[test]
fn matmul_rejects_bad_sizes() {
    let pool = ThreadPool::new(2);
    let ty = QuantType::Q4_1;
    let w = vec![0u8; ty.row_bytes(64).unwrap() * 3];
    let x = vec![0f32; 64 * 2];
    let mut out = vec![0f32; 3 * 2];
    let mut s = Vec::new();
    assert!(matmul_quant(Matrix::new(ty, &w, 3, 64), &x, 2, &mut out, &mut s, &pool).is_ok());
    assert!(matmul_quant(Matrix::new(ty, &w, 4, 64), &x, 2, &mut out, &mut s, &pool).is_err());
    assert!(matmul_quant(
        Matrix::new(ty, &w, 3, 64),
        &x[1..],
        2,
        &mut out,
        &mut s,
        &pool
    )
    .is_err());
    assert!(matmul_quant(
        Matrix::new(ty, &w, 3, 64),
        &x,
        2,
        &mut out[1..],
        &mut s,
        &pool
    )
    .is_err());
    assert!(matmul_quant(Matrix::new(ty, &w, 3, 63), &x, 2, &mut out, &mut s, &pool).is_err());
    assert!(matmul_quant(
        Matrix::new(QuantType::Q8_K, &w, 3, 64),
        &x,
        2,
        &mut out,
        &mut s,
        &pool
    )
    .is_err());
    assert!(matmul_exact(Matrix::new(ty, &w, 3, 64), &x, 2, &mut out, &pool).is_ok());
    assert!(matmul_exact(Matrix::new(ty, &w, 3, 64), &x, 3, &mut out, &pool).is_err());
    assert!(matmul_exact(Matrix::new(ty, &w, usize::MAX, 64), &x, 2, &mut out, &pool).is_err());
    assert_eq!(quant_scratch_bytes(ty, 64, 2), Ok(72 * 2));
    assert_eq!(quant_scratch_bytes(QuantType::F16, 64, 2), Ok(0));
}

/// Two-level activations: much closer to the f32 product than one level, even with an outlier
/// in every block, and still batch invariant across thread counts and batch sizes.
#[test]
fn refined_activations_are_closer_to_exact_and_batch_invariant() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for ty in weight_types().filter(|t| t.is_quantized()) {
        let (w, mut x) = setup(ty, 7 + ty.ggml_id() as u64);
        for v in x.iter_mut().step_by(61) {
            *v *= 40.0;
        }
        let mut scratch = Vec::new();
        let mut exact = vec![0f32; N_ROWS * N_TOK];
        let mut plain = vec![0f32; N_ROWS * N_TOK];
        let mut refined = vec![0f32; N_ROWS * N_TOK];
        matmul_exact(
            Matrix::new(ty, &w, N_ROWS, N_COLS),
            &x,
            N_TOK,
            &mut exact,
            &pools[0],
        )
        .unwrap();
        matmul_quant(
            Matrix::new(ty, &w, N_ROWS, N_COLS),
            &x,
            N_TOK,
            &mut plain,
            &mut scratch,
            &pools[0],
        )
        .unwrap();
        matmul_quant_refined(
            Matrix::new(ty, &w, N_ROWS, N_COLS),
            &x,
            N_TOK,
            &mut refined,
            &mut scratch,
            &pools[0],
        )
        .unwrap();
        let err = |v: &[f32]| -> f64 {
            v.iter()
                .zip(&exact)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum::<f64>()
                .sqrt()
        };
        let (e_plain, e_refined) = (err(&plain), err(&refined));
        assert!(
            e_refined * 20.0 < e_plain,
            "{ty}: refined error {e_refined} not well below plain error {e_plain}"
        );
        for pool in &pools {
            for t in 0..N_TOK {
                let mut one = vec![0f32; N_ROWS];
                let xt = &x[t * N_COLS..(t + 1) * N_COLS];
                matmul_quant_refined(
                    Matrix::new(ty, &w, N_ROWS, N_COLS),
                    xt,
                    1,
                    &mut one,
                    &mut scratch,
                    pool,
                )
                .unwrap();
                let row = &refined[t * N_ROWS..(t + 1) * N_ROWS];
                assert!(
                    one.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty}: token {t} differs alone vs batched"
                );
            }
        }
    }
}

/// Every output of the tiled path equals the single-pair `vec_dot` bit for bit, for batch sizes
/// that hit every tile shape and edge (1 token is decode), odd row counts, inner sizes with a
/// partial group of blocks, and 1, 2 or 3 threads; the refined path gives each token the same
/// bits alone as inside the batch.
#[test]
fn matmul_quant_is_bit_identical_to_vec_dot_for_any_batch_and_split() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    for ty in weight_types() {
        let n_cols = if ty.block_size() == 256 { 768 } else { 800 };
        let rb = ty.row_bytes(n_cols).unwrap();
        let mut rng = Rng(0xC0FFEE + ty.ggml_id() as u64);
        let max_rows = 41;
        let max_tok = 64;
        let w = random_matrix(ty, max_rows, n_cols, &mut rng, -3);
        let x = random_acts(n_cols * max_tok, &mut rng);
        let acts: Vec<Vec<u8>> = (0..max_tok)
            .map(|t| quantize_acts(ty, &x[t * n_cols..(t + 1) * n_cols]).0)
            .collect();
        let mut scratch = Vec::new();
        for n_rows in [1usize, 5, 41] {
            let expect: Vec<Vec<u32>> = acts
                .iter()
                .map(|a| {
                    (0..n_rows)
                        .map(|r| row_value(ty, &w[r * rb..(r + 1) * rb], a, n_cols).to_bits())
                        .collect()
                })
                .collect();
            for n_tok in [1usize, 2, 3, 5, 17, 64] {
                for pool in &pools {
                    let mut out = vec![0f32; n_rows * n_tok];
                    matmul_quant(
                        Matrix::new(ty, &w[..n_rows * rb], n_rows, n_cols),
                        &x[..n_tok * n_cols],
                        n_tok,
                        &mut out,
                        &mut scratch,
                        pool,
                    )
                    .unwrap();
                    for t in 0..n_tok {
                        for r in 0..n_rows {
                            assert_eq!(
                                out[t * n_rows + r].to_bits(),
                                expect[t][r],
                                "{ty}: rows {n_rows} tokens {n_tok} threads {} at t{t} r{r}",
                                pool.n_threads()
                            );
                        }
                    }
                }
            }
            if !ty.is_quantized() {
                continue;
            }
            // Refined: the batch of 64 against each token alone.
            let mut batch = vec![0f32; n_rows * max_tok];
            matmul_quant_refined(
                Matrix::new(ty, &w[..n_rows * rb], n_rows, n_cols),
                &x,
                max_tok,
                &mut batch,
                &mut scratch,
                &pools[2],
            )
            .unwrap();
            for t in [0usize, 1, 5, 17, 63] {
                let mut one = vec![0f32; n_rows];
                matmul_quant_refined(
                    Matrix::new(ty, &w[..n_rows * rb], n_rows, n_cols),
                    &x[t * n_cols..(t + 1) * n_cols],
                    1,
                    &mut one,
                    &mut scratch,
                    &pools[0],
                )
                .unwrap();
                assert!(
                    one.iter()
                        .zip(&batch[t * n_rows..(t + 1) * n_rows])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty}: refined token {t} differs alone vs in a batch of {max_tok} ({n_rows} rows)"
                );
            }
        }
    }
}

/// A group of products over one input (mixed types and refinement) gives each product's
/// bits alone, for any batch size and thread count.
#[test]
fn a_product_group_equals_its_products_alone() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    let n_cols = 512;
    let mut rng = Rng(0x6E0);
    let types = [
        QuantType::Q4_1,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::F16,
    ];
    let rows = [37usize, 5, 64, 3];
    let ws: Vec<Vec<u8>> = types
        .iter()
        .zip(rows)
        .map(|(&ty, n)| random_matrix(ty, n, n_cols, &mut rng, -3))
        .collect();
    let x = random_acts(n_cols * 9, &mut rng);
    let mut scratch = Vec::new();
    for n_tok in [1usize, 2, 5, 9] {
        let x = &x[..n_tok * n_cols];
        for refined in [false, true] {
            let alone: Vec<Vec<f32>> = (0..4)
                .map(|k| {
                    let mut out = vec![0f32; rows[k] * n_tok];
                    let matmul = if refined && k != 1 {
                        matmul_quant_refined
                    } else {
                        matmul_quant
                    };
                    let (ty, n) = (types[k], rows[k]);
                    let m = Matrix::new(ty, &ws[k], n, n_cols);
                    matmul(m, x, n_tok, &mut out, &mut scratch, &pools[0]).unwrap();
                    out
                })
                .collect();
            for pool in &pools {
                let mut outs: Vec<Vec<f32>> = (0..4).map(|k| vec![0f32; rows[k] * n_tok]).collect();
                let mut products: Vec<QuantProduct> = outs
                    .iter_mut()
                    .enumerate()
                    .map(|(k, out)| QuantProduct {
                        ty: types[k],
                        weights: &ws[k],
                        n_rows: rows[k],
                        out,
                        activations: if refined && k != 1 {
                            rill_kernels::Activations::Int8Refined
                        } else {
                            rill_kernels::Activations::Int8
                        },
                        layout: WeightLayout::Blocks,
                    })
                    .collect();
                matmul_quant_group(&mut products, n_cols, x, n_tok, &mut scratch, pool).unwrap();
                for k in 0..4 {
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&outs[k]),
                        bits(&alone[k]),
                        "{}: tokens {n_tok} refined {refined} threads {}",
                        types[k],
                        pool.n_threads()
                    );
                }
            }
        }
    }
}

/// Float activations (weights dequantized exactly, f32 activations): every output equals the
/// portable scalar twin bit for bit, for any batch size, row count and thread count, and sits
/// within f32 rounding of the exact path.
#[test]
fn float_activations_equal_the_scalar_twin_for_any_batch_and_split() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    for ty in weight_types().filter(|t| t.is_quantized()) {
        let n_cols = if ty.block_size() == 256 { 768 } else { 800 };
        let rb = ty.row_bytes(n_cols).unwrap();
        let mut rng = Rng(0xF10A7 + ty.ggml_id() as u64);
        let (max_rows, max_tok) = (19usize, 64usize);
        let w = random_matrix(ty, max_rows, n_cols, &mut rng, -3);
        let x = random_acts(n_cols * max_tok, &mut rng);
        let twin = |r: usize, t: usize| {
            dot::twins::deq_bitexact(
                ty,
                &w[r * rb..(r + 1) * rb],
                &x[t * n_cols..(t + 1) * n_cols],
                n_cols,
            )
            .unwrap()
        };
        let mut scratch = Vec::new();
        for n_rows in [1usize, 7, 8, 19] {
            for n_tok in [1usize, 2, 3, 4, 17, 64] {
                for pool in &pools {
                    let mut out = vec![0f32; n_rows * n_tok];
                    matmul_quant_with(
                        Matrix::new(ty, &w[..n_rows * rb], n_rows, n_cols),
                        &x[..n_tok * n_cols],
                        n_tok,
                        &mut out,
                        &mut scratch,
                        pool,
                        Activations::Float,
                    )
                    .unwrap();
                    for t in 0..n_tok {
                        for r in 0..n_rows {
                            assert_eq!(
                                out[t * n_rows + r].to_bits(),
                                twin(r, t).to_bits(),
                                "{ty}: rows {n_rows} tokens {n_tok} threads {} at t{t} r{r}",
                                pool.n_threads()
                            );
                        }
                    }
                }
            }
        }
        // Against the exact path (the same dequantized row, an f32 dot in another order):
        // within the worst-case rounding bound of an n-term sum, n·ε·Σ|w·x|.
        let mut exact = vec![0f32; max_rows * 3];
        matmul_exact(
            Matrix::new(ty, &w, max_rows, n_cols),
            &x[..3 * n_cols],
            3,
            &mut exact,
            &pools[1],
        )
        .unwrap();
        let mut row = vec![0f32; n_cols];
        for r in 0..max_rows {
            dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut row).unwrap();
            for t in 0..3 {
                let xt = &x[t * n_cols..(t + 1) * n_cols];
                let magnitude: f32 = row.iter().zip(xt).map(|(a, b)| (a * b).abs()).sum();
                let bound = n_cols as f32 * f32::EPSILON * magnitude;
                let (a, b) = (twin(r, t), exact[t * max_rows + r]);
                assert!(
                    (a - b).abs() <= bound,
                    "{ty} r{r} t{t}: {a} vs {b} (bound {bound})"
                );
            }
        }
    }
}

/// The float-activation tiles' SIMD dequantizers give exactly the reference dequantizer's values.
#[test]
fn simd_dequantization_is_bit_exact() {
    let mut rng = Rng(0xDE0);
    for ty in [QuantType::Q4_K, QuantType::Q6_K] {
        for blocks in [1usize, 2, 3, 9] {
            let n = blocks * ty.block_size();
            let w = random_weights(ty, n, &mut rng, -2);
            let mut reference = vec![0f32; n];
            dequantize_row(ty, &w, &mut reference).unwrap();
            let mut simd = vec![f32::NAN; n];
            if !dot::dequantize_row_simd(ty, &w, &mut simd) {
                return; // No AVX2 on this CPU: nothing to compare.
            }
            for (i, (a, b)) in simd.iter().zip(&reference).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{ty} {blocks} blocks, element {i}"
                );
            }
        }
    }
}
