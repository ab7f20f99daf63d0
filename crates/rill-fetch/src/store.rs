//! Atomic cache writes: partial files, hashing copies, sidecars.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

use crate::progress::one_line;

/// Distinguishes partial files of threads within one process (the pid covers processes).
static PARTIAL_COUNTER: AtomicU64 = AtomicU64::new(0);

/// `io::Error` plus what we were doing, as one line.
pub(crate) fn io_reason(what: &str, path: &Path, e: &io::Error) -> String {
    one_line(&format!("{what} {}: {e}", path.display()))
}

/// A temporary file next to its final path, deleted on drop unless [`PartialFile::commit`]ted.
///
/// Named `.NAME.partial-<pid>-<n>`: hidden, in the same directory (so `rename` is atomic and
/// never crosses filesystems), and unique per process and per call so concurrent fetches never
/// share one.
pub(crate) struct PartialFile {
    path: PathBuf,
    file: Option<File>,
}

impl PartialFile {
    pub(crate) fn create(final_path: &Path) -> Result<Self, String> {
        let dir = final_path.parent().unwrap_or_else(|| Path::new("."));
        let name = final_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".to_string());
        let n = PARTIAL_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".{name}.partial-{}-{n}", std::process::id()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_reason("creating", &path, &e))?;
        Ok(PartialFile {
            path,
            file: Some(file),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The open file. Only `None` after `commit`, which consumes `self`, so never `None` here;
    /// still reported as an error rather than a panic.
    pub(crate) fn file(&mut self) -> Result<&mut File, String> {
        self.file
            .as_mut()
            .ok_or_else(|| format!("internal: {} already closed", self.path.display()))
    }

    /// fsync, close, rename into `final_path`, then fsync the directory so the rename itself is
    /// durable. Only call after verification.
    pub(crate) fn commit(mut self, final_path: &Path) -> Result<(), String> {
        if let Some(file) = self.file.take() {
            file.sync_all()
                .map_err(|e| io_reason("syncing", &self.path, &e))?;
        }
        fs::rename(&self.path, final_path).map_err(|e| {
            one_line(&format!(
                "renaming {} to {}: {e}",
                self.path.display(),
                final_path.display()
            ))
        })?;
        // Renamed: nothing left for Drop to delete.
        self.path = PathBuf::new();
        if let Some(dir) = final_path.parent() {
            sync_dir(dir);
        }
        Ok(())
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        self.file.take();
        if !self.path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Best effort: make a rename in `dir` durable. Not possible (nor needed) on Windows.
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// Why a streaming copy stopped.
pub(crate) enum CopyError {
    Read(io::Error),
    Write(io::Error),
    /// More bytes than the expected total: stop early instead of filling the disk.
    TooLarge {
        limit: u64,
    },
}

/// Copy `reader` to `out`, updating `hasher` (if any), `written` and the bar, refusing to go past
/// `limit` total bytes.
pub(crate) fn copy_hashed(
    reader: &mut dyn Read,
    out: &mut dyn Write,
    mut hasher: Option<&mut Sha256>,
    written: &mut u64,
    limit: Option<u64>,
    bar: &ProgressBar,
) -> Result<(), CopyError> {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        if let Some(limit) = limit {
            if written.saturating_add(n as u64) > limit {
                return Err(CopyError::TooLarge { limit });
            }
        }
        out.write_all(&buf[..n]).map_err(CopyError::Write)?;
        if let Some(h) = hasher.as_deref_mut() {
            h.update(&buf[..n]);
        }
        *written += n as u64;
        bar.inc(n as u64);
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a whole file, with a bar.
pub(crate) fn hash_file(path: &Path, bar: &ProgressBar) -> Result<String, String> {
    let mut f = File::open(path).map_err(|e| io_reason("opening", path, &e))?;
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    copy_hashed(
        &mut f,
        &mut io::sink(),
        Some(&mut hasher),
        &mut written,
        None,
        bar,
    )
    .map_err(|e| match e {
        CopyError::Read(e) | CopyError::Write(e) => io_reason("reading", path, &e),
        CopyError::TooLarge { .. } => "internal: unbounded hash hit a limit".to_string(),
    })?;
    Ok(hex(&hasher.finalize()))
}

/// `FILE.sha256` next to `FILE`.
pub(crate) fn sidecar_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".sha256");
    PathBuf::from(s)
}

/// Whether the sidecar next to `path` records `sha256`.
pub(crate) fn sidecar_matches(path: &Path, sha256: &str) -> bool {
    fs::read_to_string(sidecar_path(path))
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .map(|h| h.eq_ignore_ascii_case(sha256))
        })
        .unwrap_or(false)
}

/// Record that `path` was verified to hash to `sha256` (`sha256sum` format), atomically. Best
/// effort: without it the next start just hashes the file again.
pub(crate) fn write_sidecar(path: &Path, sha256: &str) {
    let side = sidecar_path(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Ok(mut partial) = PartialFile::create(&side) else {
        return;
    };
    let ok = match partial.file() {
        Ok(f) => f
            .write_all(format!("{sha256}  {name}\n").as_bytes())
            .is_ok(),
        Err(_) => false,
    };
    if ok {
        let _ = partial.commit(&side);
    }
}
