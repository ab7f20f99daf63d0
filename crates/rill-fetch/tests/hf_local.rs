//! `hf:` downloads against a local HTTP server on 127.0.0.1, selected through `HF_ENDPOINT`
//! (and, once it is gone, a hub that cannot be reached).
//! This file holds a single test because it sets a process-wide environment variable (each
//! integration-test file is its own process).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use rill_fetch::{resolve, FetchError, FetchOptions};

fn serve(listener: TcpListener, body: Vec<u8>, connections: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for stream in listener.incoming().take(connections) {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(300)));
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            let _ = reader.read_line(&mut request_line);
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if line == "\r\n" || line == "\n" => break,
                    Ok(_) => {}
                }
            }
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .to_string();
            let (status, payload): (&str, Vec<u8>) = match path.as_str() {
                "/own/repo/resolve/main/sub/model%20a.gguf" => ("200 OK", body.clone()),
                "/own/repo/resolve/main/page.gguf" => ("200 OK", b"<html>hi</html>".to_vec()),
                "/own/gated/resolve/main/m.gguf" => ("401 Unauthorized", Vec::new()),
                _ => ("404 Not Found", Vec::new()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                payload.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&payload);
        }
    })
}

fn no_partials(dir: &Path) -> bool {
    walk(dir).iter().all(|p| !p.contains(".partial-"))
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.display().to_string());
            if p.is_dir() {
                out.extend(walk(&p));
            }
        }
    }
    out
}

#[test]
fn hf_download_via_local_endpoint() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut body = b"GGUF".to_vec();
    body.extend((0..100_000u32).map(|i| (i * 7 % 251) as u8));
    let server = serve(listener, body.clone(), 4);
    std::env::set_var("HF_ENDPOINT", format!("http://127.0.0.1:{port}/"));

    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let opts = FetchOptions {
        models_dir: Some(models.clone()),
        ..Default::default()
    };

    // Success: lands under hf/OWNER/REPO/FILE, with the URL path percent-encoded.
    let path = resolve("hf:own/repo/sub/model a.gguf", &opts).unwrap();
    assert_eq!(path, models.join("hf/own/repo/sub/model a.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), body);

    // Not GGUF (an HTML page served with 200): rejected, nothing kept.
    let e = resolve("hf:own/repo/page.gguf", &opts).unwrap_err();
    assert!(matches!(e, FetchError::HfDownload { .. }), "{e:?}");
    assert!(e.to_string().contains("is not a GGUF file"), "{e}");
    assert!(!models.join("hf/own/repo/page.gguf").exists());

    // HTTP errors say what happened.
    let e = resolve("hf:own/gated/m.gguf", &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("HTTP 401") && e.contains("gated"), "{e}");
    let e = resolve("hf:own/missing/m.gguf", &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("HTTP 404") && !e.contains('\n'), "{e}");

    server.join().unwrap();
    assert!(no_partials(&models), "{:?}", walk(&models));

    // Cached: served from disk with the server gone.
    assert_eq!(
        resolve("hf:own/repo/sub/model a.gguf", &opts).unwrap(),
        path
    );

    // A hub that cannot be reached (the server is gone, its port closed): one line that says
    // what to do, and nothing written, not even a directory.
    let spec = "hf:rill-test-owner/rill-test-repo/model.gguf";
    let e = resolve(spec, &opts).unwrap_err();
    assert!(matches!(e, FetchError::HfDownload { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(!msg.contains('\n') && !msg.contains('\r'), "{msg:?}");
    assert!(
        msg.starts_with(&format!("could not download {spec}: ")),
        "{msg}"
    );
    assert!(
        msg.contains("download the file yourself and pass its path with --model"),
        "{msg}"
    );
    assert!(
        !models.join("hf/rill-test-owner").exists(),
        "{:?}",
        walk(&models)
    );
}
