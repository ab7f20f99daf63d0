//! Three rill replicas behind sglang-router and HAProxy (tools/fleet/fleet_test.py): prefix-aware
//! routing beats round robin on the replicas' own prefix-cache counters, a SIGKILLed replica
//! costs no request, a SIGTERMed one finishes its streams while new work goes elsewhere.
//!
//! Needs SmolLM2 (fetched like the other model tests), a Python with `sglang_router` (made on
//! first use by rill-testkit) and `haproxy` on PATH (Debian's package; the test fails, naming it,
//! without it).

use std::path::Path;
use std::process::Command;

#[test]
fn replicas_behind_sglang_router_and_haproxy() {
    rill_testkit::command("haproxy", "-v", "haproxy");
    let python = rill_testkit::python(&["sglang_router"]);
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
        .arg("--router-python")
        .arg(&python)
        .output()
        .expect("cannot run tools/fleet/fleet_test.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the fleet checks failed:\n{stdout}");
}
