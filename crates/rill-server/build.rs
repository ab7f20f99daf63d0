//! Embeds the web page (`web/` and `web/js/`) in the binary: generates a table of every file
//! there, so adding a file to the page needs no change here.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("web");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut entries = Vec::new();
    for dir in ["", "js"] {
        let folder = root.join(dir);
        println!("cargo:rerun-if-changed={}", folder.display());
        let Ok(read) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in read.flatten() {
            let path = entry.path();
            if !path.is_file() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let url = if dir.is_empty() {
                format!("/{name}")
            } else {
                format!("/{dir}/{name}")
            };
            // Each file, not only its folder: a folder's time changes when a file is added or
            // removed, not when one is edited (an edited page was served stale before).
            println!("cargo:rerun-if-changed={}", path.display());
            entries.push((url, path));
        }
    }
    entries.sort();
    let mut out = String::from("/// Every file of the web page: its URL path and its bytes.\npub(crate) static ASSETS: &[(&str, &[u8])] = &[\n");
    for (url, path) in &entries {
        let _ = writeln!(
            out,
            "    ({url:?}, include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    out.push_str("];\n");
    let dest =
        Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("web_assets.rs");
    std::fs::write(dest, out).expect("OUT_DIR is writable");
}
