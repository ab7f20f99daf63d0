//! The server's modules form layers: no module imports one that (directly or through others)
//! imports it back, and none but the crate root reaches into the root. Read from the sources:
//! every `crate::path` outside comments is an edge to the longest module that path names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path ("" for the crate root) -> its source with comment lines left out.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, src, out);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut name = rel.to_string_lossy().replace('/', "::");
            if name == "lib" {
                name.clear();
            } else if let Some(parent) = name.strip_suffix("::mod") {
                name = parent.to_string();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect();
            out.insert(name, code.join("\n"));
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&src, &src, &mut out);
    out
}

/// The modules each module refers to (itself left out).
fn edges(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for (name, code) in modules {
        let mut deps = BTreeSet::new();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let paths: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                group[..end]
                    .split(',')
                    .map(|p| p.trim().to_string())
                    .collect()
            } else {
                let end = rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(rest.len());
                vec![rest[..end].to_string()]
            };
            for path in paths {
                let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
                let target = (1..=parts.len())
                    .rev()
                    .map(|k| parts[..k].join("::"))
                    .find(|m| modules.contains_key(m))
                    .unwrap_or_default();
                if &target != name {
                    deps.insert(target);
                }
            }
        }
        out.insert(name.clone(), deps);
    }
    out
}

#[test]
fn server_modules_form_layers() {
    let modules = modules();
    assert!(modules.len() > 20, "read {} modules", modules.len());
    let edges = edges(&modules);
    for (name, deps) in &edges {
        assert!(
            name.is_empty() || !deps.contains(""),
            "{name} imports from the crate root: import from the module that defines it"
        );
    }
    // Depth-first search for a back edge; reports the circle it closes.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for d in edges.get(m).into_iter().flatten() {
            match state.get(d.as_str()) {
                Some(1) => {
                    let from = path.iter().position(|p| p == d).unwrap();
                    panic!("import circle: {} -> {d}", path[from..].join(" -> "));
                }
                Some(_) => {}
                None => visit(d, edges, state, path),
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
    }
    let mut state = BTreeMap::new();
    for m in edges.keys() {
        if !state.contains_key(m) {
            visit(m, &edges, &mut state, &mut Vec::new());
        }
    }
}
