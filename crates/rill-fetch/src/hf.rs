//! `hf:OWNER/REPO/FILE` downloads from the Hugging Face hub.
//!
//! The file lands at `models_dir()/hf/OWNER/REPO/FILE` via a partial file and an atomic rename,
//! so its existence means it is complete and later runs use it without touching the network.
//! There is no published hash to check against, so the only content check is the GGUF magic
//! (which catches HTML error pages and truncated redirects).

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::progress::{one_line, Progress};
use crate::store::{copy_hashed, io_reason, CopyError, PartialFile};
use crate::{FetchError, FetchOptions};

/// Default hub address; `HF_ENDPOINT` overrides it, as in the official Hugging Face tools (for
/// mirrors).
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Give up quickly when the hub cannot be reached at all: a first run on an offline machine
/// should fail in seconds, not minutes. There is deliberately no overall timeout, since model
/// files are large and slow links are legitimate.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn ensure(
    owner: &str,
    repo: &str,
    file: &str,
    opts: &FetchOptions,
) -> Result<PathBuf, FetchError> {
    let spec = format!("hf:{owner}/{repo}/{file}");
    let dest = file.split('/').fold(
        opts.models_dir()?.join("hf").join(owner).join(repo),
        |p, s| p.join(s),
    );
    if dest.is_file() {
        return Ok(dest);
    }
    let endpoint = match std::env::var("HF_ENDPOINT") {
        Ok(e) if !e.trim().is_empty() => e.trim().trim_end_matches('/').to_string(),
        _ => DEFAULT_ENDPOINT.to_string(),
    };
    let encoded: Vec<String> = file.split('/').map(percent_encode).collect();
    let url = format!(
        "{endpoint}/{owner}/{repo}/resolve/main/{}",
        encoded.join("/")
    );
    download(&url, &dest, Progress::new(opts.progress), file).map_err(|reason| {
        FetchError::HfDownload {
            spec: one_line(&spec),
            reason: one_line(&reason),
        }
    })?;
    Ok(dest)
}

/// Percent-encode one path segment (everything but RFC 3986 unreserved characters).
fn percent_encode(seg: &str) -> String {
    let mut out = String::with_capacity(seg.len());
    for b in seg.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn download(url: &str, dest: &Path, progress: Progress, label: &str) -> Result<(), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_resolve(Some(CONNECT_TIMEOUT))
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_recv_response(Some(RESPONSE_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let spinner = progress.spinner(format!("connecting for {label}"));
    let response = agent.get(url).call();
    spinner.finish_and_clear();
    let response = response.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    if !(200..300).contains(&status) {
        return Err(match status {
            401 | 403 => format!(
                "HTTP {status} (the repository may be gated or private; rill sends no access token)"
            ),
            404 => "HTTP 404 (no such repository or file on the main branch)".to_string(),
            s => format!("HTTP {s}"),
        });
    }
    let expected = response.body().content_length();
    let mut reader = response.into_body().into_reader();

    if let Some(dir) = dest.parent() {
        fs::create_dir_all(dir).map_err(|e| io_reason("creating", dir, &e))?;
    }
    let mut partial = PartialFile::create(dest)?;
    let partial_path = partial.path().to_path_buf();
    let bar = progress.bytes(expected, format!("downloading {label}"));
    let mut written = 0u64;
    let copied = copy_hashed(
        &mut reader,
        partial.file()?,
        None,
        &mut written,
        expected,
        &bar,
    );
    bar.finish_and_clear();
    copied.map_err(|e| match e {
        CopyError::Read(e) => format!("connection failed after {written} bytes: {e}"),
        CopyError::Write(e) => io_reason("writing", &partial_path, &e),
        CopyError::TooLarge { limit } => {
            format!("server sent more than the announced {limit} bytes")
        }
    })?;
    if let Some(len) = expected {
        if written != len {
            return Err(format!("download ended after {written} of {len} bytes"));
        }
    }
    let mut magic = [0u8; 4];
    let magic_ok = File::open(&partial_path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"GGUF";
    if !magic_ok {
        return Err(format!(
            "the downloaded data ({written} bytes) is not a GGUF file"
        ));
    }
    partial.commit(dest)?;
    progress.note(&format!("saved {}", dest.display()));
    Ok(())
}
