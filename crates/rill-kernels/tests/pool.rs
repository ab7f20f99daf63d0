//! Thread pool: every task runs exactly once, nesting and panics are handled, and the safe calls
//! that hand tasks disjoint parts of buffers give every element to exactly one task. (The cost
//! of a fork/join is a bench: `cargo bench -p rill-kernels --bench kernels -- pool`.)

use rill_kernels::ThreadPool;
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn every_task_runs_exactly_once() {
    for threads in [1, 2, 3, 5] {
        let pool = ThreadPool::new(threads);
        assert_eq!(pool.n_threads(), threads);
        for n in [0usize, 1, 2, 3, 7, 64, 1000] {
            for _ in 0..50 {
                let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(n, |i| {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
            }
        }
    }
}

/// `parallel_for_mut`, `run_chunks_mut` and `for_rows_mut` give each element to exactly one
/// call, with the index it belongs to, for any thread count and size (the last chunk short).
#[test]
fn disjoint_parts_reach_every_element_once() {
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for n in [0usize, 1, 5, 16, 17, 100, 1031] {
            let mut data = vec![0usize; n];
            pool.parallel_for_mut(&mut data, 7, |range, part| {
                assert_eq!(range.len(), part.len());
                for (i, x) in range.zip(part) {
                    *x += i + 1;
                }
            });
            assert!(data.iter().enumerate().all(|(i, &x)| x == i + 1));
            let mut data = vec![0usize; n];
            pool.run_chunks_mut(&mut data, 10, |chunk, part| {
                assert!(part.len() <= 10 && !part.is_empty());
                for (j, x) in part.iter_mut().enumerate() {
                    *x += chunk * 10 + j + 1;
                }
            });
            assert!(data.iter().enumerate().all(|(i, &x)| x == i + 1));
            let (mut a, mut b) = (vec![0usize; n * 3], vec![0usize; n * 2 + 5]);
            pool.for_rows_mut(n, 4, [&mut a[..], &mut b[..]], [3, 2], |t, [ra, rb]| {
                assert_eq!((ra.len(), rb.len()), (3, 2));
                ra.iter_mut().chain(rb.iter_mut()).for_each(|x| *x += t + 1);
            });
            assert!(a
                .chunks(3)
                .enumerate()
                .all(|(t, r)| r.iter().all(|&x| x == t + 1)));
            assert!(b[..n * 2]
                .chunks(2)
                .enumerate()
                .all(|(t, r)| r.iter().all(|&x| x == t + 1)));
            assert!(
                b[n * 2..].iter().all(|&x| x == 0),
                "past the rows: untouched"
            );
        }
    }
}

#[test]
#[should_panic(expected = "for 4 rows of 3")]
fn rows_past_a_buffer_are_refused() {
    let pool = ThreadPool::new(2);
    let mut short = [0f32; 11];
    pool.for_rows_mut(4, 1, [&mut short[..]], [3], |_, _| {});
}

#[test]
fn parallel_for_covers_range() {
    let pool = ThreadPool::new(3);
    for n in [0usize, 1, 5, 17, 1000, 1001] {
        for min_chunk in [1usize, 4, 100] {
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.parallel_for(n, min_chunk, |r| {
                assert!(r.start < r.end && r.end <= n);
                for i in r {
                    counts[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
        }
    }
}

#[test]
fn nested_run_executes_inline() {
    let pool = ThreadPool::new(2);
    let total = AtomicUsize::new(0);
    pool.run(4, |_| {
        pool.run(3, |_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
    });
    assert_eq!(total.load(Ordering::Relaxed), 12);
}

#[test]
fn panics_propagate_and_pool_survives() {
    let pool = ThreadPool::new(3);
    for _ in 0..5 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(16, |i| {
                if i == 7 {
                    panic!("task 7 fails");
                }
            });
        }));
        assert!(r.is_err());
    }
    let total = AtomicUsize::new(0);
    pool.run(100, |i| {
        total.fetch_add(i, Ordering::Relaxed);
    });
    assert_eq!(total.load(Ordering::Relaxed), 4950);
}

#[test]
fn wakes_after_parking() {
    let pool = ThreadPool::with_spin(3, std::time::Duration::from_micros(10));
    for _ in 0..20 {
        // Every worker has given up spinning and parked: the job must wake them.
        while pool.parked_workers() < pool.n_threads() - 1 {
            std::thread::yield_now();
        }
        let total = AtomicUsize::new(0);
        pool.run(8, |_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 8);
    }
}

/// Back-to-back jobs whose task counts alternate between small and large: a worker finishing
/// the previous job must never claim a task of it against the next job's count (it once could,
/// running a task that did not exist and leaving the caller waiting for ever). Each job checks
/// that every one of its tasks ran exactly once; the whole run must finish in time.
#[test]
fn alternating_job_sizes_never_claim_a_stale_task() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let pool = ThreadPool::with_spin(3, std::time::Duration::from_millis(5));
        let counts: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
        for job in 0..200_000usize {
            let n = if job % 2 == 0 { 2 } else { 64 };
            pool.run(n, |i| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            });
            for (i, c) in counts.iter().enumerate().take(n) {
                assert_eq!(
                    c.swap(0, Ordering::Relaxed),
                    1,
                    "job {job}: task {i} of {n}"
                );
            }
            assert!(
                counts.iter().all(|c| c.load(Ordering::Relaxed) == 0),
                "job {job}"
            );
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(300))
        .expect("the pool hung (or a job's check failed)");
}

#[test]
fn map_gives_every_result_in_index_order() {
    for threads in [1, 2, 3] {
        let pool = ThreadPool::new(threads);
        for n in [0usize, 1, 5, 64] {
            let got = pool.map(n, |i| i * i);
            assert_eq!(
                got,
                (0..n).map(|i| i * i).collect::<Vec<_>>(),
                "{threads} threads"
            );
        }
    }
}
