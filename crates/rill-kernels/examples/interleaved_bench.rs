//! One tile kernel of the row-interleaved layout alone, on one thread:
//! `cargo run -p rill-kernels --release --example interleaved_bench [-- ROWS COLS TOKENS TYPE]`
//! (defaults 1536 576 512 Q4_1; a fifth argument `i16` times the 16-bit-activation tiles). Prints the best of several trials in GOPS (2 · rows · cols ·
//! tokens per call), so a change to the kernel's schedule can be timed without the engine.

use rill_kernels::dot::registry::{select, Operation, TileProblem};
use rill_kernels::{quantize_row, QuantType, WeightLayout};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (rows, cols, tokens) = (num(0, 1536), num(1, 576), num(2, 512));
    let ty = args
        .get(3)
        .and_then(|t| {
            QuantType::ALL
                .iter()
                .find(|q| q.name().eq_ignore_ascii_case(t))
        })
        .copied()
        .unwrap_or(QuantType::Q4_1);
    // A fifth argument `i16`: the 16-bit-activation tiles (Q4_K, Q6_K).
    let int16 = args.get(4).is_some_and(|a| a == "i16");
    let op = if int16 {
        Operation::Int16Tiles
    } else if select(ty, Operation::Tiles(WeightLayout::RowInterleaved)).is_some() {
        Operation::Tiles(WeightLayout::RowInterleaved)
    } else {
        Operation::Tiles(WeightLayout::RowInterleavedNibbles)
    };
    let layout = op.layout();
    let kernel = select(ty, op).expect("no row-interleaved kernel for this type on this CPU");
    let mut seed = 1u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let row_bytes = WeightLayout::Blocks.row_bytes(ty, cols).unwrap();
    let mut blocks = vec![0u8; rows * row_bytes];
    for r in blocks.chunks_exact_mut(row_bytes) {
        let x: Vec<f32> = (0..cols).map(|_| next()).collect();
        if quantize_row(ty, &x, r).is_err() {
            // No quantizer for this type: random codes under small f16 scales (and mins).
            r.iter_mut()
                .for_each(|b| *b = (next() * 127.0 + 128.0) as u8);
            let block = row_bytes / (cols / ty.block_size());
            for b in r.chunks_exact_mut(block) {
                match ty {
                    QuantType::Q4_1 | QuantType::Q4_K => {
                        b[..4].copy_from_slice(&[0x1f, 0x20, 0x1f, 0x20])
                    }
                    QuantType::Q6_K => b[block - 2..].copy_from_slice(&[0x1f, 0x20]),
                    QuantType::Q4_0 | QuantType::Q5_0 | QuantType::IQ4_NL => {
                        b[..2].copy_from_slice(&[0x1f, 0x20])
                    }
                    _ => panic!("no quantizer for {ty}"),
                }
            }
        }
    }
    let mut weights = vec![0u8; rows * layout.row_bytes(ty, cols).unwrap()];
    if layout == WeightLayout::RowInterleavedNibbles {
        rill_kernels::layout::repack_rows_interleaved_nibbles(ty, cols, &blocks, &mut weights)
    } else {
        rill_kernels::layout::repack_rows_interleaved(ty, cols, &blocks, &mut weights)
    }
    .unwrap();
    let act_bytes = op.activation_row_bytes(ty, cols).unwrap();
    let mut acts = vec![0u8; tokens * act_bytes];
    for a in acts.chunks_exact_mut(act_bytes) {
        let x: Vec<f32> = (0..cols).map(|_| next()).collect();
        if int16 {
            rill_kernels::quantize_row_i16(&x, a).unwrap();
        } else {
            quantize_row(ty.vec_dot_type().unwrap(), &x, a).unwrap();
        }
    }
    let w_row = layout.row_bytes(ty, cols).unwrap();
    let block: Option<(usize, usize)> = std::env::var("BLOCK").ok().and_then(|v| {
        let (r, t) = v.split_once(',')?;
        Some((r.parse().ok()?, t.parse().ok()?))
    });
    let mut times = Vec::new();
    // `BLOCK=ROWS,TOKENS` calls the kernel on rectangles of that size, as the matmul's tasks
    // do; the whole product in one call otherwise.
    let (br, bt) = block.unwrap_or((rows, tokens));
    let mut out = vec![0f32; br.min(rows) * bt.min(tokens)];
    for _ in 0..200 {
        let t = Instant::now();
        for r0 in (0..rows).step_by(br) {
            for t0 in (0..tokens).step_by(bt) {
                let (nr, nt) = (br.min(rows - r0), bt.min(tokens - t0));
                let part = &mut out[..nr * nt];
                kernel
                    .tiles(TileProblem {
                        weights: &weights[r0 * w_row..(r0 + nr) * w_row],
                        activations: &acts[t0 * act_bytes..(t0 + nt) * act_bytes],
                        n_cols: cols,
                        n_rows: nr,
                        n_tokens: nt,
                        out: &mut *part,
                    })
                    .unwrap();
                std::hint::black_box(&part);
            }
        }
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let (best, median) = (times[0], times[times.len() / 2]);
    let ops = 2.0 * (rows * cols * tokens) as f64;
    println!(
        "{} {rows}x{cols} x {tokens} tokens, one thread: best {:.1} us ({:.1} GOPS), median {:.1} us ({:.1} GOPS)",
        kernel.name,
        best * 1e6,
        ops / best / 1e9,
        median * 1e6,
        ops / median / 1e9
    );
}
