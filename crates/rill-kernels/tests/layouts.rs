//! The repacked layouts (scales first, row-interleaved in groups of 16, Q6_K's nibble groups)
//! through the matmul drivers: bit for bit as their twins, for any batch, split and group; bad
//! shapes refused.

mod common;

use common::*;
use rill_kernels::*;

/// The 32-element block types, whose rows can be laid out scales first.
const SCALES_FIRST_TYPES: [QuantType; 5] = [
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
];

/// Scales-first rows give every output bit for bit as the GGUF block layout does (which the
/// tests above tie to the scalar twin), for any batch size, row count, thread count and both
/// 8-bit activation schemes; the repacking round-trips.
#[test]
fn scales_first_rows_equal_the_block_layout_bit_for_bit() {
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    for ty in SCALES_FIRST_TYPES {
        // 25 blocks per row: three whole groups of 8 scales and a tail of one.
        let n_cols = 800;
        let rb = ty.row_bytes(n_cols).unwrap();
        let mut rng = Rng(0x5CA1E5 + ty.ggml_id() as u64);
        let (max_rows, max_tok) = (19usize, 64usize);
        let w = random_matrix(ty, max_rows, n_cols, &mut rng, -3);
        let mut packed = vec![0u8; w.len()];
        repack_scales_first(ty, n_cols, &w, &mut packed).unwrap();
        let mut back = vec![0u8; w.len()];
        unpack_scales_first(ty, n_cols, &packed, &mut back).unwrap();
        assert_eq!(back, w, "{ty}: repacking round-trips");
        if WeightLayout::fastest_for(ty) != WeightLayout::ScalesFirst {
            // No kernel reads this layout on this CPU: using it is an error, not a wrong answer.
            let mut out = vec![0f32; 1];
            let mut products = [QuantProduct {
                ty,
                weights: &packed[..rb],
                n_rows: 1,
                out: &mut out,
                activations: Activations::Int8,
                layout: WeightLayout::ScalesFirst,
            }];
            let x = vec![0f32; n_cols];
            let mut scratch = Vec::new();
            let result = matmul_quant_group(&mut products, n_cols, &x, 1, &mut scratch, &pools[0]);
            assert!(matches!(result, Err(KernelError::Unsupported { .. })));
            continue;
        }
        let x = random_acts(n_cols * max_tok, &mut rng);
        let mut scratch = Vec::new();
        for activations in [Activations::Int8, Activations::Int8Refined] {
            for n_rows in [1usize, 4, 7, 19] {
                for n_tok in [1usize, 2, 3, 4, 17, 64] {
                    for pool in &pools {
                        let mut outs = [vec![0f32; n_rows * n_tok], vec![0f32; n_rows * n_tok]];
                        for (out, (weights, layout)) in outs.iter_mut().zip([
                            (&w, WeightLayout::Blocks),
                            (&packed, WeightLayout::ScalesFirst),
                        ]) {
                            let mut products = [QuantProduct {
                                ty,
                                weights: &weights[..n_rows * rb],
                                n_rows,
                                out,
                                activations,
                                layout,
                            }];
                            let x = &x[..n_tok * n_cols];
                            matmul_quant_group(&mut products, n_cols, x, n_tok, &mut scratch, pool)
                                .unwrap();
                        }
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&outs[1]),
                            bits(&outs[0]),
                            "{ty} {activations:?}: rows {n_rows} tokens {n_tok} threads {}",
                            pool.n_threads()
                        );
                    }
                }
            }
        }
    }
}

/// Repacking rejects what it cannot lay out: other types, partial rows, mismatched buffers.
#[test]
fn scales_first_repacking_rejects_bad_shapes() {
    let mut dst = vec![0u8; 36];
    let q4k = vec![0u8; 144];
    let mut q4k_dst = vec![0u8; 144];
    assert!(repack_scales_first(QuantType::Q4_K, 256, &q4k, &mut q4k_dst).is_err());
    // Half of a 64-element Q4_0 row (two 18-byte blocks), a short destination, and a row
    // length that is no whole number of blocks.
    assert!(repack_scales_first(QuantType::Q4_0, 64, &[0u8; 18], &mut dst[..18]).is_err());
    assert!(repack_scales_first(QuantType::Q4_0, 64, &[0u8; 36], &mut dst[..35]).is_err());
    assert!(repack_scales_first(QuantType::Q4_0, 30, &[0u8; 36], &mut dst).is_err());
    assert!(repack_scales_first(QuantType::Q4_0, 64, &[0u8; 36], &mut dst).is_ok());
}

/// 16 rows of `weights` in `layout` (`n_cols` each) under `activations` are refused with a
/// typed error, not computed.
fn assert_interleaved_unsupported(
    ty: QuantType,
    layout: WeightLayout,
    weights: &[u8],
    n_cols: usize,
    activations: Activations,
    pool: &ThreadPool,
) {
    let mut out = vec![0f32; 16];
    let mut products = [QuantProduct {
        ty,
        weights,
        n_rows: 16,
        out: &mut out,
        activations,
        layout,
    }];
    let x = vec![0f32; n_cols];
    let result = matmul_quant_group(&mut products, n_cols, &x, 1, &mut Vec::new(), pool);
    assert!(matches!(result, Err(KernelError::Unsupported { .. })));
}

/// A row-interleaved product for [`check_interleaved`]: `n_rows` rows of `packed` (`row_bytes`
/// each, in `layout`), under `activations`.
struct Interleaved<'a> {
    ty: QuantType,
    layout: WeightLayout,
    packed: &'a [u8],
    row_bytes: usize,
    n_rows: usize,
    activations: Activations,
}

/// Runs `p` over the first `n_tok` tokens of `x`, alone or (`other`: 7 Q8_0 rows in the block
/// layout and their activations) after another product in the same group, so that the
/// interleaved rows start mid-way through the row space; asserts every output equals
/// `expect[t][r]` bit for bit and, grouped, that the other product's outputs equal its own
/// alone.
fn check_interleaved(
    p: &Interleaved,
    other: Option<(&[u8], Activations)>,
    (x, n_cols, n_tok): (&[f32], usize, usize),
    pool: &ThreadPool,
    expect: &[Vec<f32>],
) {
    let (ty, n_rows) = (p.ty, p.n_rows);
    let mut scratch = Vec::new();
    let mut out = vec![0f32; n_rows * n_tok];
    let mut other_out = vec![0f32; 7 * n_tok];
    let interleaved = QuantProduct {
        ty,
        weights: &p.packed[..n_rows * p.row_bytes],
        n_rows,
        out: &mut out,
        activations: p.activations,
        layout: p.layout,
    };
    let xs = &x[..n_tok * n_cols];
    match other {
        Some((weights, activations)) => {
            let first = QuantProduct {
                ty: QuantType::Q8_0,
                weights,
                n_rows: 7,
                out: &mut other_out,
                activations,
                layout: WeightLayout::Blocks,
            };
            let mut products = [first, interleaved];
            matmul_quant_group(&mut products, n_cols, xs, n_tok, &mut scratch, pool).unwrap();
        }
        None => {
            let mut products = [interleaved];
            matmul_quant_group(&mut products, n_cols, xs, n_tok, &mut scratch, pool).unwrap();
        }
    }
    for t in 0..n_tok {
        for r in 0..n_rows {
            assert_eq!(
                out[t * n_rows + r].to_bits(),
                expect[t][r].to_bits(),
                "{ty} {:?}: row {r} token {t} of {n_rows} x {n_tok}, threads {}, with another \
                 product {}",
                p.activations,
                pool.n_threads(),
                other.is_some()
            );
        }
    }
    if let Some((weights, activations)) = other {
        let mut alone = vec![0f32; 7 * n_tok];
        matmul_quant_with(
            Matrix::new(QuantType::Q8_0, weights, 7, n_cols),
            xs,
            n_tok,
            &mut alone,
            &mut scratch,
            pool,
            activations,
        )
        .unwrap();
        assert_eq!(alone, other_out, "the other product is unchanged");
    }
}

/// Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, MXFP4, IQ4_XS, Q4_K, Q5_K and Q6_K (its nibble layout) rows
/// interleaved in groups of 16 give every output bit for bit as the layout's scalar twin does (the super-block types: the plain
/// scalar kernels, whose arithmetic the layout's 8-bit kernels keep), for batch sizes across the kernel's 64-token steps (1
/// token is decode), one or both 8-bit activation schemes, 1-3 threads and groups of products
/// whose other rows are no multiple of 16; the repacking round-trips (the super-block types,
/// whose groups hold decoded scales, are not unpacked), and using the layout without its kernel is an error, never
/// a wrong answer.
#[test]
fn row_interleaved_rows_equal_their_scalar_twin_bit_for_bit() {
    for ty in [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q8_0,
        QuantType::IQ4_NL,
        QuantType::MXFP4,
        QuantType::IQ4_XS,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
    ] {
        let super_blocks = matches!(
            ty,
            QuantType::IQ4_XS | QuantType::Q4_K | QuantType::Q5_K | QuantType::Q6_K
        );
        // Q6_K's 8-bit kernel reads its own (nibble) layout.
        let (layout, repack): (WeightLayout, rill_kernels::layout::Repack) =
            if ty == QuantType::Q6_K {
                (
                    WeightLayout::RowInterleavedNibbles,
                    repack_rows_interleaved_nibbles,
                )
            } else {
                (WeightLayout::RowInterleaved, repack_rows_interleaved)
            };
        let n_cols = if super_blocks { 768 } else { 640 };
        let rb = ty.row_bytes(n_cols).unwrap();
        let prb = layout.row_bytes(ty, n_cols).unwrap();
        let mut rng = Rng(0x1D1E5 + ty.ggml_id() as u64);
        let max_rows = 48;
        let w = random_matrix(ty, max_rows, n_cols, &mut rng, -3);
        let mut packed = vec![0u8; max_rows * prb];
        repack(ty, n_cols, &w, &mut packed).unwrap();
        let mut back = vec![0u8; w.len()];
        if super_blocks {
            assert!(unpack_rows_interleaved(ty, n_cols, &packed, &mut back).is_err());
        } else {
            unpack_rows_interleaved(ty, n_cols, &packed, &mut back).unwrap();
            assert_eq!(back, w, "repacking round-trips");
        }
        let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
        if !has_vnni() {
            // No kernel reads this layout here: using it is an error, not a wrong answer.
            assert_interleaved_unsupported(
                ty,
                layout,
                &packed[..16 * prb],
                n_cols,
                Activations::Int8,
                &pools[0],
            );
            continue;
        }
        let max_tok = 130;
        let mut x = random_acts(n_cols * max_tok, &mut rng);
        for v in x.iter_mut().step_by(97) {
            *v *= 30.0;
        }
        // The twin's value of every (row, token), for each scheme: the parts' values summed.
        let twin = |refined: bool, r: usize, t: usize| -> f32 {
            let xt = &x[t * n_cols..(t + 1) * n_cols];
            let (q, d) = quantize_acts(ty, xt);
            let row = &w[r * rb..(r + 1) * rb];
            let dot = |q: &[u8]| {
                if ty == QuantType::IQ4_XS {
                    dot::scalar::iq4_xs_q8_k(row, q, n_cols)
                } else if ty == QuantType::Q4_K {
                    dot::scalar::q4_k_q8_k(row, q, n_cols)
                } else if ty == QuantType::Q5_K {
                    dot::scalar::q5_k_q8_k(row, q, n_cols)
                } else if ty == QuantType::Q6_K {
                    dot::scalar::q6_k_q8_k(row, q, n_cols)
                } else {
                    dot::twins::rows_bitexact(ty, row, q, n_cols).unwrap()
                }
            };
            let mut v = dot(&q);
            if refined {
                let residual: Vec<f32> = xt.iter().zip(&d).map(|(a, b)| a - b).collect();
                let (q2, _) = quantize_acts(ty, &residual);
                v += dot(&q2);
            }
            v
        };
        // A Q8_0 product of 7 rows goes first in some groups, so the interleaved rows start
        // mid-way through the row space.
        let other_ty = QuantType::Q8_0;
        let other = random_matrix(other_ty, 7, n_cols, &mut rng, -3);
        for activations in [Activations::Int8, Activations::Int8Refined] {
            let refined = activations == Activations::Int8Refined;
            let expect: Vec<Vec<f32>> = (0..max_tok)
                .map(|t| (0..max_rows).map(|r| twin(refined, r, t)).collect())
                .collect();
            for n_rows in [16usize, 48] {
                let p = Interleaved {
                    ty,
                    layout,
                    packed: &packed,
                    row_bytes: prb,
                    n_rows,
                    activations,
                };
                for n_tok in [1usize, 2, 3, 17, 64, 65, 130] {
                    for pool in &pools {
                        for other in [None, Some((&other[..], activations))] {
                            check_interleaved(&p, other, (&x, n_cols, n_tok), pool, &expect);
                        }
                    }
                }
            }
        }
    }
}

/// The row-interleaved layout takes whole groups of 16 Q5_0 or Q8_0 rows only.
#[test]
fn row_interleaved_repacking_rejects_bad_shapes() {
    let rb = QuantType::Q5_0.row_bytes(64).unwrap();
    let src = vec![0u8; 16 * rb];
    let mut dst = vec![0u8; 16 * rb];
    assert!(repack_rows_interleaved(QuantType::Q5_0, 64, &src, &mut dst).is_ok());
    assert!(
        repack_rows_interleaved(QuantType::Q5_0, 64, &src[..15 * rb], &mut dst[..15 * rb]).is_err()
    );
    assert!(repack_rows_interleaved(QuantType::Q5_0, 64, &src, &mut dst[..rb]).is_err());
    assert!(repack_rows_interleaved(QuantType::Q5_1, 64, &src, &mut dst).is_err());
    assert!(repack_rows_interleaved(QuantType::Q5_0, 60, &src, &mut dst).is_err());
}

/// Q4_K and Q6_K rows interleaved in groups of 16, against 16-bit activations, give every output
/// bit for bit as the layout's scalar twin does (for 1 to 130 tokens, 1-3 threads, alone or
/// grouped with an 8-bit product of 7 rows), and the twin itself agrees with the exact
/// dequantized dot product to the activations' 12-bit resolution.
#[test]
fn row_interleaved_k_quants_equal_their_scalar_twin_bit_for_bit() {
    let n_cols = 512;
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    for ty in [QuantType::Q6_K, QuantType::Q4_K] {
        let mut rng = Rng(0xD016 + ty.ggml_id() as u64);
        let (rb, max_rows, max_tok) = (ty.row_bytes(n_cols).unwrap(), 32usize, 130usize);
        let prb = WeightLayout::RowInterleaved.row_bytes(ty, n_cols).unwrap();
        let w = random_matrix(ty, max_rows, n_cols, &mut rng, -3);
        let mut packed = vec![0u8; max_rows * prb];
        repack_rows_interleaved(ty, n_cols, &w, &mut packed).unwrap();
        let unsupported = |activations| {
            let (weights, layout) = (&packed[..16 * prb], WeightLayout::RowInterleaved);
            assert_interleaved_unsupported(ty, layout, weights, n_cols, activations, &pools[0]);
        };
        if !has_vnni() {
            unsupported(Activations::Int16);
            continue;
        }
        let mut x = random_acts(n_cols * max_tok, &mut rng);
        for v in x.iter_mut().step_by(89) {
            *v *= 25.0;
        }
        let arb = i16_row_bytes(n_cols).unwrap();
        let mut acts = vec![0u8; arb * max_tok];
        for (t, a) in acts.chunks_exact_mut(arb).enumerate() {
            quantize_row_i16(&x[t * n_cols..(t + 1) * n_cols], a).unwrap();
        }
        let mut row = vec![0f32; n_cols];
        let expect: Vec<Vec<f32>> = (0..max_tok)
            .map(|t| {
                (0..max_rows)
                    .map(|r| {
                        let wr = &w[r * rb..(r + 1) * rb];
                        let a = &acts[t * arb..(t + 1) * arb];
                        let v = dot::twins::k_rows_i16_bitexact(ty, wr, a, n_cols).unwrap();
                        // The twin against the exact product: the activations' rounding is at
                        // most half a step of 1/2047 of each block's largest magnitude.
                        dequantize_row(ty, wr, &mut row).unwrap();
                        let xt = &x[t * n_cols..(t + 1) * n_cols];
                        let exact: f64 =
                            row.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let bound: f64 = row
                            .chunks(256)
                            .zip(xt.chunks(256))
                            .map(|(wb, xb)| {
                                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                                let wsum: f64 = wb.iter().map(|v| v.abs() as f64).sum();
                                wsum * amax / 2047.0
                            })
                            .sum();
                        assert!(
                            (v as f64 - exact).abs() <= 0.5 * bound + 1e-3 * exact.abs() + 1e-6,
                            "{ty}: row {r} token {t}: twin {v} vs exact {exact} (bound {bound})"
                        );
                        v
                    })
                    .collect()
            })
            .collect();
        let other = random_matrix(QuantType::Q8_0, 7, n_cols, &mut rng, -3);
        for n_rows in [16usize, 32] {
            let p = Interleaved {
                ty,
                layout: WeightLayout::RowInterleaved,
                packed: &packed,
                row_bytes: prb,
                n_rows,
                activations: Activations::Int16,
            };
            for n_tok in [1usize, 2, 3, 5, 64, 67, 130] {
                for pool in &pools {
                    for other in [None, Some((&other[..], Activations::Int8))] {
                        check_interleaved(&p, other, (&x, n_cols, n_tok), pool, &expect);
                    }
                }
            }
        }
        // 8-bit activations on Q6_K rows (which no kernel reads so) are an error, not a wrong
        // answer; Q4_K's are tested with the other 8-bit types.
        if ty == QuantType::Q6_K {
            unsupported(Activations::Int8);
        }
    }
}
