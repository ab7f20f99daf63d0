//! A product shape under each activation scheme and, for the 32-element block types, both weight
//! layouts (timed interleaved, run by run, in one process), cycling over distinct matrices as the
//! model's layers do: `cargo run -p rill-kernels --release --example down_bench`. By default
//! Gemma 3's down projection (640 × 2048, Q6_K and Q4_K, 18 layers); `ROWS`, `COLS`, `TYPES`
//! (e.g. `Q4_1,Q8_0`), `LAYERS`, `THREADS`, `TOKENS` (e.g. `1,32`) and `ACT` pick others.

use rill_kernels::{
    matmul_quant_group, Activations, QuantProduct, QuantType, ThreadPool, WeightLayout,
};
use std::time::Instant;

fn main() {
    let layers: usize = std::env::var("LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(18);
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (rows, cols) = (env("ROWS", 640), env("COLS", 2048));
    let types: Vec<QuantType> = match std::env::var("TYPES") {
        Ok(v) => v.split(',').map(type_named).collect(),
        Err(_) => vec![QuantType::Q6_K, QuantType::Q4_K],
    };
    let mut seed = 0x1234_5678u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for ty in types {
        let rb = ty.row_bytes(cols).unwrap();
        let mats: Vec<Vec<u8>> = (0..layers)
            .map(|_| {
                let mut w: Vec<u8> = (0..rb * rows).map(|_| next() as u8).collect();
                for blk in w.chunks_exact_mut(ty.block_bytes()) {
                    // Finite f16 scales (0x2000 ≈ 0.0078) where each type keeps them.
                    let at = if ty == QuantType::Q6_K { 208 } else { 0 };
                    blk[at..at + 2].copy_from_slice(&0x2000u16.to_le_bytes());
                    if matches!(ty, QuantType::Q4_K | QuantType::Q4_1 | QuantType::Q5_1) {
                        blk[2..4].copy_from_slice(&0x2000u16.to_le_bytes());
                    }
                }
                w
            })
            .collect();
        // The rows repacked into every other layout the type has (scales first; Q5_0 also
        // row-interleaved where its kernel runs): all layouts are timed interleaved, run by
        // run, so that this VM's speed swings hit them alike.
        let repacks: [(WeightLayout, rill_kernels::layout::Repack); 3] = [
            (WeightLayout::ScalesFirst, rill_kernels::repack_scales_first),
            (
                WeightLayout::RowInterleaved,
                rill_kernels::repack_rows_interleaved,
            ),
            (
                WeightLayout::RowInterleavedNibbles,
                rill_kernels::repack_rows_interleaved_nibbles,
            ),
        ];
        let packed: Vec<(WeightLayout, Vec<Vec<u8>>)> = repacks
            .iter()
            .filter(|(layout, _)| *layout == WeightLayout::ScalesFirst || rill_kernels::has_vnni())
            .filter(|(layout, _)| {
                *layout != WeightLayout::RowInterleavedNibbles || ty == QuantType::Q6_K
            })
            .filter_map(|&(layout, repack)| {
                let mats: Option<Vec<Vec<u8>>> = mats
                    .iter()
                    .map(|w| {
                        let row_bytes = layout.row_bytes(ty, cols).ok()?;
                        let mut packed = vec![0u8; row_bytes * rows];
                        repack(ty, cols, w, &mut packed).ok()?;
                        Some(packed)
                    })
                    .collect();
                Some((layout, mats?))
            })
            .collect();
        let layouts: Vec<(WeightLayout, &Vec<Vec<u8>>)> = [(WeightLayout::Blocks, &mats)]
            .into_iter()
            .chain(packed.iter().map(|(layout, p)| (*layout, p)))
            .collect();
        if matches!(ty, QuantType::Q4_K | QuantType::Q6_K) {
            let mut row = vec![0f32; cols];
            let w = &mats[0];
            for simd in [false, true] {
                let t = Instant::now();
                for _ in 0..20 {
                    for r in 0..rows {
                        let src = &w[r * rb..(r + 1) * rb];
                        if simd {
                            rill_kernels::dot::dequantize_row_simd(ty, src, &mut row);
                        } else {
                            rill_kernels::dequantize_row(ty, src, &mut row).unwrap();
                        }
                    }
                }
                let per = t.elapsed().as_secs_f64() / 20.0;
                println!(
                    "{ty:?} dequantize simd={simd}: {:.1} us/matrix, {:.3} ns/element",
                    per * 1e6,
                    per * 1e9 / (rows * cols) as f64
                );
            }
        }
        for threads in [1usize, 2] {
            if std::env::var("THREADS").is_ok_and(|v| v != threads.to_string()) {
                continue;
            }
            let pool = ThreadPool::new(threads);
            let token_counts: Vec<usize> = std::env::var("TOKENS").map_or(vec![1, 64], |v| {
                v.split(',').filter_map(|t| t.parse().ok()).collect()
            });
            for tokens in token_counts {
                let x: Vec<f32> = (0..cols * tokens)
                    .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 300.0)
                    .collect();
                let mut out = vec![0f32; rows * tokens];
                let mut scratch = Vec::new();
                for act in [
                    Activations::Int8,
                    Activations::Int8Refined,
                    Activations::Float,
                    Activations::Int16,
                ] {
                    if std::env::var("ACT").is_ok_and(|v| v != format!("{act:?}")) {
                        continue;
                    }
                    let reps = if tokens == 1 { 200 } else { 4 };
                    let run = |mats: &[Vec<u8>], layout, out: &mut Vec<f32>, scratch: &mut _| {
                        for w in mats {
                            let mut products = [QuantProduct {
                                ty,
                                weights: w,
                                n_rows: rows,
                                out,
                                activations: act,
                                layout,
                            }];
                            matmul_quant_group(&mut products, cols, &x, tokens, scratch, &pool)
                                .unwrap();
                        }
                    };
                    let mut secs = vec![0f64; layouts.len()];
                    for rep in 0..=reps {
                        for (k, &(layout, mats)) in layouts.iter().enumerate() {
                            // Q6_K's 8-bit products read its interleaved rows as nibbles only.
                            let runs = match act {
                                Activations::Float => layout == WeightLayout::Blocks,
                                Activations::Int16 => layout == WeightLayout::RowInterleaved,
                                _ => {
                                    !(ty == QuantType::Q6_K
                                        && layout == WeightLayout::RowInterleaved)
                                }
                            };
                            if !runs {
                                continue;
                            }
                            let t = Instant::now();
                            run(mats, layout, &mut out, &mut scratch);
                            if rep > 0 {
                                secs[k] += t.elapsed().as_secs_f64();
                            }
                        }
                    }
                    for (k, &(layout, _)) in layouts.iter().enumerate() {
                        if secs[k] == 0.0 {
                            continue;
                        }
                        let base = secs.iter().copied().find(|&s| s > 0.0).unwrap_or(secs[k]);
                        let per_layer = secs[k] / (reps * layers) as f64;
                        let gflops = 2.0 * (rows * cols * tokens) as f64 / per_layer / 1e9;
                        let gbs = (rb * rows) as f64 / per_layer / 1e9;
                        println!(
                            "{ty:?} threads {threads} tokens {tokens:3} {act:?} {layout:?}: {:8.1} us/layer  {gflops:6.1} GFLOP/s  {gbs:5.1} GB/s  ({:.3}x the first layout)",
                            per_layer * 1e6,
                            base / secs[k]
                        );
                    }
                }
            }
        }
    }
}

/// The weight type called `name` (as GGUF tools print it: `Q4_1`, `Q6_K`, ...).
fn type_named(name: &str) -> QuantType {
    QuantType::ALL
        .into_iter()
        .find(|t| format!("{t:?}") == name)
        .unwrap_or_else(|| panic!("unknown weight type {name}"))
}
