#!/usr/bin/env bash
# Runs the tests over and over, on one core and under load, to show that none depends on timing:
#   1. the whole suite (the README's command, --no-fail-fast) SUITE_RUNS times in a row;
#   2. every test binary of rill-engine and rill-server BINARY_RUNS times pinned to one core
#      (taskset -c 0), then BINARY_RUNS times with `rill bench` running beside them.
# Prints one line per run and a total per stage; exits non-zero if any run failed. Logs of failed
# runs are kept under $LOG_DIR.
#
#   tools/stress-tests.sh                       # 5 suite runs, 20 + 20 binary runs
#   SUITE_RUNS=0 BINARY_RUNS=3 tools/stress-tests.sh
#
# Needs what the tests need (.ci/run sets it up: the models, the openai venv, Chromium), and
# taskset (util-linux).
set -uo pipefail
cd "$(dirname "$0")/.."

suite_runs=${SUITE_RUNS:-5}
binary_runs=${BINARY_RUNS:-20}
log_dir=${LOG_DIR:-$(mktemp -d -t rill-stress-XXXXXX)}
mkdir -p "$log_dir"
failed=0

echo "== build"
cargo build --release --workspace --all-targets || exit 1

# The test executables of a package, with the directory cargo runs them in.
binaries() {
  cargo test --release -p "$1" --no-run 2>&1 | sed -n "s|.*Executable .* (\(.*\))\$|$PWD/\1|p"
}

# Runs one command, keeps its log when it fails. Prints a line for every failure, and for every
# run when VERBOSE=1.
attempt() {
  local name=$1; shift
  local log="$log_dir/$name.log"
  local t0=$SECONDS
  if "$@" >"$log" 2>&1; then
    [ "${VERBOSE:-0}" = 1 ] && printf '  ok    %-48s %4ds\n' "$name" $((SECONDS - t0))
    rm -f "$log"
    return 0
  fi
  printf '  FAIL  %-48s %4ds  (log: %s)\n' "$name" $((SECONDS - t0)) "$log"
  return 1
}

if [ "$suite_runs" -gt 0 ]; then
  echo "== the whole suite, $suite_runs runs"
  ok=0
  for i in $(seq "$suite_runs"); do
    if attempt "suite-$i" cargo test --release --workspace --no-fail-fast; then ok=$((ok + 1)); fi
  done
  echo "suite: $ok of $suite_runs runs passed"
  [ "$ok" -eq "$suite_runs" ] || failed=1
fi

run_binaries() {
  local condition=$1; shift
  local pkg bin name ok total t0
  for pkg in rill-engine rill-server; do
    for bin in $(binaries "$pkg"); do
      name=$(basename "$bin" | sed 's/-[0-9a-f]*$//')
      ok=0; total=0; t0=$SECONDS
      for i in $(seq "$binary_runs"); do
        total=$((total + 1))
        if attempt "$condition-$pkg-$name-$i" env -C "crates/$pkg" "$@" "$bin" -q; then ok=$((ok + 1)); fi
      done
      echo "$condition $pkg/$name: $ok of $total runs passed ($((SECONDS - t0)) s)"
      [ "$ok" -eq "$total" ] || failed=1
    done
  done
}

if [ "$binary_runs" -gt 0 ]; then
  echo "== rill-engine and rill-server test binaries on one core (taskset -c 0), $binary_runs runs each"
  run_binaries one-core taskset -c 0

  echo "== the same under load: rill bench running beside them"
  (
    while :; do
      target/release/rill bench -m smollm2-135m -t 2 -p 256 -n 64 -r 5 >/dev/null 2>&1 || sleep 1
    done
  ) &
  load=$!
  trap 'kill "$load" 2>/dev/null; pkill -P "$load" 2>/dev/null' EXIT
  run_binaries loaded
  kill "$load" 2>/dev/null; pkill -P "$load" 2>/dev/null
fi

if [ "$failed" -eq 0 ]; then echo "stress: every run passed"; else echo "stress: some runs failed (logs in $log_dir)"; fi
exit "$failed"
