//! Three rill replicas behind sglang-router and HAProxy (tools/fleet/fleet_test.py): prefix-aware
//! routing beats round robin on the replicas' own prefix-cache counters, a SIGKILLed replica
//! costs no request, a SIGTERMed one finishes its streams while new work goes elsewhere.
//!
//! Needs SmolLM2 (fetched like the other model tests), a Python with `sglang_router`
//! (`RILL_TEST_PYTHON`, which .ci/run sets up) and `haproxy` on PATH; skipped without them unless
//! `RILL_REQUIRE_FLEET=1` (CI), which turns a missing piece into a failure.

use std::path::Path;
use std::process::Command;

fn python_with_router() -> Option<String> {
    let python = std::env::var("RILL_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    Command::new(&python)
        .args(["-c", "import sglang_router"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| python)
}

#[test]
fn replicas_behind_sglang_router_and_haproxy() {
    let required = std::env::var("RILL_REQUIRE_FLEET").is_ok_and(|v| v == "1");
    let haproxy = Command::new("haproxy").arg("-v").output().is_ok();
    let Some(python) = python_with_router().filter(|_| haproxy) else {
        assert!(
            !required,
            "RILL_REQUIRE_FLEET=1 but sglang_router (in RILL_TEST_PYTHON) or haproxy is missing"
        );
        eprintln!("skipped: needs sglang_router in RILL_TEST_PYTHON and haproxy on PATH");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The model the replicas serve, fetched (or found in the cache) before they start.
    let model = rill_fetch::pull("smollm2-135m", &rill_fetch::FetchOptions::default())
        .expect("cannot fetch SmolLM2");
    let out = Command::new("python3")
        .current_dir(&root)
        .args([
            "tools/fleet/fleet_test.py",
            "--rill",
            env!("CARGO_BIN_EXE_rill"),
            "--model",
        ])
        .arg(&model)
        .args(["--router-python", &python])
        .output()
        .expect("cannot run tools/fleet/fleet_test.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the fleet checks failed:\n{stdout}");
}
