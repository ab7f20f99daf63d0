//! Every registered kernel this CPU can run (whatever `RILL_NO_VNNI`, `RILL_NO_AMX` or
//! `RILL_FORCE_SCALAR` say) against its declared scalar twin, over awkward sizes; and the
//! registry's own rules: one kernel per (type, operation, level), a portable twin under every
//! SIMD kernel, and the dispatch picking only registered kernels.

mod common;

use common::*;
use rill_kernels::dot::registry::{kernels, select, select_at, Kernel, Level, Operation};
use rill_kernels::dot::registry::{TileProblem, Twin};
use rill_kernels::*;

/// The weight rows of `k`'s layout made from `rows` rows in the file's blocks.
fn relayout(k: &Kernel, n: usize, rows: usize, blocks: &[u8]) -> Vec<u8> {
    let layout = k.operation.layout();
    let mut out = vec![0u8; layout.row_bytes(k.ty, n).unwrap() * rows];
    match layout {
        WeightLayout::Blocks => out.copy_from_slice(blocks),
        WeightLayout::ScalesFirst => repack_scales_first(k.ty, n, blocks, &mut out).unwrap(),
        WeightLayout::RowInterleaved => repack_rows_interleaved(k.ty, n, blocks, &mut out).unwrap(),
        WeightLayout::RowInterleavedNibbles => {
            repack_rows_interleaved_nibbles(k.ty, n, blocks, &mut out).unwrap()
        }
    }
    out
}

/// One activation row in the format `k` reads.
fn activation_row(k: &Kernel, x: &[f32]) -> Vec<u8> {
    match k.operation {
        Operation::FloatTiles => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Operation::Int16Tiles => {
            let mut a = vec![0u8; i16_row_bytes(x.len()).unwrap()];
            quantize_row_i16(x, &mut a).unwrap();
            a
        }
        _ => quantize_acts(k.ty, x).0,
    }
}

/// Σ |w_i · x_i|: the scale of a rounding difference.
fn magnitude(ty: QuantType, w: &[u8], x: &[f32]) -> f64 {
    let mut wd = vec![0f32; x.len()];
    dequantize_row(ty, w, &mut wd).unwrap();
    wd.iter()
        .zip(x)
        .map(|(w, x)| (*w as f64 * *x as f64).abs())
        .sum()
}

/// Runs `k` over `rows` × `tokens` of `n` elements and checks every value against its twin.
fn check(k: &Kernel, n: usize, rows: usize, tokens: usize, seed: u64) {
    let mut rng = Rng(seed);
    let (ty, row_bytes) = (k.ty, k.ty.row_bytes(n).unwrap());
    let blocks = random_matrix(ty, rows, n, &mut rng, -3 + (seed % 4) as i32);
    let xs: Vec<Vec<f32>> = (0..tokens).map(|_| random_acts(n, &mut rng)).collect();
    let acts: Vec<Vec<u8>> = xs.iter().map(|x| activation_row(k, x)).collect();
    let mut out = vec![f32::NAN; rows * tokens];
    if k.operation == Operation::Dot {
        for (t, a) in acts.iter().enumerate() {
            for r in 0..rows {
                out[t * rows + r] = k.dot(&blocks[r * row_bytes..][..row_bytes], a, n).unwrap();
            }
        }
    } else {
        k.tiles(TileProblem {
            weights: &relayout(k, n, rows, &blocks),
            activations: &acts.concat(),
            n_cols: n,
            n_rows: rows,
            n_tokens: tokens,
            out: &mut out,
        })
        .unwrap();
    }
    for (t, a) in acts.iter().enumerate() {
        for r in 0..rows {
            let w = &blocks[r * row_bytes..][..row_bytes];
            let got = out[t * rows + r];
            let twin = k
                .twin
                .eval(ty, w, a, n)
                .unwrap_or_else(|| panic!("{k:?}: its twin {:?} does not cover {ty}", k.twin));
            let at = format!("{k:?}: row {r} token {t} of {rows} x {tokens}, n {n}");
            if k.twin.is_bit_exact() {
                assert_eq!(got.to_bits(), twin.to_bits(), "{at}: {got} vs twin {twin}");
            } else {
                let bound = 1e-5 * magnitude(ty, w, &xs[t]) + 1e-30;
                assert!(
                    ((got - twin) as f64).abs() <= bound,
                    "{at}: {got} vs twin {twin} (bound {bound})"
                );
            }
        }
    }
}

/// Element counts: a ragged block count for the 32-element types (a partial group of eight),
/// one and three super-blocks, ragged tails for the float types' pairs.
fn sizes(k: &Kernel) -> Vec<usize> {
    match (k.ty.block_size(), k.operation) {
        (1, Operation::Dot) => vec![37, 512],
        (1, _) => vec![40, 512],
        (32, _) => vec![224, 512],
        (bs, _) => vec![bs, 3 * bs],
    }
}

#[test]
fn every_kernel_this_cpu_runs_equals_its_twin() {
    let mut ran = std::collections::BTreeMap::<Level, usize>::new();
    let mut absent = std::collections::BTreeMap::<Level, usize>::new();
    for k in kernels() {
        if !k.level.in_hardware() {
            *absent.entry(k.level).or_default() += 1;
            continue;
        }
        let interleaved = matches!(
            k.operation.layout(),
            WeightLayout::RowInterleaved | WeightLayout::RowInterleavedNibbles
        );
        let shapes: &[(usize, usize)] = match k.operation {
            Operation::Dot => &[(5, 3)],
            // 48 rows: groups two at a time, then one alone (the 16-bit tiles).
            _ if interleaved => &[(32, 1), (16, 5), (32, 21), (48, 9)],
            _ => &[(13, 1), (9, 6), (21, 19), (8, 35)],
        };
        for (i, n) in sizes(k).into_iter().enumerate() {
            for (j, &(rows, tokens)) in shapes.iter().enumerate() {
                check(k, n, rows, tokens, (k.ty as u64) << 16 | (i * 8 + j) as u64);
            }
        }
        *ran.entry(k.level).or_default() += 1;
    }
    eprintln!("registry: ran {ran:?} kernels against their twins; not on this CPU: {absent:?}");
    assert!(ran.get(&Level::Portable).copied().unwrap_or(0) > 0);
}

#[test]
fn every_kernel_has_a_portable_twin_and_the_dispatch_picks_registered_kernels() {
    let all: Vec<&Kernel> = kernels().collect();
    for k in &all {
        // The twin is evaluated with portable code: the pair kernel of the type, or a bit-exact
        // scalar function; a SIMD pair kernel's portable sibling exists.
        if k.twin == Twin::Scalar || k.twin == Twin::ScalarRounded {
            assert!(
                select_at(k.ty, Operation::Dot, Level::Portable).is_some(),
                "{k:?} has no portable pair kernel to be its twin"
            );
        }
        // Exactly the kernels registered at their slot.
        assert!(std::ptr::eq(
            select_at(k.ty, k.operation, k.level).unwrap(),
            *k
        ));
        // A pair kernel runs pairs; a tile kernel, rectangles.
        let pair = k.dot(&[], &[], 0);
        assert_eq!(
            k.operation == Operation::Dot,
            !matches!(pair, Err(KernelError::Unsupported { op, .. }) if op.contains("tile kernel")),
            "{k:?}"
        );
    }
    for ty in weight_types() {
        assert!(
            select_at(ty, Operation::Dot, Level::Portable).is_some(),
            "{ty}"
        );
        let chosen = select(ty, Operation::Dot).unwrap();
        assert!(chosen.level.enabled() && chosen.is_selected());
        // No enabled level above the chosen one has a kernel for it.
        for k in &all {
            if k.ty == ty && k.operation == Operation::Dot && k.level.enabled() {
                assert!(k.level <= chosen.level, "{k:?} above {chosen:?}");
            }
        }
    }
}

#[test]
fn a_kernel_refuses_operands_of_the_wrong_size() {
    let k = select_at(QuantType::Q4_0, Operation::Dot, Level::Portable).unwrap();
    assert!(k.dot(&[0u8; 18], &[0u8; 33], 32).is_err());
    let tiles = kernels()
        .find(|k| k.operation == Operation::FloatTiles && k.ty == QuantType::Q8_0)
        .unwrap();
    let mut out = vec![0f32; 4];
    let w = vec![0u8; 34 * 2];
    let a = vec![0u8; 4 * 32 * 2];
    fn problem<'a>(w: &'a [u8], a: &'a [u8], out: &'a mut [f32], rows: usize) -> TileProblem<'a> {
        TileProblem {
            weights: w,
            activations: a,
            n_cols: 32,
            n_rows: rows,
            n_tokens: 2,
            out,
        }
    }
    assert!(tiles.tiles(problem(&w, &a, &mut out, 2)).is_ok());
    assert!(tiles.tiles(problem(&w, &a, &mut out, 3)).is_err());
    assert!(tiles.tiles(problem(&w, &a, &mut out[..3], 2)).is_err());
}

/// The kernel a product runs is a registered, enabled one; its layout's tiles where they exist
/// (the rows' own kernels for repacked layouts, never a pair kernel), a pair kernel only for a
/// type with no tiles here (float weights: their float-activation tiles); float activations only
/// on the file's blocks.
#[test]
fn a_products_kernel_is_registered_and_reads_its_layout() {
    use rill_kernels::{product_kernel, Activations};
    for ty in weight_types() {
        for tokens in [1usize, 512] {
            let k = product_kernel(ty, WeightLayout::Blocks, Activations::Int8, tokens).unwrap();
            assert!(k.level.enabled(), "{k:?}");
            assert!(std::ptr::eq(
                select_at(k.ty, k.operation, k.level).unwrap(),
                k
            ));
            let has_tiles = select(ty, Operation::Tiles(WeightLayout::Blocks)).is_some()
                || select(ty, Operation::UnpackingTiles).is_some();
            if ty.vec_dot_type() == Some(QuantType::F32) {
                // Float weights: panels shared by every token.
                assert_eq!(k.operation, Operation::FloatTiles, "{k:?}");
            } else {
                assert_eq!(k.operation == Operation::Dot, !has_tiles, "{k:?}");
            }
            for layout in [
                WeightLayout::ScalesFirst,
                WeightLayout::RowInterleaved,
                WeightLayout::RowInterleavedNibbles,
            ] {
                match product_kernel(ty, layout, Activations::Int8, tokens) {
                    Ok(k) => assert_eq!(k.operation, Operation::Tiles(layout), "{k:?}"),
                    Err(e) => assert!(select(ty, Operation::Tiles(layout)).is_none(), "{e}"),
                }
                assert!(product_kernel(ty, layout, Activations::Float, tokens).is_err());
            }
        }
    }
}
