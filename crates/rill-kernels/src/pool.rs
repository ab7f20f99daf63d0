//! A persistent fork/join thread pool with microsecond-scale dispatch.
//!
//! A forward pass issues hundreds of small parallel operations per token, so the pool avoids all
//! per-call allocation and system calls on the fast path:
//!
//! * the job is a borrowed `&dyn Fn(usize) + Sync` published through a shared slot;
//! * tasks are claimed with a compare-and-swap on one word holding `(epoch, task count, next
//!   index)`, so a claim can only succeed in the epoch it was read in, against that epoch's own
//!   task count, and uneven tasks balance dynamically;
//! * the calling thread claims tasks too and then waits until every task has **completed**, not
//!   until every worker has checked in: a worker the OS has descheduled (the machine is busy with
//!   something else) simply claims nothing, and the caller runs its share. A worker reads the job
//!   only after a successful claim, and the caller cannot return before that claimed task is
//!   done, so no worker ever touches the borrowed closure after `run` returns;
//! * idle workers spin for a short while (default 200 µs) and then park on a condvar, so an idle
//!   engine does not burn CPU.
//!
//! A pool of one thread runs everything inline on the caller. A `run` issued while the pool is
//! already busy (nested use from inside a task, or a second thread) also runs inline, serially,
//! instead of deadlocking.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type TaskFn<'a> = dyn Fn(usize) + Sync + 'a;

#[derive(Clone, Copy)]
struct Job {
    f: *const TaskFn<'static>,
}

/// Bits of the task count and of the next task index in the claim word; the epoch takes the
/// remaining 24.
const TASK_BITS: u32 = 20;
const TASK_MASK: u64 = (1 << TASK_BITS) - 1;
const EPOCH_MASK: u64 = (1 << (64 - 2 * TASK_BITS)) - 1;
/// Most tasks one `run` spreads over the pool (more run inline on the caller).
const MAX_TASKS: usize = TASK_MASK as usize;

/// The claim word: epoch, the epoch's task count, and its next task index. The count lives in
/// the same word as the index so that a claim is checked against its own epoch's count: a
/// separate count, written before the new epoch is published, could be read together with the
/// previous epoch's index, and a worker would claim a task that does not exist.
fn pack(epoch: u64, n_tasks: u64, index: u64) -> u64 {
    ((epoch & EPOCH_MASK) << (2 * TASK_BITS)) | (n_tasks << TASK_BITS) | index
}

/// `(epoch, task count, next index)`.
fn unpack(word: u64) -> (u64, u64, u64) {
    (
        word >> (2 * TASK_BITS),
        (word >> TASK_BITS) & TASK_MASK,
        word & TASK_MASK,
    )
}

struct Shared {
    /// `(epoch, task count, next task index)`; a new job bumps the epoch and resets the index.
    claim: AtomicU64,
    /// The current job; written by the caller before it publishes the epoch, read by a worker
    /// only after it claimed a task of that epoch.
    job: UnsafeCell<Job>,
    /// Tasks of the current job that have finished.
    done: AtomicUsize,
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

// SAFETY: `job` is written only by the caller holding `busy`, while every task of the previous
// job has completed (so no worker is between a claim and its `done` increment, the only window in
// which a worker reads `job`); workers read it only after a successful claim of the current epoch.
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
    /// workers are spawned; 0 is treated as 1). Workers spin 200 µs before parking. If the OS
    /// refuses to start a worker, the pool runs with the threads it got.
    pub fn new(n_threads: usize) -> ThreadPool {
        Self::with_spin(n_threads, Duration::from_micros(200))
    }

    /// Like [`new`](Self::new) with an explicit spin time before idle workers park.
    pub fn with_spin(n_threads: usize, spin: Duration) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(pack(0, 0, 0)),
            job: UnsafeCell::new(Job {
                f: std::ptr::null::<fn(usize)>() as *const TaskFn<'static>,
            }),
            done: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            spin,
        });
        let started = Arc::new(AtomicUsize::new(0));
        let workers: Vec<JoinHandle<()>> = (1..n_threads)
            .map_while(|i| {
                let s = Arc::clone(&shared);
                let started = Arc::clone(&started);
                std::thread::Builder::new()
                    .name(format!("rill-worker-{i}"))
                    .spawn(move || {
                        crate::matmul::prepare_thread();
                        started.fetch_add(1, Ordering::Release);
                        worker_loop(&s)
                    })
                    .ok()
            })
            .collect();
        crate::matmul::prepare_thread();
        // Wait until every worker runs and has its scratch: thread start-up allocates, and must
        // not happen later, in the middle of decoding.
        while started.load(Ordering::Acquire) < workers.len() {
            std::thread::yield_now();
        }
        ThreadPool { shared, workers }
    }

    /// Total threads that execute tasks (workers + the caller).
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Workers parked (or about to park) waiting for the next job, after their spin ran out.
    pub fn parked_workers(&self) -> usize {
        self.shared.sleepers.load(Ordering::SeqCst)
    }

    /// Runs `f(i)` for every `i in 0..n_tasks`, spread over the pool, and returns when all are
    /// done. Tasks are claimed dynamically, so their order and thread are unspecified.
    ///
    /// If a task panics, the panic is re-raised here after every task has finished.
    pub fn run<F: Fn(usize) + Sync>(&self, n_tasks: usize, f: F) {
        if n_tasks == 0 {
            return;
        }
        let sh = &*self.shared;
        if self.workers.is_empty()
            || n_tasks == 1
            || n_tasks > MAX_TASKS
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
        // before every task, hence every worker's use of `f`, has completed (`done == n_tasks`).
        let f_ptr: *const TaskFn<'static> =
            unsafe { std::mem::transmute::<&TaskFn<'_>, &'static TaskFn<'static>>(f_dyn) };
        // SAFETY: we hold `busy` and every task of the previous job completed, so nobody reads.
        unsafe { *sh.job.get() = Job { f: f_ptr } };
        sh.done.store(0, Ordering::Relaxed);
        let (epoch, _, _) = unpack(sh.claim.load(Ordering::Relaxed));
        let epoch = (epoch + 1) & EPOCH_MASK;
        // SeqCst pairs with the workers' SeqCst `sleepers` increment: either we see a sleeper
        // and notify, or the sleeper sees the new epoch before waiting.
        sh.claim
            .store(pack(epoch, n_tasks as u64, 0), Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.cv.notify_all();
        }
        run_tasks(sh, epoch, &f);
        let mut spins = 0u32;
        while sh.done.load(Ordering::Acquire) != n_tasks {
            spins = spins.wrapping_add(1);
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                // A worker holding a claimed task was descheduled: give it the core.
                std::thread::yield_now();
            }
        }
        sh.busy.store(false, Ordering::Release);
        if sh.panicked.swap(false, Ordering::Relaxed) {
            panic!("a thread pool task panicked");
        }
    }

    /// `f(i)` for every `i in 0..n_tasks`, spread over the pool as [`ThreadPool::run`] does, in
    /// index order.
    pub fn map<T: Send + Sync, F: Fn(usize) -> T + Sync>(&self, n_tasks: usize, f: F) -> Vec<T> {
        let slots: Vec<std::sync::OnceLock<T>> =
            (0..n_tasks).map(|_| std::sync::OnceLock::new()).collect();
        self.run(n_tasks, |i| {
            let _ = slots[i].set(f(i));
        });
        slots
            .into_iter()
            // `run` returns only once every task has run (or re-raises a task's panic).
            .map(|slot| slot.into_inner().expect("every task of `run` has run"))
            .collect()
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

    /// [`ThreadPool::parallel_for`] over `data` itself: `f(range, part)` gets each range of
    /// indices with its part of `data`, so tasks write disjoint parts with no unsafe code.
    pub fn parallel_for_mut<T: Send, F: Fn(Range<usize>, &mut [T]) + Sync>(
        &self,
        data: &mut [T],
        min_chunk: usize,
        f: F,
    ) {
        let base = Disjoint(data.as_mut_ptr());
        self.parallel_for(data.len(), min_chunk, |range| {
            // SAFETY: `parallel_for` hands each range of `0..data.len()` to one call only, and
            // `data` stays mutably borrowed until every call has returned.
            let part = unsafe { base.slice(range.start, range.len()) };
            f(range, part)
        });
    }

    /// `f(i, chunk)` for every `chunk_len`-element chunk `i` of `data` (the last may be
    /// shorter), one task each, spread over the pool as [`ThreadPool::run`] does.
    pub fn run_chunks_mut<T: Send, F: Fn(usize, &mut [T]) + Sync>(
        &self,
        data: &mut [T],
        chunk_len: usize,
        f: F,
    ) {
        let (n, chunk_len) = (data.len(), chunk_len.max(1));
        let base = Disjoint(data.as_mut_ptr());
        self.run(n.div_ceil(chunk_len), |i| {
            let start = i * chunk_len;
            // SAFETY: task `i` alone gets `start..start + len`, which lies within `data`, and
            // `data` stays mutably borrowed until every task has returned.
            let part = unsafe { base.slice(start, chunk_len.min(n - start)) };
            f(i, part)
        });
    }

    /// Row `t` of each of `N` buffers together, for every row `t < n_rows`: `f(t, rows)`, where
    /// buffer `b`'s rows are `widths[b]` elements long. Rows go out in ranges of at least
    /// `min_rows` ([`ThreadPool::parallel_for`]); with `n_rows <= min_rows` they run on this
    /// thread. Panics when a buffer is shorter than its `n_rows` rows.
    pub fn for_rows_mut<T: Send, const N: usize, F: Fn(usize, [&mut [T]; N]) + Sync>(
        &self,
        n_rows: usize,
        min_rows: usize,
        bufs: [&mut [T]; N],
        widths: [usize; N],
        f: F,
    ) {
        for (buf, &w) in bufs.iter().zip(&widths) {
            assert!(
                buf.len() >= n_rows * w,
                "a buffer of {} elements for {n_rows} rows of {w}",
                buf.len()
            );
        }
        let bases = bufs.map(|b| Disjoint(b.as_mut_ptr()));
        self.parallel_for(n_rows, min_rows, |rows| {
            for t in rows {
                // SAFETY: `parallel_for` hands each row index to one call only; row `t` of
                // buffer `b` is `t * w..(t + 1) * w`, disjoint from every other row and within
                // the buffer (checked above); the buffers stay mutably borrowed (and distinct:
                // they were `&mut` at once) until every call has returned.
                let parts =
                    std::array::from_fn(|b| unsafe { bases[b].slice(t * widths[b], widths[b]) });
                f(t, parts);
            }
        });
    }
}

/// A buffer's base pointer shared by the tasks that each write a disjoint part of it (the
/// `*_mut` methods above: the one place the pool's callers' disjointness is vouched for).
struct Disjoint<T>(*mut T);

// SAFETY: the tasks holding it touch disjoint elements only (see each use), and the elements
// may be sent to another thread.
unsafe impl<T: Send> Sync for Disjoint<T> {}

impl<T> Disjoint<T> {
    /// # Safety
    /// `start..start + len` lies within the buffer, and no other live slice overlaps it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}

/// Claims and runs tasks of `epoch` until none is left.
#[inline]
fn run_tasks(sh: &Shared, epoch: u64, f: &TaskFn<'_>) {
    while let Some(i) = claim(sh, epoch) {
        run_one(sh, f, i);
    }
}

/// Runs one claimed task and counts it as done. A panic is recorded (the caller re-raises it
/// once every task has finished) rather than stopping this thread's claims, so the remaining
/// tasks still run and the caller's wait for completion ends.
#[inline]
fn run_one(sh: &Shared, f: &TaskFn<'_>, i: usize) {
    if catch_unwind(AssertUnwindSafe(|| f(i))).is_err() {
        sh.panicked.store(true, Ordering::Relaxed);
    }
    sh.done.fetch_add(1, Ordering::Release);
}

/// Claims the next task of `epoch`, if that epoch is current and has tasks left.
#[inline]
fn claim(sh: &Shared, epoch: u64) -> Option<usize> {
    let mut word = sh.claim.load(Ordering::Acquire);
    loop {
        let (e, n, i) = unpack(word);
        if e != epoch || i >= n {
            return None;
        }
        match sh.claim.compare_exchange_weak(
            word,
            pack(e, n, i + 1),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(i as usize),
            Err(w) => word = w,
        }
    }
}

fn worker_loop(sh: &Shared) {
    // The epoch the pool was created with: a worker that starts late sees any later job (or the
    // shutdown) as new, instead of waiting for a change that already happened.
    let mut seen = 0;
    loop {
        // Spin first: the next job usually arrives within microseconds during a forward pass.
        let start = Instant::now();
        let mut k = 0u32;
        let mut e = unpack(sh.claim.load(Ordering::Acquire)).0;
        while e == seen {
            std::hint::spin_loop();
            k = k.wrapping_add(1);
            if k & 127 == 0 && start.elapsed() > sh.spin {
                let mut g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
                sh.sleepers.fetch_add(1, Ordering::SeqCst);
                while unpack(sh.claim.load(Ordering::SeqCst)).0 == seen {
                    g = sh.cv.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                sh.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(g);
            }
            e = unpack(sh.claim.load(Ordering::Acquire)).0;
        }
        seen = e;
        if sh.shutdown.load(Ordering::Acquire) {
            return;
        }
        // Claim first; only a successful claim makes reading the job slot safe.
        let Some(first) = claim(sh, e) else {
            continue;
        };
        // SAFETY: we hold a claimed, unfinished task of epoch `e`, so the caller of that job is
        // still inside `run` and keeps the job and its closure alive.
        let job = unsafe { *sh.job.get() };
        let f = unsafe { &*job.f };
        run_one(sh, f, first);
        run_tasks(sh, e, f);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.shutdown.store(true, Ordering::Release);
        let (epoch, _, _) = unpack(sh.claim.load(Ordering::Relaxed));
        sh.claim
            .store(pack((epoch + 1) & EPOCH_MASK, 0, 0), Ordering::SeqCst);
        {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.cv.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}
