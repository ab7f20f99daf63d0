//! Finding llama.cpp's test inputs (extracted from the sdist of llama-cpp-python by a script in
//! `tools/`), shared by the conformance tests (included with `mod peer_data;`).

use std::path::PathBuf;

/// One kind of input and where it may be.
pub struct PeerData {
    /// What it is, for messages ("llama.cpp's chat templates").
    pub what: &'static str,
    /// The variable naming its directory.
    pub env: &'static str,
    /// The variable that skips the test when `1`.
    pub skip_env: &'static str,
    /// The script under `tools/` that fetches it and prints its directory.
    pub script: &'static str,
    /// Where to look without `env`, relative to `$HOME`.
    pub default_dirs: &'static [&'static str],
    /// How to provide it, for messages.
    pub how: &'static str,
}

/// Its directory: `env`, else the first default directory that exists, else the script's output
/// (first use: fetched by package name, as the test models are). `None` when skipped.
pub fn find(d: &PeerData) -> Option<PathBuf> {
    if std::env::var(d.skip_env).as_deref() == Ok("1") {
        println!("{}=1: skipped {}", d.skip_env, d.what);
        return None;
    }
    let how = d.how;
    if let Some(dir) = std::env::var_os(d.env) {
        let dir = PathBuf::from(dir);
        assert!(
            dir.is_dir(),
            "{}={} is not a directory; {how}",
            d.env,
            dir.display()
        );
        return Some(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let found = home.and_then(|h| {
        d.default_dirs
            .iter()
            .map(|p| h.join(p))
            .find(|p| p.is_dir())
    });
    if found.is_some() {
        return found;
    }
    let script = format!("{}/../../tools/{}", env!("CARGO_MANIFEST_DIR"), d.script);
    eprintln!("fetching {} with {script}", d.what);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}; {how}"));
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        out.status.success() && dir.is_dir(),
        "{} were not found ({} is unset, none of ~/{} exists) and {script} failed ({}); {how}",
        d.what,
        d.env,
        d.default_dirs.join(", ~/"),
        out.status
    );
    Some(dir)
}
