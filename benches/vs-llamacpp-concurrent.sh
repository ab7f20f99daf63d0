#!/usr/bin/env bash
# rill and llama.cpp measured at the same time, one thread each on its own core (swapped every
# round), so that this VM's speed swings (2x within minutes) hit both engines alike: a steadier
# ratio than alternating 2-thread runs, at the price of measuring one thread and of both engines
# sharing the memory bandwidth during decode.
# usage: benches/vs-llamacpp-concurrent.sh MODEL.gguf [RILL_BINARY] [ROUNDS]  (env: PP=512 TG=128)
set -euo pipefail
model=$1; rill=${2:-target/release/rill}; rounds=${3:-4}
pp=${PP:-512}; tg=${TG:-128}
bin=$("$(cd "$(dirname "$0")" && pwd)/../../shared/bench/setup-llamacpp.sh")
out=$(mktemp -d)
for ((i = 0; i < rounds; i++)); do
  cr=$((i % 2)); cl=$((1 - i % 2))
  taskset -c $cr "$rill" bench --model "$model" --threads 1 -p "$pp" -n "$tg" -r 2 --json >>"$out/rill.jsonl" &
  taskset -c $cl "$bin/llama-bench" -m "$model" -t 1 -p "$pp" -n "$tg" -r 2 -o jsonl 2>/dev/null >>"$out/llamacpp.jsonl"
  wait
done
python3 - "$out" "$pp" "$tg" <<'PY'
import json, sys, os, statistics
d, pp, tg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rill = [json.loads(l) for l in open(os.path.join(d, "rill.jsonl")) if l.strip().startswith("{")]
llama = [json.loads(l) for l in open(os.path.join(d, "llamacpp.jsonl")) if l.strip().startswith("{")]
for test, key in ((f"pp{pp}", "n_prompt"), (f"tg{tg}", "n_gen")):
    r = [o["tokens_per_s"] for o in rill if o["test"] == test]
    l = [o["avg_ts"] for o in llama if o.get(key) and (o["n_prompt"] == 0) == (key == "n_gen")]
    ratios = [a / b for a, b in zip(r, l)]
    print(f"{test:8s} 1 thread each, concurrent: rill {statistics.median(r):7.1f} tok/s  llama.cpp {statistics.median(l):7.1f} tok/s"
          f"  ratio median {statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f})")
PY
