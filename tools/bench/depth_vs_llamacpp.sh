#!/usr/bin/env bash
# Long-context speed against llama.cpp, in one run: `rill bench --depth D --kv-type K` and
# `llama-bench -d D -ctk K -ctv K` on the same GGUF and threads, for every depth and KV type asked,
# rounds alternating so that machine drift hits both. llama.cpp runs with flash attention off and
# on (`-fa off,on`; a quantized V cache needs it on) and its better figure is the one compared.
#
# usage: tools/bench/depth_vs_llamacpp.sh MODEL.gguf [ROUNDS]
#   env: DEPTHS=0,4096 KVS=f16,q8_0 PP=512 TG=128 THREADS=2 REPS=3 RILL=target/release/rill
#        LLAMA_BIN=<folder of llama-bench> (default: what ../shared/bench/setup-llamacpp.sh builds)
# Prints one line per test, depth and KV type: each engine's median tokens/s and the ratio
# rill / llama.cpp; the raw JSON lines stay in the printed folder.
set -euo pipefail
model=$1
rounds=${2:-2}
depths=${DEPTHS:-0,4096}
kvs=${KVS:-f16,q8_0}
pp=${PP:-512}
tg=${TG:-128}
threads=${THREADS:-2}
reps=${REPS:-3}
rill=${RILL:-target/release/rill}
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${LLAMA_BIN:-}" ]; then
  LLAMA_BIN=$("$here/../../../shared/bench/setup-llamacpp.sh")
fi
out=$(mktemp -d)
echo "raw results: $out" >&2
for ((i = 0; i < rounds; i++)); do
  "$rill" bench --model "$model" --threads "$threads" -p "$pp" -n "$tg" -r "$reps" \
    --depth "$depths" --kv-type "$kvs" --json >>"$out/rill.jsonl"
  IFS=, read -ra kv_list <<<"$kvs"
  for kv in "${kv_list[@]}"; do
    fa=off,on
    [ "$kv" != f16 ] && fa=on # llama.cpp quantizes the V cache only with flash attention
    "$LLAMA_BIN/llama-bench" -m "$model" -t "$threads" -p "$pp" -n "$tg" -r "$reps" -d "$depths" \
      -ctk "$kv" -ctv "$kv" -fa "$fa" -o jsonl 2>/dev/null >>"$out/llamacpp.jsonl"
  done
done
python3 - "$out" <<'PY'
import json, os, statistics, sys
d = sys.argv[1]

def key(test, depth, kv):
    return (test, int(depth), kv)

rill, llama = {}, {}
for line in open(os.path.join(d, "rill.jsonl")):
    if line.startswith("{"):
        o = json.loads(line)
        rill.setdefault(key(o["test"], o["depth"], o["kv_type"]), []).append(o["tokens_per_s"])
for line in open(os.path.join(d, "llamacpp.jsonl")):
    if line.startswith("{"):
        o = json.loads(line)
        test = f"pp{o['n_prompt']}" if o["n_prompt"] else f"tg{o['n_gen']}"
        k = key(test, o.get("n_depth", 0), o["type_k"])
        fa = "fa" + str(int(o.get("flash_attn") in (1, True, "on", "1")))
        llama.setdefault(k, {}).setdefault(fa, []).extend(o["samples_ts"])
print(f"{'test':>8} {'depth':>6} {'kv':>5} {'rill tok/s':>11} {'llama.cpp':>10} {'(fa)':>5} {'ratio':>7}")
for k in sorted(set(rill) | set(llama), key=lambda k: (k[2], k[1], k[0])):
    r = statistics.median(rill[k]) if k in rill else None
    best = None
    for fa, samples in llama.get(k, {}).items():
        m = statistics.median(samples)
        if best is None or m > best[0]:
            best = (m, fa)
    ratio = f"{r / best[0]:.2f}x" if r and best else "n/a"
    l = f"{best[0]:10.1f} {best[1]:>5}" if best else f"{'n/a':>10} {'':>5}"
    print(f"{k[0]:>8} {k[1]:>6} {k[2]:>5} {r or float('nan'):11.1f} {l} {ratio:>7}")
PY
