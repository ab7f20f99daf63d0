//! `rill bench serve` against a tiny server of its own.

use super::*;

/// A tiny synthetic model served on a loopback port by a thread of its own; returns the
/// base URL.
fn serve_tiny(api_key: Option<&str>) -> String {
    let model = rill_model::synthetic::SyntheticSpec::llama_tiny()
        .build()
        .unwrap();
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("rill-bench-serve-{}-{n}.gguf", std::process::id()));
    model.write_to_path(&path).unwrap();
    let engine = rill_engine::Engine::load(&path, 1, rill_engine::Precision::Fast).unwrap();
    std::fs::remove_file(&path).unwrap();
    let config = rill_engine::serve::ServeConfig {
        kv_cache_bytes: 8 << 20,
        model_name: "tiny".into(),
        ..Default::default()
    };
    let handle = rill_engine::serve::spawn(engine, config).unwrap();
    let options = rill_server::ServerOptions {
        api_key: api_key.map(str::to_string),
        ..Default::default()
    };
    let server = rill_server::Server::new(options);
    server.set_ready(handle);
    format!("http://{}", server.serve_in_background(1).unwrap())
}

fn options(url: String) -> LoadOptions {
    LoadOptions {
        url,
        requests: Some(6),
        prompt_tokens: 24,
        max_tokens: 5,
        api_key: None,
        model: None,
        temperature: 0.0,
        seed: 1,
        warmup: 1,
        timeout: Duration::from_secs(60),
        turns: 1,
        turn_tokens: 8,
        dialect: Dialect::Chat,
    }
}

#[test]
fn conversations_send_every_earlier_turn() {
    let url = serve_tiny(None);
    let mut opts = options(url);
    opts.turns = 3;
    opts.requests = Some(6);
    let r = &run_load(&opts, &[2]).unwrap()[0];
    // Two conversations of three turns, each turn a request.
    assert_eq!(
        (r.requests, r.failed, r.turns),
        (6, 0, 3),
        "{:?}",
        r.first_error
    );
    assert_eq!(r.output_tokens, 30);
    // Later turns carry the history, the answers and the new messages: more prompt tokens
    // than three first turns would.
    assert!(r.prompt_tokens > 6 * 24, "{}", r.prompt_tokens);
    assert_eq!(r.to_json()["turns"], 3);
}

#[test]
fn load_against_a_server_reports_every_level() {
    let url = serve_tiny(Some("k"));
    let mut opts = options(url);
    opts.api_key = Some("k".into());
    opts.model = Some("tiny".into());
    let reports = run_load(&opts, &[1, 3]).unwrap();
    assert_eq!(reports.len(), 2);
    for (r, c) in reports.iter().zip([1, 3]) {
        assert_eq!(r.concurrency, c);
        assert_eq!((r.requests, r.failed), (6, 0), "{:?}", r.first_error);
        // ignore_eos + max_tokens: exactly 5 tokens each, as the usage says.
        assert_eq!(r.output_tokens, 30);
        assert!(r.prompt_tokens > 6 * 20, "{}", r.prompt_tokens);
        assert!(r.output_tokens_per_s > 0.0 && r.requests_per_s > 0.0);
        assert!(r.ttft_p50_s > 0.0 && r.ttft_p50_s <= r.ttft_p99_s);
        assert!(r.itl_p50_s <= r.itl_p99_s);
        let j = r.to_json();
        for key in [
            "concurrency",
            "requests",
            "output_tokens_per_s",
            "requests_per_s",
            "ttft_p50_s",
            "ttft_p99_s",
            "itl_p50_s",
            "itl_p99_s",
        ] {
            assert!(j.get(key).is_some(), "{key} missing from {j}");
        }
    }
}

#[test]
fn every_dialect_asks_for_exactly_so_many_tokens() {
    let url = serve_tiny(None);
    for dialect in [Dialect::Messages, Dialect::Responses] {
        let mut opts = options(url.clone());
        opts.dialect = dialect;
        let r = &run_load(&opts, &[2]).unwrap()[0];
        assert_eq!(
            (r.requests, r.failed),
            (6, 0),
            "{dialect:?}: {:?}",
            r.first_error
        );
        assert_eq!(r.output_tokens, 30, "{dialect:?}");
        assert!(r.prompt_tokens > 6 * 20, "{dialect:?}: {}", r.prompt_tokens);
    }
}

#[test]
fn failures_are_reported() {
    let url = serve_tiny(Some("right"));
    let mut opts = options(url.clone());
    // The warm-up request fails: the error says why.
    let e = run_load(&opts, &[1]).unwrap_err();
    assert!(format!("{e:#}").contains("401"), "{e:#}");
    // Without warm-up, the level reports its failures.
    opts.warmup = 0;
    let r = &run_load(&opts, &[2]).unwrap()[0];
    assert_eq!((r.requests, r.failed), (0, 6));
    assert!(r.first_error.as_deref().unwrap().contains("401"));
    assert!(run_load(&opts, &[0]).is_err());
}

#[test]
fn percentiles_interpolate() {
    let v = [1.0, 2.0, 3.0, 4.0, 5.0];
    assert_eq!(percentile(&v, 0.5), 3.0);
    assert_eq!(percentile(&v, 0.0), 1.0);
    assert_eq!(percentile(&v, 1.0), 5.0);
    assert!((percentile(&v, 0.99) - 4.96).abs() < 1e-9);
    assert!(percentile(&[], 0.5).is_nan());
}

#[test]
fn prompts_are_distinct_and_sized() {
    let a = prompt_text(0, 1, 50);
    let b = prompt_text(0, 2, 50);
    assert_ne!(a, b);
    assert_eq!(a.split(' ').count(), 2 + 50 + 3);
    assert_eq!(base_url("127.0.0.1:8080/v1/"), "http://127.0.0.1:8080");
    assert_eq!(base_url("https://x/v1"), "https://x");
}

#[test]
fn events_split_on_blank_lines() {
    assert_eq!(find_event_end(b"data: 1\n\ndata: 2"), Some((7, 2)));
    assert_eq!(find_event_end(b"data: 1\r\n\r\n"), Some((7, 4)));
    assert_eq!(find_event_end(b"data: 1\n"), None);
}
