//! Matrix × many-tokens throughput (prompt processing) and matrix × one token (decode):
//! `cargo run -p rill-kernels --release --example prefill_bench [-- TOKENS...]`
//!
//! Prints GFLOP/s (2 · rows · cols · tokens per call) and GB/s of weights for each shape, type,
//! token count and thread count; every figure is the best of several trials, since the machine
//! may be shared. `RILL_BENCH_ONLY=TYPE` and `RILL_BENCH_THREADS=1,2` narrow the run,
//! `RILL_BENCH_SHAPE=ROWSxCOLS:TYPE` replaces the built-in shapes, `RILL_BENCH_ACT=float` uses
//! f32 activations (Gemma's ffn_down), and `RILL_BENCH_WIDE=ab` times the 512-bit kernels
//! against the 256-bit ones, alternating trial by trial in this one process.

use rill_kernels::{cpu_path, matmul_quant_with, Activations, Matrix, QuantType, ThreadPool};
use std::time::Instant;

fn main() {
    eprintln!("kernel path: {:?}", cpu_path());
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let token_counts = if args.is_empty() { vec![512, 1] } else { args };
    let cases = [
        (1536usize, 576usize, QuantType::Q4_1),
        (576, 1536, QuantType::Q4_1),
        (576, 576, QuantType::Q4_1),
        (49152, 576, QuantType::Q8_0),
        (1536, 576, QuantType::Q8_0),
        (2048, 640, QuantType::Q5_0),
        (640, 2048, QuantType::Q4_K),
        (640, 2048, QuantType::Q6_K),
    ];
    // RILL_BENCH_SHAPE=ROWSxCOLS:TYPE replaces the built-in shapes with one.
    let custom: Option<(usize, usize, QuantType)> =
        std::env::var("RILL_BENCH_SHAPE").ok().and_then(|v| {
            let (dims, ty) = v.split_once(':')?;
            let (r, c) = dims.split_once('x')?;
            let ty = QuantType::ALL
                .iter()
                .find(|t| t.name().eq_ignore_ascii_case(ty))?;
            Some((r.parse().ok()?, c.parse().ok()?, *ty))
        });
    let cases: Vec<(usize, usize, QuantType)> = match custom {
        Some(case) => vec![case],
        None => cases.to_vec(),
    };
    // RILL_BENCH_ACT=float: f32 activations (weights dequantized), as Gemma's ffn_down uses.
    let activations = match std::env::var("RILL_BENCH_ACT").as_deref() {
        Ok("float") => Activations::Float,
        _ => Activations::Int8,
    };
    let mut seed = 0x1234_5678u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    // RILL_BENCH_ONLY=Q4_1 limits the run to one weight type; RILL_BENCH_THREADS=1 to one count.
    let only = std::env::var("RILL_BENCH_ONLY").ok();
    let thread_counts: Vec<usize> = match std::env::var("RILL_BENCH_THREADS") {
        Ok(v) => v.split(',').filter_map(|t| t.parse().ok()).collect(),
        Err(_) => vec![1, 2],
    };
    for &n_tok in &token_counts {
        for &threads in &thread_counts {
            let pool = ThreadPool::new(threads);
            for &(rows, cols, ty) in &cases {
                if only
                    .as_deref()
                    .is_some_and(|o| !o.eq_ignore_ascii_case(ty.name()))
                {
                    continue;
                }
                if n_tok > 64 && rows > 10000 && threads == 1 {
                    continue; // the big output head at prompt size is slow single-threaded
                }
                let rb = ty.row_bytes(cols).unwrap();
                let mut w: Vec<u8> = (0..rb * rows).map(|_| next() as u8).collect();
                let scale_offs: &[usize] = match ty {
                    QuantType::Q6_K => &[208],
                    QuantType::Q4_K | QuantType::Q4_1 => &[0, 2],
                    _ => &[0],
                };
                for blk in w.chunks_exact_mut(ty.block_bytes()) {
                    for &o in scale_offs {
                        blk[o..o + 2]
                            .copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
                    }
                }
                let x: Vec<f32> = (0..cols * n_tok)
                    .map(|_| (next() % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                let mut out = vec![0f32; rows * n_tok];
                let mut scratch = Vec::new();
                let flops = 2.0 * (rows * cols * n_tok) as f64;
                let reps = ((2e9 / flops) as usize).clamp(1, 200);
                let mut f = || {
                    matmul_quant_with(
                        Matrix::new(ty, &w, rows, cols),
                        &x,
                        n_tok,
                        &mut out,
                        &mut scratch,
                        &pool,
                        activations,
                    )
                    .unwrap()
                };
                f();
                // RILL_BENCH_WIDE=ab times 512-bit tiles on and off, alternating trial by trial.
                let ab = std::env::var("RILL_BENCH_WIDE").is_ok_and(|v| v == "ab");
                let mut best = [f64::MAX; 2];
                for trial in 0..if ab { 10 } else { 5 } {
                    let wide = !ab || trial % 2 == 0;
                    rill_kernels::set_wide_tiles(wide);
                    let t = Instant::now();
                    for _ in 0..reps {
                        f();
                    }
                    let slot = usize::from(!wide);
                    best[slot] = best[slot].min(t.elapsed().as_secs_f64() / reps as f64);
                }
                rill_kernels::set_wide_tiles(true);
                if ab {
                    println!(
                        "{threads}T tok={n_tok:<4} {rows:>6}x{cols:<5} {:<5} wide {:9.1} us, narrow {:9.1} us: {:.2}x",
                        ty.name(),
                        best[0] * 1e6,
                        best[1] * 1e6,
                        best[1] / best[0]
                    );
                    continue;
                }
                let best = best[0];
                println!(
                    "{threads}T tok={n_tok:<4} {rows:>6}x{cols:<5} {:<5} {:9.1} us {:7.2} GFLOP/s {:6.2} GB/s",
                    ty.name(),
                    best * 1e6,
                    flops / best / 1e9,
                    (rb * rows) as f64 / best / 1e9
                );
            }
        }
    }
}
