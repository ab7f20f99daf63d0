#!/usr/bin/env python3
"""Prompt lookup in `rill serve`'s loop, measured through its HTTP API: two servers of one model,
one with prompt lookup (the default) and one with `--prompt-lookup 0`, get the same greedy chat
requests alternately, one at a time; prints each prompt's completion tokens per second (client
wall time over the server's usage count, median of the rounds) and the ratio, and checks that
both servers wrote the same text.

    tools/bench/prompt_lookup_serve.py MODEL PROMPT_FILE [PROMPT_FILE ...]
    env: RILL=target/release/rill ROUNDS=4 MAX_TOKENS=256 PORT=8301 (and PORT+1)
"""

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

RILL = os.environ.get("RILL", "target/release/rill")
ROUNDS = int(os.environ.get("ROUNDS", "4"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "256"))
PORT = int(os.environ.get("PORT", "8301"))


def wait_ready(port: int) -> None:
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ready")
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"the server on port {port} never became ready")


def chat(port: int, model: str, text: str) -> tuple[str, int, float]:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}],
                       "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    started = time.time()
    out = json.load(urllib.request.urlopen(req))
    return out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"], time.time() - started


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    model, prompts = sys.argv[1], sys.argv[2:]
    servers = {"lookup": (PORT, []), "plain": (PORT + 1, ["--prompt-lookup", "0"])}
    procs = [subprocess.Popen([RILL, "serve", "-m", model, "--port", str(port), *extra],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for port, extra in servers.values()]
    try:
        for port, _ in servers.values():
            wait_ready(port)
        speeds: dict[tuple[str, str], list[float]] = {}
        for _ in range(ROUNDS):
            for path in prompts:
                text = open(path).read()
                outs = {}
                for name, (port, _) in servers.items():
                    out, n, seconds = chat(port, model, text)
                    outs[name] = out
                    speeds.setdefault((path, name), []).append(n / seconds)
                if outs["lookup"] != outs["plain"]:
                    sys.exit(f"{path}: the two servers wrote different texts")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics").read().decode()
    finally:
        for p in procs:
            p.terminate()
            p.wait()
    print(f"{model}, greedy chat, {MAX_TOKENS} tokens at most, {ROUNDS} alternating rounds (median tok/s)")
    print("| prompt | prompt lookup | plain | ratio |")
    print("|---|---|---|---|")
    for path in prompts:
        a = statistics.median(speeds[(path, "lookup")])
        b = statistics.median(speeds[(path, "plain")])
        print(f"| {os.path.basename(path)} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    for line in metrics.splitlines():
        if line.startswith("rill_spec_decode"):
            print(line)


if __name__ == "__main__":
    main()
