//! The web page's files over loopback HTTP: embedded, whole and self-contained, and safe to
//! serve from a folder (`--web-dir`).

mod common;

use common::*;
use rill_server::ServerOptions;

/// Every local file a page or module refers to (`src=`, `href=`, `import ... from`).
fn references(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for marker in [
        "src=\"",
        "href=\"",
        "from \"",
        "from '",
        "import(\"",
        "import('",
    ] {
        let mut rest = text;
        while let Some(i) = rest.find(marker) {
            rest = &rest[i + marker.len()..];
            let end = rest.find(['"', '\'']).unwrap_or(rest.len());
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_whole_and_self_contained() {
    let s = TestServer::tiny().await;
    let page = get(&s.base, "/").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.headers["content-type"].to_str().unwrap(),
        "text/html; charset=utf-8"
    );
    // Walk every reference from the page: all local, all served.
    let mut todo = vec![("/".to_string(), page.text.clone())];
    let mut seen = std::collections::BTreeSet::new();
    while let Some((from, text)) = todo.pop() {
        for r in references(&text) {
            assert!(
                !r.starts_with("http:") && !r.starts_with("https:") && !r.starts_with("//"),
                "{from} refers outside: {r}"
            );
            if r.starts_with('#') || r.starts_with("data:") || r.is_empty() {
                continue;
            }
            let base = if from.ends_with('/') {
                from.clone()
            } else {
                from[..=from.rfind('/').unwrap()].to_string()
            };
            let mut path = if r.starts_with('/') {
                r.clone()
            } else {
                format!("{base}{r}")
            };
            path = path.replace("/./", "/");
            if !seen.insert(path.clone()) {
                continue;
            }
            let got = get(&s.base, &path).await;
            assert_eq!(got.status, 200, "{from} refers to {path}");
            if path.ends_with(".js") {
                assert!(got.headers["content-type"]
                    .to_str()
                    .unwrap()
                    .starts_with("text/javascript"));
                todo.push((path, got.text));
            }
        }
    }
    assert!(seen.iter().any(|p| p.ends_with(".js")), "{seen:?}");
    assert!(seen.iter().any(|p| p.ends_with(".css")), "{seen:?}");
    // Unknown paths are still OpenAI-shaped 404s.
    let missing = get(&s.base, "/nope.js").await;
    assert_eq!(missing.status, 404);
    missing.assert_error_shape();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_folder_serves_only_its_own_files() {
    let dir = std::env::temp_dir().join(format!("rill-web-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("js")).unwrap();
    std::fs::write(dir.join("index.html"), "<p>dev page</p>").unwrap();
    std::fs::write(dir.join("js/a.js"), "export const a = 1;").unwrap();
    std::fs::write(dir.join("js/.hidden"), "HIDDEN-CONTENT").unwrap();
    std::fs::write(dir.with_extension("secret"), "OUTSIDE-CONTENT").unwrap();
    let s = TestServer::start(
        tiny(),
        small_config(),
        ServerOptions {
            web_dir: Some(dir.clone()),
            ..ServerOptions::default()
        },
    )
    .await;
    assert_eq!(get(&s.base, "/").await.text, "<p>dev page</p>");
    assert_eq!(get(&s.base, "/js/a.js").await.text, "export const a = 1;");
    let name = dir.with_extension("secret");
    let name = name.file_name().unwrap().to_str().unwrap();
    for path in [
        "/js/.hidden".to_string(),
        format!("/../{name}"),
        format!("/js/../../{name}"),
        format!("/%2e%2e/{name}"),
        "/js/sub/a.js".to_string(),
    ] {
        let (status, body) = raw_get(&s.base, &path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(
            !body.contains("HIDDEN-CONTENT") && !body.contains("OUTSIDE-CONTENT"),
            "{path}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_file(dir.with_extension("secret")).unwrap();
}

/// A GET with the path sent exactly as given (no client-side normalisation of `..`).
async fn raw_get(base: &str, path: &str) -> (u16, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let (_, reply) = raw_request(base, request.as_bytes(), |_| false).await;
    let status = reply
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, reply)
}
