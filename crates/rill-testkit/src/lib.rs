//! What rill's tests need from outside the repository, found or provided on first use, or a
//! loud failure: no test passes without running.
//!
//! - [`python`]: an interpreter with the official clients and validators the tests drive
//!   (`openai`, `jsonschema`, `sglang-router`): `RILL_TEST_PYTHON` if set, else a virtual
//!   environment under `~/.cache/rill/test-venv`, made and filled from PyPI on first use.
//! - [`peer_data`]: llama.cpp's test vectors and chat templates, extracted from the sdist of
//!   llama-cpp-python (PyPI) by the scripts in `tools/`.
//! - [`command`]: a system program (HAProxy, Chromium, Node.js); these come from the system's
//!   packages, which a test cannot install for itself, so a missing one fails the test with
//!   the line that installs it (`tools/test.sh` installs them all).
//! - [`browser_tools`]: Chromium with playwright-core (npm, pinned by the browser test's lock
//!   file, installed on first use).
//!
//! Every failure is one line: what is missing, and how to get it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What the test virtual environment is made with (the same set `.ci/run` has always
/// installed, and the Anthropic and Ollama clients): the OpenAI client, JSON Schema validation
/// with its formats, the sglang router.
pub const TEST_PYTHON_PACKAGES: &[&str] = &[
    "openai",
    "anthropic",
    "ollama",
    "jsonschema[format-nongpl]",
    "sglang-router==0.3.2",
];

/// A Python interpreter that imports every one of `modules`: `RILL_TEST_PYTHON` (which must
/// have them), else `~/.cache/rill/test-venv` (`RILL_TEST_VENV` overrides the place), made with
/// `python3 -m venv` and filled with [`TEST_PYTHON_PACKAGES`] from PyPI the first time a test
/// needs it. Panics with one line when neither can be had.
pub fn python(modules: &[&str]) -> PathBuf {
    // One test at a time makes the environment; the others wait for it.
    static MAKING: Mutex<()> = Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let imports = format!("import {}", modules.join(", "));
    let has_modules = |python: &Path| {
        Command::new(python)
            .args(["-c", &imports])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if let Some(p) = std::env::var_os("RILL_TEST_PYTHON").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            has_modules(&p),
            "RILL_TEST_PYTHON={} cannot `{imports}`: install {} into it, or unset it to let the \
             tests make ~/.cache/rill/test-venv",
            p.display(),
            TEST_PYTHON_PACKAGES.join(" ")
        );
        return p;
    }
    let venv = std::env::var_os("RILL_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/rill/test-venv"));
    let python = venv.join("bin/python");
    if has_modules(&python) {
        return python;
    }
    if !python.exists() {
        run(
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
            "make a Python virtual environment (install python3 with its venv module)",
        );
    }
    eprintln!(
        "installing {} into {} (first use)",
        TEST_PYTHON_PACKAGES.join(" "),
        venv.display()
    );
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(TEST_PYTHON_PACKAGES),
        &format!(
            "pip-install {} from PyPI into {}",
            TEST_PYTHON_PACKAGES.join(" "),
            venv.display()
        ),
    );
    assert!(
        has_modules(&python),
        "{} still cannot `{imports}` after installing {}",
        python.display(),
        TEST_PYTHON_PACKAGES.join(" ")
    );
    python
}

fn home() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .expect("HOME is not set: the tests keep what they fetch under ~/.cache")
}

/// Runs `command` to its end, inheriting the output; panics with `what` when it fails.
fn run(command: &mut Command, what: &str) {
    match command.status() {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("could not {what} ({s})"),
        Err(e) => panic!("could not {what}: {e}"),
    }
}

/// `program` on `PATH` (it must answer `version_arg`), or a panic naming the Debian package
/// that provides it (`tools/test.sh` installs them all).
pub fn command(program: &str, version_arg: &str, debian_package: &str) -> PathBuf {
    let ok = Command::new(program)
        .arg(version_arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "`{program}` is not on PATH: install it (Debian: `sudo apt-get install {debian_package}`; \
         tools/test.sh installs every system package the tests use)"
    );
    PathBuf::from(program)
}

/// One kind of llama.cpp test data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerData {
    /// `models/ggml-vocab-*.gguf` with their `.inp`/`.out` tokenizer test vectors.
    TokenizerVectors,
    /// `models/templates/*.jinja`: real models' chat templates.
    ChatTemplates,
}

impl PeerData {
    fn what(self) -> &'static str {
        match self {
            PeerData::TokenizerVectors => "llama.cpp's tokenizer test vectors",
            PeerData::ChatTemplates => "llama.cpp's chat templates",
        }
    }

    fn env(self) -> &'static str {
        match self {
            PeerData::TokenizerVectors => "RILL_LLAMA_VOCABS",
            PeerData::ChatTemplates => "RILL_LLAMA_TEMPLATES",
        }
    }

    fn script(self) -> &'static str {
        match self {
            PeerData::TokenizerVectors => "llama-vocabs.sh",
            PeerData::ChatTemplates => "llama-templates.sh",
        }
    }

    /// Where the script leaves it, relative to `$HOME`, then an unpacked sdist.
    fn default_dirs(self) -> &'static [&'static str] {
        match self {
            PeerData::TokenizerVectors => &[
                ".cache/rill-peers/llama-vocabs-0.3.36",
                ".cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp/models",
            ],
            PeerData::ChatTemplates => &[
                ".cache/rill-peers/llama-templates-0.3.36",
                ".cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp/models/templates",
            ],
        }
    }
}

/// The directory of `kind`: its variable (`RILL_LLAMA_VOCABS`, `RILL_LLAMA_TEMPLATES`), else
/// where its script leaves it, else the script's output (first use: the sdist of
/// llama-cpp-python==0.3.36 downloaded from PyPI by package name, as the test models are).
/// Panics with one line when it cannot be had.
pub fn peer_data(kind: PeerData) -> PathBuf {
    static FETCHING: Mutex<()> = Mutex::new(());
    let _fetching = FETCHING.lock().unwrap_or_else(|p| p.into_inner());
    let (what, env) = (kind.what(), kind.env());
    let script = repo_root().join("tools").join(kind.script());
    if let Some(dir) = std::env::var_os(env) {
        let dir = PathBuf::from(dir);
        assert!(
            dir.is_dir(),
            "{env}={} is not a directory (unset it to fetch {what} with {})",
            dir.display(),
            script.display()
        );
        return dir;
    }
    let home = home();
    if let Some(dir) = kind
        .default_dirs()
        .iter()
        .map(|p| home.join(p))
        .find(|p| p.is_dir())
    {
        return dir;
    }
    eprintln!("fetching {what} with {}", script.display());
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} for {what}: {e}", script.display()));
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        out.status.success() && dir.is_dir(),
        "{what} could not be fetched: {} failed ({}); it needs pip and PyPI, or set {env} to a \
         directory holding them",
        script.display(),
        out.status
    );
    dir
}

/// What the browser test runs: its script (`viewer.mjs`, with playwright-core installed next to
/// it by `npm ci` on first use) and Chromium. Panics with one line when Node.js, npm or
/// Chromium is missing.
pub fn browser_tools() -> (PathBuf, PathBuf) {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    command("node", "--version", "nodejs");
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        chromium.exists(),
        "Chromium is not at {} (Debian: `sudo apt-get install chromium`, or set CHROMIUM to \
         its path; tools/test.sh installs it)",
        chromium.display()
    );
    let dir = repo_root().join("crates/rill-server/tests/browser");
    INSTALLED.get_or_init(|| {
        if !dir.join("node_modules/playwright-core").exists() {
            command("npm", "--version", "npm");
            run(
                Command::new("npm").args([
                    "ci",
                    "--prefix",
                    &dir.to_string_lossy(),
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                ]),
                "install playwright-core from npm (`npm ci --prefix crates/rill-server/tests/browser`)",
            );
        }
    });
    (dir.join("viewer.mjs"), chromium)
}
