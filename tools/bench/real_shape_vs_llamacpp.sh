#!/usr/bin/env bash
# The real-shape files of `real_shape_direct.py` / `real_shape.py`, in one run: `rill bench` (and an
# earlier rill binary, if BEFORE names one) against `llama-bench`, same file, same threads, one
# engine after the other per file, pp and tg as asked.
#
# usage: tools/bench/real_shape_vs_llamacpp.sh DIR TYPE...      (DIR/model-TYPE.gguf)
#   env: PP=512 TG=64 THREADS=2 REPS=1 RILL=target/release/rill BEFORE=<older rill binary>
#        LLAMA_BIN=<folder of llama-bench> (default: what ../shared/bench/setup-llamacpp.sh builds;
#        on CPUs with AMX that build's IQ4_XS/K-quant prompt kernels may fault, see
#        docs/performance.md: build one with -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
# Prints one line per file and test: each engine's tokens/s and rill / llama.cpp.
set -euo pipefail
dir=$1; shift
pp=${PP:-512}; tg=${TG:-64}; threads=${THREADS:-2}; reps=${REPS:-1}
rill=${RILL:-target/release/rill}
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${LLAMA_BIN:-}" ]; then
  LLAMA_BIN=$("$here/../../../shared/bench/setup-llamacpp.sh")
fi
rill_line() {
  "$1" bench --model "$2" --threads "$threads" -p "$pp" -n "$tg" -r "$reps" --json |
    python3 -c 'import sys, json; print(" ".join("%s=%.1f" % (o["test"], o["tokens_per_s"]) for o in map(json.loads, sys.stdin)))'
}
for ty in "$@"; do
  model=$dir/model-$ty.gguf
  before=""
  [ -n "${BEFORE:-}" ] && before=$(rill_line "$BEFORE" "$model")
  now=$(rill_line "$rill" "$model")
  llama=$("$LLAMA_BIN/llama-bench" -m "$model" -t "$threads" -p "$pp" -n "$tg" -r "$reps" -o jsonl 2>/dev/null |
    python3 -c 'import sys, json
for o in map(json.loads, filter(lambda l: l.startswith("{"), sys.stdin)):
    t = "pp%d" % o["n_prompt"] if o["n_prompt"] else "tg%d" % o["n_gen"]
    print("%s=%.1f" % (t, o["avg_ts"]), end=" ")')
  python3 - "$ty" "$before" "$now" "$llama" <<'PY'
import sys
ty, before, now, llama = sys.argv[1:]
parse = lambda s: dict(kv.split("=") for kv in s.split())
b, r, l = parse(before), parse(now), parse(llama)
for test in r:
    extra = f"  rill before {float(b[test]):7.1f}" if test in b else ""
    ratio = float(r[test]) / float(l[test]) if test in l else float("nan")
    print(f"{ty:8s} {test:6s} rill {float(r[test]):7.1f}  llama.cpp {float(l.get(test, 'nan')):7.1f}  ratio {ratio:.2f}x{extra}")
PY
done
