#!/usr/bin/env bash
# Serving long conversations against llama-server, in one run: each engine serves the model on
# the same threads, and `rill bench serve --turns` drives it with CONC clients, each holding
# conversations of TURNS turns that start from a HISTORY-token first message and send every
# earlier answer back (so each turn's prefix is cached: rill's prefix cache, llama-server's
# per-slot cache). Prints each engine's JSON line and the ratios.
#
# usage: tools/bench/multiturn_vs_llamacpp.sh MODEL.gguf
#   env: CONC=8 TURNS=4 HISTORY=4096 TURN_TOKENS=32 MAX_TOKENS=64 REQUESTS=32 THREADS=2
#        CTX=8192 (per conversation) KV_MB=1536 (rill's arena) RILL=target/release/rill
#        LLAMA_BIN=<folder of llama-server> (default: what ../shared/bench/setup-llamacpp.sh builds)
set -euo pipefail
model=$1
conc=${CONC:-8}
turns=${TURNS:-4}
history=${HISTORY:-4096}
turn_tokens=${TURN_TOKENS:-32}
max_tokens=${MAX_TOKENS:-64}
requests=${REQUESTS:-32}
threads=${THREADS:-2}
ctx=${CTX:-8192}
kv_mb=${KV_MB:-1536}
rill=${RILL:-target/release/rill}
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${LLAMA_BIN:-}" ]; then
  LLAMA_BIN=$("$here/../../../shared/bench/setup-llamacpp.sh")
fi
out=$(mktemp -d)
echo "raw results and logs: $out" >&2
wait_for() {
  for _ in $(seq 1 120); do
    curl -sf "$1" >/dev/null && return 0
    sleep 1
  done
  echo "the server at $1 did not come up" >&2
  return 1
}
load() {
  "$rill" bench serve --url "$1" --concurrency "$conc" --requests "$requests" --turns "$turns" \
    --prompt-tokens "$history" --turn-tokens "$turn_tokens" --max-tokens "$max_tokens" --json
}
"$rill" serve -m "$model" -t "$threads" --port 8191 -c "$ctx" --kv-cache-mb "$kv_mb" \
  >"$out/rill-serve.log" 2>&1 &
pid=$!
wait_for http://127.0.0.1:8191/ready
load http://127.0.0.1:8191 | tail -1 >"$out/rill.json"
kill "$pid"; wait "$pid" 2>/dev/null || true
"$LLAMA_BIN/llama-server" -m "$model" -t "$threads" -c $((ctx * conc)) -np "$conc" --port 8192 \
  >"$out/llama-server.log" 2>&1 &
pid=$!
wait_for http://127.0.0.1:8192/health
load http://127.0.0.1:8192 | tail -1 >"$out/llamacpp.json"
kill "$pid"; wait "$pid" 2>/dev/null || true
python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
r = json.load(open(f"{d}/rill.json"))
l = json.load(open(f"{d}/llamacpp.json"))
print("rill:     ", json.dumps(r))
print("llama.cpp:", json.dumps(l))
for k in ["output_tokens_per_s", "requests_per_s"]:
    print(f"{k:22s} rill {r[k]:9.3f}  llama.cpp {l[k]:9.3f}  ratio {r[k] / l[k]:.2f}x")
for k in ["ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p99_s"]:
    print(f"{k:22s} rill {r[k]:9.3f}  llama.cpp {l[k]:9.3f}  (lower is better; llama.cpp / rill {l[k] / r[k]:.2f}x)")
PY
