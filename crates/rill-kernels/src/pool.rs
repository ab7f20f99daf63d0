//! A persistent fork/join thread pool with microsecond-scale dispatch.
//!
//! A forward pass issues hundreds of small parallel operations per token, so the pool avoids all
//! per-call allocation and system calls on the fast path:
//!
//! * the job is a borrowed `&dyn Fn(usize) + Sync` published through a shared slot and an atomic
//!   epoch counter (the caller bumps the epoch; workers spinning on it see the new job at once);
//! * tasks are handed out with one `fetch_add` each, so uneven tasks balance dynamically;
//! * the calling thread works on tasks too, then waits for every worker to check out of the
//!   epoch, which guarantees no worker touches the borrowed closure after `run` returns;
//! * idle workers spin for a short while (default 200 µs) and then park on a condvar, so an idle
//!   engine does not burn CPU.
//!
//! A pool of one thread runs everything inline on the caller. A `run` issued while the pool is
//! already busy (nested use from inside a task, or a second thread) also runs inline, serially,
//! instead of deadlocking.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type TaskFn<'a> = dyn Fn(usize) + Sync + 'a;

#[derive(Clone, Copy)]
struct Job {
    f: *const TaskFn<'static>,
    n_tasks: usize,
}

struct Shared {
    /// Bumped once per job (and at shutdown); workers wait for it to change.
    epoch: AtomicUsize,
    /// The current job; written by the caller before the epoch bump, read by workers after.
    job: UnsafeCell<Job>,
    /// Next task index to hand out.
    next: AtomicUsize,
    /// Workers that have not yet finished the current epoch.
    pending: AtomicUsize,
    /// Set while a `run` is in flight (guards the single job slot).
    busy: AtomicBool,
    shutdown: AtomicBool,
    /// Set when a task panicked on a worker; the caller re-raises.
    panicked: AtomicBool,
    /// Workers currently parked (or about to park) on `cv`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
    spin: Duration,
}

// SAFETY: `job` is only written by the single caller holding `busy` while no worker reads it
// (all workers have checked out of the previous epoch), and only read by workers between the
// epoch bump and their `pending` decrement, during which the caller keeps the closure alive.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

/// Persistent worker threads plus the calling thread, for fork/join parallel loops.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads())
            .finish()
    }
}

impl ThreadPool {
    /// A pool using `n_threads` threads in total, the caller included (so `n_threads - 1`
    /// workers are spawned; 0 is treated as 1). Workers spin 200 µs before parking.
    pub fn new(n_threads: usize) -> ThreadPool {
        Self::with_spin(n_threads, Duration::from_micros(200))
    }

    /// Like [`new`](Self::new) with an explicit spin time before idle workers park.
    pub fn with_spin(n_threads: usize, spin: Duration) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: UnsafeCell::new(Job {
                f: std::ptr::null::<fn(usize)>() as *const TaskFn<'static>,
                n_tasks: 0,
            }),
            next: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            spin,
        });
        let workers = (1..n_threads)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("rill-worker-{i}"))
                    .spawn(move || worker_loop(&s))
                    .expect("failed to spawn thread pool worker")
            })
            .collect();
        ThreadPool { shared, workers }
    }

    /// Total threads that execute tasks (workers + the caller).
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every `i in 0..n_tasks`, spread over the pool, and returns when all are
    /// done. Tasks are claimed dynamically, so their order and thread are unspecified.
    ///
    /// If a task panics, the panic is re-raised here after all threads have stopped using `f`.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        if n_tasks == 0 {
            return;
        }
        let sh = &*self.shared;
        if self.workers.is_empty()
            || n_tasks == 1
            || sh
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            (0..n_tasks).for_each(f);
            return;
        }
        let f_dyn: &TaskFn<'_> = &f;
        // SAFETY: erasing the closure's lifetime is sound because we do not return (or unwind)
        // before every worker has checked out of this epoch (`pending == 0` below).
        let f_ptr: *const TaskFn<'static> =
            unsafe { std::mem::transmute::<&TaskFn<'_>, &'static TaskFn<'static>>(f_dyn) };
        // SAFETY: we hold `busy` and all workers finished the previous epoch, so nobody reads.
        unsafe { *sh.job.get() = Job { f: f_ptr, n_tasks } };
        sh.next.store(0, Ordering::Relaxed);
        sh.pending.store(self.workers.len(), Ordering::Relaxed);
        // SeqCst pairs with the workers' SeqCst `sleepers` increment: either we see a sleeper
        // and notify, or the sleeper sees the new epoch before waiting.
        sh.epoch.fetch_add(1, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.cv.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| run_tasks(sh, &f, n_tasks)));
        let mut spins = 0u32;
        while sh.pending.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        sh.busy.store(false, Ordering::Release);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if sh.panicked.swap(false, Ordering::Relaxed) {
            panic!("a thread pool task panicked");
        }
    }

    /// Splits `0..n_items` into contiguous ranges of at least `min_chunk` items (about four per
    /// thread, for load balance) and runs `f(range)` on each in parallel.
    pub fn parallel_for<F: Fn(Range<usize>) + Sync>(&self, n_items: usize, min_chunk: usize, f: F) {
        if n_items == 0 {
            return;
        }
        let target = self.n_threads() * 4;
        let chunk = n_items.div_ceil(target).max(min_chunk.max(1));
        let n_tasks = n_items.div_ceil(chunk);
        self.run(n_tasks, |t| {
            let start = t * chunk;
            f(start..(start + chunk).min(n_items));
        });
    }
}

#[inline]
fn run_tasks(sh: &Shared, f: &TaskFn<'_>, n_tasks: usize) {
    loop {
        let i = sh.next.fetch_add(1, Ordering::Relaxed);
        if i >= n_tasks {
            break;
        }
        f(i);
    }
}

fn worker_loop(sh: &Shared) {
    let mut seen = 0usize;
    loop {
        // Spin first: the next job usually arrives within microseconds during a forward pass.
        let start = Instant::now();
        let mut k = 0u32;
        let mut e = sh.epoch.load(Ordering::Acquire);
        while e == seen {
            std::hint::spin_loop();
            k = k.wrapping_add(1);
            if k & 127 == 0 && start.elapsed() > sh.spin {
                let mut g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
                sh.sleepers.fetch_add(1, Ordering::SeqCst);
                while sh.epoch.load(Ordering::SeqCst) == seen {
                    g = sh.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                sh.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(g);
            }
            e = sh.epoch.load(Ordering::Acquire);
        }
        seen = e;
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        // SAFETY: the epoch changed, so the caller published a job and keeps it alive until we
        // decrement `pending`.
        let job = unsafe { *sh.job.get() };
        let f = unsafe { &*job.f };
        if catch_unwind(AssertUnwindSafe(|| run_tasks(sh, f, job.n_tasks))).is_err() {
            sh.panicked.store(true, Ordering::Relaxed);
        }
        sh.pending.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::Release);
        sh.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.cv.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
