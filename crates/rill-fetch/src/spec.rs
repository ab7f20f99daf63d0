//! Parsing a `--model` argument into a [`ModelSpec`].

use std::path::{Path, PathBuf};

use crate::builtin::{find_builtin, known_names};
use crate::progress::one_line;
use crate::{FetchError, ModelSpec};

/// Parse a `--model` argument.
///
/// Precedence, and why:
/// 1. `hf:...` is always a Hugging Face spec: the prefix is an explicit scheme (write `./hf:x` to
///    mean a local file of that name).
/// 2. An existing **file** wins over a built-in name: if the user has a file called `gemma3` in
///    the current directory, naming it is the most specific thing they can mean.
/// 3. A built-in name or alias (case-insensitive).
/// 4. Anything path-like (contains a path separator, starts with `.` or `~`, or ends in `.gguf`)
///    that does not exist is reported as a missing file, naming it.
/// 5. Otherwise: unknown model, listing the built-in names.
///
/// Existence is checked here (not only in [`crate::resolve`]) because telling "missing file"
/// apart from "unknown name" depends on it.
pub fn parse_spec(s: &str) -> Result<ModelSpec, FetchError> {
    if let Some(rest) = s.strip_prefix("hf:") {
        return parse_hf(s, rest);
    }
    if s.is_empty() {
        return Err(unknown(s));
    }
    let path = Path::new(s);
    let meta = std::fs::metadata(path).ok();
    if meta.as_ref().is_some_and(|m| m.is_file()) {
        return Ok(ModelSpec::Path(PathBuf::from(s)));
    }
    if let Some(model) = find_builtin(s) {
        return Ok(ModelSpec::Builtin(model));
    }
    if meta.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(FetchError::IsDirectory { path: one_line(s) });
    }
    if looks_like_path(s) {
        return Err(FetchError::NotFound { path: one_line(s) });
    }
    Err(unknown(s))
}

fn unknown(s: &str) -> FetchError {
    FetchError::UnknownModel {
        name: one_line(s),
        known: known_names(),
    }
}

fn looks_like_path(s: &str) -> bool {
    s.contains('/')
        || s.contains('\\')
        || s.starts_with('.')
        || s.starts_with('~')
        || s.to_ascii_lowercase().ends_with(".gguf")
}

/// `hf:OWNER/REPO/FILE.gguf`, where FILE may contain `/`.
///
/// The parts become both a URL path and a cache path under `models_dir()/hf`, so `.`/`..`
/// segments, empty segments and characters that are unsafe in either are rejected up front.
fn parse_hf(spec: &str, rest: &str) -> Result<ModelSpec, FetchError> {
    let bad = |reason: String| FetchError::BadHfSpec {
        spec: one_line(spec),
        reason,
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if rest.is_empty() {
        return Err(bad("nothing after 'hf:'".into()));
    }
    if parts.len() < 3 {
        return Err(bad(format!(
            "expected OWNER/REPO/FILE, got {} path segment{}",
            parts.len(),
            if parts.len() == 1 { "" } else { "s" }
        )));
    }
    let (owner, repo, file_parts) = (parts[0], parts[1], &parts[2..]);
    check_repo_part("owner", owner).map_err(bad)?;
    check_repo_part("repository name", repo).map_err(bad)?;
    for seg in file_parts {
        check_file_segment(seg).map_err(bad)?;
    }
    let file = file_parts.join("/");
    if !file.to_ascii_lowercase().ends_with(".gguf") || file_parts.last() == Some(&".gguf") {
        return Err(bad(format!(
            "'{}' is not a .gguf file name",
            one_line(&file)
        )));
    }
    Ok(ModelSpec::HuggingFace {
        owner: owner.to_string(),
        repo: repo.to_string(),
        file,
    })
}

/// Hub owner and repository names: letters, digits, `-`, `_`, `.`; not `.`/`..`.
fn check_repo_part(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("empty {what}"));
    }
    if s == "." || s == ".." {
        return Err(format!("'{s}' is not a valid {what}"));
    }
    if s.len() > 96 {
        return Err(format!("{what} is longer than 96 characters"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "invalid character {c:?} in {what} '{}'",
            one_line(s)
        ));
    }
    Ok(())
}

/// One `/`-separated segment of the file path inside the repo.
fn check_file_segment(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("empty path segment in the file name".into());
    }
    if s == "." || s == ".." {
        return Err(format!("'{s}' is not allowed in the file path"));
    }
    if let Some(c) = s.chars().find(|c| {
        c.is_control()
            || matches!(
                c,
                '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|' | '#' | '%'
            )
    }) {
        return Err(format!("invalid character {c:?} in the file path"));
    }
    Ok(())
}
