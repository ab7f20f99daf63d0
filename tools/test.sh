#!/usr/bin/env bash
# Every test, on a fresh machine: the README's test command.
#
# Installs the system packages the tests use and cannot install for themselves (HAProxy for the
# fleet test, Chromium for the web page's; Debian's packages, with sudo when not root), builds,
# fetches the two test models, then runs `cargo test --release --workspace` and prints one total.
# The rest is fetched by the tests on first use (crates/rill-testkit): a Python virtual
# environment with the official clients under ~/.cache/rill/test-venv (PyPI), llama.cpp's
# tokenizer vectors and chat templates (the llama-cpp-python sdist, PyPI), playwright-core (npm).
# A plain `cargo test` runs the same tests, and one whose system tool is missing fails with the
# line that installs it.
#
# Arguments go to `cargo test` (after the workspace selection), e.g. `tools/test.sh -- --nocapture`.
# RILL_TEST_NO_INSTALL=1 skips the system packages (a missing one then fails its test).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== toolchain"
cargo --version
python3 -m pip --version

echo "== system packages for the tests"
missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || missing+=(chromium)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
# `script` runs `rill chat` in a pseudo-terminal for the line editor's test.
command -v script >/dev/null 2>&1 || missing+=(bsdutils)
if [ ${#missing[@]} -gt 0 ] && [ "${RILL_TEST_NO_INSTALL:-0}" != 1 ]; then
  sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing ${missing[*]}"
  $sudo apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# sed reads all of it: `head -1` may close the pipe first, and pipefail would fail the run.
haproxy -v 2>/dev/null | sed -n 1p || echo "haproxy: missing"
"${CHROMIUM:-/usr/bin/chromium}" --version 2>/dev/null || echo "chromium: missing"

echo "== build"
cargo build --release --workspace --all-targets

echo "== models"
cargo run --release --quiet -- pull smollm2-135m
cargo run --release --quiet -- pull gemma3-270m

echo "== tests"
# --no-fail-fast so one failing binary does not hide the others; the output is kept to print
# one total at the end (a custom harness prints its own "N passed, M failed") (cargo's last lines are the doc-test binaries, which have few tests of
# their own). A binary that crashes (no `test result:` line) counts as one failure, and the run
# fails whenever cargo does.
log=$(mktemp)
set +e
cargo test --release --workspace --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
awk '/^ *(Running|Doc-tests) / { if (open) crashed += 1; open = 1 }
     /^test result:/ { p += $4; f += $6; i += $8; open = 0 }
     /^[0-9]+ passed, [0-9]+ failed$/ { p += $1; f += $3; open = 0 }  # a custom harness (no_alloc.rs)
     END { if (open) crashed += 1; printf "%d passed, %d failed, %d ignored\n", p, f + crashed, i }' "$log"
grep -E '^test .* \.\.\. ignored, ' "$log" | sed 's/^/  /' || true
rm -f "$log"
exit "$status"
