//! The per-token loop allocates nothing: after a warm-up, decoding steps (forward pass, KV cache
//! growth across block boundaries, attention, output head) make no heap allocation on any thread.
//!
//! A custom harness (`harness = false`): libtest's own threads allocate while they wait for
//! results, which a process-wide counting allocator would see.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rill_model::synthetic::SyntheticSpec;
use rill_model::{Batch, Model, Precision};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn decode_allocations(spec: SyntheticSpec, precision: Precision, threads: usize) -> usize {
    let bytes = spec.build().unwrap().to_bytes().unwrap();
    let mut model =
        Model::from_file(rill_gguf::GgufFile::from_bytes(bytes).unwrap(), threads).unwrap();
    let mut kv = model.new_kv_cache(128, precision).unwrap();
    kv.add_sequence(0).unwrap();
    let prompt: Vec<u32> = "the per-token loop".bytes().map(u32::from).collect();
    let mut logits = Vec::new();
    model
        .forward(
            &Batch::prompt(0, &prompt, 0, false),
            &mut kv,
            precision,
            &mut logits,
        )
        .unwrap();
    let mut batch = Batch::new();
    let mut step =
        |model: &mut Model, kv: &mut rill_model::KvCache, logits: &mut Vec<f32>, pos: usize| {
            let token = (logits
                .iter()
                .enumerate()
                .fold((0, f32::MIN), |b, (i, &l)| if l > b.1 { (i, l) } else { b })
                .0) as u32;
            batch.rows.clear();
            batch.push(0, token, pos, true);
            model.forward(&batch, kv, precision, logits).unwrap();
        };
    let mut pos = prompt.len();
    // Warm-up: buffers reach their steady size (and every worker thread its scratch).
    for _ in 0..4 {
        step(&mut model, &mut kv, &mut logits, pos);
        pos += 1;
    }
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    // 40 steps cross at least two KV block boundaries.
    for _ in 0..40 {
        step(&mut model, &mut kv, &mut logits, pos);
        pos += 1;
    }
    COUNTING.store(false, Ordering::SeqCst);
    ALLOCATIONS.load(Ordering::SeqCst)
}

fn main() {
    let mut checked = 0;
    for (spec, name) in [
        (SyntheticSpec::llama_tiny(), "llama"),
        (SyntheticSpec::gemma3_tiny(), "gemma3"),
    ] {
        for precision in [Precision::Fast, Precision::Exact] {
            for threads in [1, 2] {
                let n = decode_allocations(spec.clone(), precision, threads);
                assert_eq!(
                    n, 0,
                    "{name} {precision:?} {threads} threads: {n} allocations in 40 decode steps"
                );
                println!(
                    "{name} {precision:?} {threads} thread(s): no allocation in 40 decode steps"
                );
                checked += 1;
            }
        }
    }
    println!("{checked} passed, 0 failed");
}
