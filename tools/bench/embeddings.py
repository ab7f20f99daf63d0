#!/usr/bin/env python3
"""Embedding throughput of two servers on the same model, side by side: rill's and another's
(llama-server started with --embeddings --pooling mean) `/v1/embeddings`, the same 64
sentences as one request, alternating rounds, the best and median of each.

usage: tools/bench/embeddings.py RILL_URL OTHER_URL [ROUNDS]
Both servers must already run; start them one at a time on a 2-core machine's threads.
Also prints the cosine between the two servers' vectors of each sentence (same token ids).
"""

import json
import math
import statistics
import sys
import time
import urllib.request

rill, other = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
WORDS = ("the river model token vector engine quiet paper light north garden ancient "
         "silver market window mountain careful simple distant yellow").split()
sentences = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(8 + i % 9)) + "."
             for i in range(64)]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


tokens = [post(rill + "/tokenize", {"prompt": s, "add_special": True})["tokens"] for s in sentences]
n_tokens = sum(map(len, tokens))
times = {"rill": [], "other": []}
vectors = {}
for _ in range(rounds):
    for name, url in (("rill", rill), ("other", other)):
        t = time.perf_counter()
        out = post(url + "/v1/embeddings", {"input": tokens})
        times[name].append(time.perf_counter() - t)
        vectors[name] = [d["embedding"] for d in sorted(out["data"], key=lambda d: d["index"])]
cos = []
for u, v in zip(vectors["rill"], vectors["other"]):
    dot = sum(a * b for a, b in zip(u, v))
    cos.append(dot / (math.sqrt(sum(a * a for a in u)) * math.sqrt(sum(b * b for b in v))))
print(f"64 sentences, {n_tokens} tokens, {rounds} rounds")
for name in ("rill", "other"):
    best, med = min(times[name]), statistics.median(times[name])
    print(f"{name:6} best {best * 1000:7.1f} ms ({n_tokens / best:7.0f} tok/s)  median {med * 1000:7.1f} ms")
print(f"ratio (other / rill, best): {min(times['other']) / min(times['rill']):.2f}x")
print(f"cosine rill vs other: min {min(cos):.6f} mean {statistics.mean(cos):.6f}")
