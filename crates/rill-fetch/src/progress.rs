//! Progress display and message helpers.
//!
//! Bars go to stderr (stdout belongs to the generated text). indicatif draws nothing when stderr
//! is not a terminal, so in that case, if progress was asked for, a few plain status lines are
//! printed instead, so that logs still show what a slow first run was doing.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Collapse any text (pip output, OS error strings, user input) to one trimmed line, so every
/// error's `Display` stays a single line; long text is shortened to keep messages readable.
pub(crate) fn one_line(s: &str) -> String {
    const MAX: usize = 400;
    let joined = s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" / ");
    let cleaned: String = joined
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if cleaned.chars().count() > MAX {
        let mut out: String = cleaned.chars().take(MAX).collect();
        out.push('…');
        out
    } else {
        cleaned
    }
}

/// The progress policy for one fetch.
#[derive(Clone, Copy)]
pub(crate) struct Progress {
    enabled: bool,
    tty: bool,
}

impl Progress {
    pub(crate) fn new(enabled: bool) -> Self {
        Progress {
            enabled,
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn target(&self) -> ProgressDrawTarget {
        if self.enabled && self.tty {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        }
    }

    /// A plain status line, only when progress is on but no bars can be drawn.
    pub(crate) fn note(&self, msg: &str) {
        if self.enabled && !self.tty {
            eprintln!("rill: {msg}");
        }
    }

    /// A ticking spinner for work of unknown length (pip runs).
    pub(crate) fn spinner(&self, msg: String) -> ProgressBar {
        self.note(&msg);
        let pb = ProgressBar::with_draw_target(None, self.target());
        pb.set_style(
            ProgressStyle::with_template("{spinner:.cyan} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_message(msg);
        pb.enable_steady_tick(Duration::from_millis(100));
        pb
    }

    /// A byte-count bar; `len == None` gives a byte-counting spinner.
    pub(crate) fn bytes(&self, len: Option<u64>, msg: String) -> ProgressBar {
        self.note(&msg);
        let pb = ProgressBar::with_draw_target(len, self.target());
        let template = if len.is_some() {
            "{msg} [{bar:30.cyan/blue}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})"
        } else {
            "{spinner:.cyan} {msg} {bytes} ({bytes_per_sec})"
        };
        pb.set_style(
            ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        pb.set_message(msg);
        pb
    }
}
