//! Ctrl-C in the commands that generate at a terminal: while an answer is being generated it
//! stops the answer (which ends with finish `cancelled`, kept as far as it went); at `rill
//! chat`'s prompt the first press says how to leave and a second one leaves.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Presses since generation started (or since the last prompt).
static PRESSES: AtomicUsize = AtomicUsize::new(0);
static GENERATING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    let presses = PRESSES.fetch_add(1, Ordering::SeqCst) + 1;
    if GENERATING.load(Ordering::SeqCst) {
        return;
    }
    // At a prompt: only async-signal-safe calls here.
    if presses >= 2 {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(130) };
    }
    let hint = b"\n(Ctrl-C again or Ctrl-D to leave)\n> ";
    // SAFETY: write is async-signal-safe; the buffer outlives the call.
    unsafe { libc::write(2, hint.as_ptr().cast(), hint.len()) };
}

fn set_handler(handler: libc::sighandler_t) {
    // SAFETY: installing a handler for SIGINT; `on_interrupt` touches atomics and calls only
    // async-signal-safe functions.
    unsafe {
        libc::signal(libc::SIGINT, handler);
    }
}

/// Ctrl-C handled as above until this is dropped (then the default again: the process ends).
pub struct Interrupts;

impl Interrupts {
    pub fn install() -> Interrupts {
        PRESSES.store(0, Ordering::SeqCst);
        set_handler(on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t);
        Interrupts
    }

    /// Marks an answer being generated until the guard is dropped: a press stops it.
    pub fn generating(&self) -> Generating<'_> {
        PRESSES.store(0, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        Generating(std::marker::PhantomData)
    }
}

impl Drop for Interrupts {
    fn drop(&mut self) {
        set_handler(libc::SIG_DFL);
    }
}

/// An answer in progress ([`Interrupts::generating`]).
pub struct Generating<'a>(std::marker::PhantomData<&'a Interrupts>);

impl Generating<'_> {
    /// Whether Ctrl-C was pressed since the answer started; `shown`: the token just printed
    /// showed text. With `RILL_HOLD_FOR_INTERRUPT` set (the tests'), the first token that shows
    /// text waits here for the press: a test that signals once it reads the answer's first byte
    /// then always lands in the middle of an answer, however fast the model (a token that shows
    /// nothing, a piece of a character, must not wait: the test would never see a byte).
    pub fn interrupted(&self, shown: bool) -> bool {
        static HOLD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let hold = *HOLD.get_or_init(|| std::env::var_os("RILL_HOLD_FOR_INTERRUPT").is_some());
        if hold && shown {
            while PRESSES.load(Ordering::SeqCst) == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        PRESSES.load(Ordering::SeqCst) > 0
    }
}

impl Drop for Generating<'_> {
    fn drop(&mut self) {
        GENERATING.store(false, Ordering::SeqCst);
        PRESSES.store(0, Ordering::SeqCst);
    }
}
