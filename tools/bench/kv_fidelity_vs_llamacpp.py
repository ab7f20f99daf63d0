#!/usr/bin/env python3
"""llama.cpp's fidelity with each KV cache type at long prompts, on the references rill's own
long-context test uses (`tests/data/reference/<model>/long_context.json`: transformers in f32 on
the dequantized weights): KL(reference || llama.cpp) of the last position's distribution and
top-1 agreement, for f16, q8_0 and q4_0 keys and values (flash attention on, which a quantized V
cache needs). rill's own figures for the same cases are printed by
`cargo test --release -p rill-model --test long_context -- --include-ignored --nocapture`.

Usage: tools/bench/kv_fidelity_vs_llamacpp.py LLAMA_BIN_DIR MODEL.gguf REFERENCE_FOLDER [--cases long-2048,long-8192]

llama-server is asked for the probabilities of every vocabulary token (`n_probs` = the
vocabulary, before sampling) after the prompt given as token ids. Standard library only.
"""
import argparse
import json
import math
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise SystemExit(f"llama-server: {e.code} {e.read().decode(errors='replace')[:500]}")


def read_f32(path):
    data = open(path, "rb").read()
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def log_softmax(logits):
    m = max(logits)
    z = math.log(sum(math.exp(l - m) for l in logits)) + m
    return [l - z for l in logits]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("model")
    ap.add_argument("reference")
    ap.add_argument("--cases", default="long-2048,long-8192")
    ap.add_argument("--kv", default="f16,q8_0,q4_0")
    a = ap.parse_args()
    doc = json.load(open(os.path.join(a.reference, "long_context.json")))
    cases = {c["id"]: c for c in doc["cases"]}
    wanted = [cases[c] for c in a.cases.split(",") if c in cases]
    ctx = max(len(c["token_ids"]) for c in wanted) + 16
    print(f"model {os.path.basename(a.model)}, reference {os.path.basename(a.reference.rstrip('/'))}")
    print("| case | KV | KL(reference ‖ llama.cpp) | top-1 agrees |")
    print("|---|---|---|---|")
    for kv in a.kv.split(","):
        port = free_port()
        server = subprocess.Popen(
            [os.path.join(a.bin, "llama-server"), "-m", a.model, "-t", "2", "-c", str(ctx), "-np", "1",
             "-ctk", kv, "-ctv", kv, "-fa", "on", "--port", str(port), "--host", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if json.loads(urllib.request.urlopen(url + "/health", timeout=5).read()).get("status") == "ok":
                        break
                except Exception:
                    pass
                time.sleep(1)
            for c in wanted:
                ref = log_softmax(read_f32(os.path.join(a.reference, f"{c['id']}.last_logits.f32")))
                vocab = len(ref)
                out = post(url + "/completion", {
                    "prompt": c["token_ids"], "n_predict": 1, "n_probs": vocab, "temperature": 0,
                    "cache_prompt": False, "post_sampling_probs": False,
                })
                evaluated = out.get("tokens_evaluated")
                if evaluated is not None and evaluated != len(c["token_ids"]):
                    print(f"  ({c['id']}: llama.cpp evaluated {evaluated} tokens, not {len(c['token_ids'])})")
                probs = out["completion_probabilities"][0]["top_logprobs"]
                q = [None] * vocab
                for e in probs:
                    q[e["id"]] = e["logprob"]
                covered = sum(1 for v in q if v is not None)
                floor = min(v for v in q if v is not None)
                kl = sum(math.exp(p) * (p - (qv if qv is not None else floor))
                         for p, qv in zip(ref, q) if p > -80)
                best_ref = max(range(vocab), key=lambda i: ref[i])
                best_q = max((i for i in range(vocab) if q[i] is not None), key=lambda i: q[i])
                note = "" if covered == vocab else f" ({covered} of {vocab} tokens returned)"
                print(f"| {c['id']} | {kv} | {kl:.5f}{note} | {best_ref == best_q} |")
                sys.stdout.flush()
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
