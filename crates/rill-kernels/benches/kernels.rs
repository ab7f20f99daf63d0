//! Per-kernel micro-benchmarks at the shapes of the two test models. Matrix-vector products
//! (decode) report weight bytes per second, to compare with the memory bandwidth ceiling measured
//! by `memory/read`; matrix-matrix products (prefill) report FLOP/s (criterion's "elem/s" there
//! counts floating-point operations, 2 per multiply-add). `cargo bench -p rill-kernels`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rill_kernels::{
    matmul_quant, matmul_quant_with, ops, Activations, Matrix, QuantType, ThreadPool,
};

/// Deterministic pseudo-random bytes with every f16 scale field made finite and small, so the
/// kernels see realistic numbers (the values do not affect speed).
fn weights(ty: QuantType, rows: usize, cols: usize) -> Vec<u8> {
    let n = ty.row_bytes(cols).expect("whole blocks") * rows;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut bytes: Vec<u8> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    // Speed does not depend on the values, but NaN/inf scales could: clearing the top bits of
    // every odd byte keeps any f16 read from the blocks finite.
    for b in bytes.iter_mut().skip(1).step_by(2) {
        *b &= 0x3f;
    }
    bytes
}

fn activations(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// (name, weight type, rows, cols): every distinct product of SmolLM2-135M and Gemma 3 270M.
const SHAPES: &[(&str, QuantType, usize, usize)] = &[
    ("smollm2 q/o 576x576", QuantType::Q4_1, 576, 576),
    ("smollm2 k/v 192x576", QuantType::Q4_1, 192, 576),
    ("smollm2 gate/up 1536x576", QuantType::Q4_1, 1536, 576),
    ("smollm2 down 576x1536", QuantType::Q4_1, 576, 1536),
    ("smollm2 head 49152x576", QuantType::Q8_0, 49152, 576),
    ("gemma3 q 1024x640", QuantType::Q5_0, 1024, 640),
    ("gemma3 v 256x640", QuantType::Q8_0, 256, 640),
    ("gemma3 o 640x1024", QuantType::Q4_K, 640, 1024),
    ("gemma3 gate/up 2048x640", QuantType::Q5_0, 2048, 640),
    ("gemma3 down 640x2048", QuantType::Q6_K, 640, 2048),
    ("gemma3 head 262144x640", QuantType::Q8_0, 262_144, 640),
];

fn matvec(c: &mut Criterion) {
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        let mut group = c.benchmark_group(format!("matvec/{threads}t"));
        group.sample_size(20);
        for &(name, ty, rows, cols) in SHAPES {
            let w = weights(ty, rows, cols);
            let x = activations(cols);
            let mut out = vec![0f32; rows];
            let mut scratch = Vec::new();
            group.throughput(Throughput::Bytes(w.len() as u64));
            group.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter(|| {
                    matmul_quant(
                        Matrix::new(ty, &w, rows, cols),
                        &x,
                        1,
                        &mut out,
                        &mut scratch,
                        &pool,
                    )
                    .unwrap();
                    black_box(&out);
                })
            });
        }
        group.finish();
    }
}

fn matmul(c: &mut Criterion) {
    const TOKENS: usize = 128;
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        let mut group = c.benchmark_group(format!("matmul{TOKENS}/{threads}t"));
        group.sample_size(10);
        for &(name, ty, rows, cols) in SHAPES.iter().filter(|s| s.2 * s.3 <= 4 << 20) {
            let w = weights(ty, rows, cols);
            let x = activations(cols * TOKENS);
            let mut out = vec![0f32; rows * TOKENS];
            let mut scratch = Vec::new();
            group.throughput(Throughput::Elements((2 * rows * cols * TOKENS) as u64));
            // Every shape with 8-bit activations; the down projections also with the other
            // activation schemes (Gemma's uses float).
            let schemes: &[(&str, Activations)] = if name.contains("down") {
                &[
                    ("", Activations::Int8),
                    (" refined", Activations::Int8Refined),
                    (" float", Activations::Float),
                ]
            } else {
                &[("", Activations::Int8)]
            };
            for &(label, act) in schemes {
                let id = BenchmarkId::from_parameter(format!("{name}{label}"));
                group.bench_function(id, |b| {
                    b.iter(|| {
                        matmul_quant_with(
                            Matrix::new(ty, &w, rows, cols),
                            &x,
                            TOKENS,
                            &mut out,
                            &mut scratch,
                            &pool,
                            act,
                        )
                        .unwrap();
                        black_box(&out);
                    })
                });
            }
        }
        group.finish();
    }
}

/// The ceiling for decode: how fast two threads (or one) can stream bytes from memory, from an
/// ordinary allocation (4 KiB pages where Linux's transparent huge pages are in `madvise` mode)
/// and from a mapping advised to use huge pages, as rill's weights and KV cache are.
fn memory(c: &mut Criterion) {
    const BYTES: usize = 256 << 20;
    let heap: Vec<u64> = (0..BYTES as u64 / 8).collect();
    let mut map = memmap2::MmapMut::map_anon(BYTES + (2 << 20)).expect("a 258 MiB mapping");
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    let start = map.as_ptr().align_offset(2 << 20);
    let huge: &mut [u64] = as_u64s(&mut map[start..start + BYTES]);
    huge.iter_mut().zip(&heap).for_each(|(h, &v)| *h = v);
    let mut group = c.benchmark_group("memory");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(BYTES as u64));
    for (pages, buf) in [("", &heap[..]), ("_huge_pages", &huge[..])] {
        for threads in [1usize, 2] {
            read_bench(&mut group, &format!("read{pages}"), buf, threads);
        }
    }
    group.finish();
}

/// A mapping's bytes as `u64`s (it starts on a page, so aligned).
fn as_u64s(bytes: &mut [u8]) -> &mut [u64] {
    assert!(bytes.as_ptr().align_offset(8) == 0 && bytes.len().is_multiple_of(8));
    // SAFETY: aligned and sized as checked; every bit pattern is a valid u64.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / 8) }
}

/// One `memory` measurement: `threads` threads summing their share of `buf`.
fn read_bench(
    group: &mut criterion::BenchmarkGroup<criterion::measurement::WallTime>,
    name: &str,
    buf: &[u64],
    threads: usize,
) {
    let pool = ThreadPool::new(threads);
    group.bench_function(BenchmarkId::new(name, format!("{threads}t")), |b| {
        b.iter(|| {
            let sums: Vec<std::sync::atomic::AtomicU64> =
                (0..threads).map(|_| Default::default()).collect();
            let chunk = buf.len().div_ceil(threads);
            pool.run(threads, |t| {
                let part = &buf[t * chunk..((t + 1) * chunk).min(buf.len())];
                let s = part.iter().fold(0u64, |a, &v| a.wrapping_add(v));
                sums[t].store(s, std::sync::atomic::Ordering::Relaxed);
            });
            black_box(&sums);
        })
    });
}

fn attention(c: &mut Criterion) {
    use half::f16;
    let mut group = c.benchmark_group("attention");
    for head_dim in [64usize, 256] {
        let k: Vec<f16> = activations(head_dim)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let q = activations(head_dim);
        group.throughput(Throughput::Elements((2 * head_dim) as u64));
        group.bench_function(BenchmarkId::new("dot_f16_f32", head_dim), |b| {
            b.iter(|| black_box(ops::dot_f16_f32(black_box(&k), black_box(&q))))
        });
        let mut out = vec![0f32; head_dim];
        group.bench_function(BenchmarkId::new("axpy_f16", head_dim), |b| {
            b.iter(|| ops::axpy_f16(black_box(&mut out), 0.5, black_box(&k)))
        });
    }
    group.finish();
}

/// The cost of an empty fork/join of the thread pool: what every parallel product pays once.
fn fork_join(c: &mut Criterion) {
    let mut group = c.benchmark_group("pool");
    for threads in [1usize, 2] {
        let pool = ThreadPool::new(threads);
        let sink = std::sync::atomic::AtomicUsize::new(0);
        group.bench_function(BenchmarkId::new("fork_join", threads), |b| {
            b.iter(|| {
                pool.run(threads * 2, |i| {
                    sink.fetch_add(i, std::sync::atomic::Ordering::Relaxed);
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, matvec, matmul, memory, attention, fork_join);
criterion_main!(benches);
