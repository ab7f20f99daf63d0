#!/usr/bin/env python3
"""What each glass-box view costs on a running `rill serve`, against a decode step.

Usage: tools/bench/glass_views.py [--url http://127.0.0.1:8080] [--reps 5]

Generates an answer (its tokens/s gives the decode step's time), then times, on the context of its
last token: the logit lens (its context already in the prefix cache), the lens with attention and
value weighting, the lens on a context the cache has never seen, five counterfactual drops, the
server view, a multiverse of 4 branches, and a receipt's replay. Prints the median of `--reps`
runs of each, in ms and in decode steps. Standard library only.
"""
import argparse
import json
import statistics
import time
import urllib.request


def call(url, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req) as r:
        out = json.loads(r.read() or b"null")
        headers = dict(r.headers)
    return out, time.perf_counter() - t, headers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    prompt = "Explain in a few sentences why the sky is blue, and why sunsets are red."
    messages = [{"role": "user", "content": prompt}]
    gen, secs, headers = call(a.url, "/v1/chat/completions",
                              {"messages": messages, "max_tokens": 64, "temperature": 0, "ignore_eos": True})
    n = gen["usage"]["completion_tokens"]
    prompt_ids, _, _ = call(a.url, "/tokenize", {"messages": messages, "add_generation_prompt": True})
    ids = prompt_ids["tokens"]
    # The answer's ids: detokenizing is lossy, so take them from an explained run of the same request.
    ex, _, _ = call(a.url, "/v1/chat/completions",
                    {"messages": messages, "max_tokens": 64, "temperature": 0, "ignore_eos": True, "explain": True})
    answer = [t["token"] for t in ex["choices"][0]["rill"]["tokens"]]
    ctx = ids + answer[:-1]
    # Decode steps: the explained run's token times after the first.
    times = [t["elapsed_s"] for t in ex["choices"][0]["rill"]["tokens"]]
    step = (times[-1] - times[0]) / (len(times) - 1)
    print(f"context {len(ctx)} tokens; decode step {step * 1000:.2f} ms ({1 / step:.0f} tokens/s alone)")

    def bench(name, fn):
        got = []
        for _ in range(a.reps):
            got.append(fn())
        ms = statistics.median(got) * 1000
        print(f"{name:58s} {ms:8.1f} ms  {ms / (step * 1000):7.1f} decode steps")

    bench("lens (context cached), top 5", lambda: call(a.url, "/v1/rill/lens", {"tokens": ctx})[1])
    bench("lens + attention + value weighting",
          lambda: call(a.url, "/v1/rill/lens", {"tokens": ctx, "attention": True, "value_weighted": True})[1])
    salt = [0]

    def fresh():
        salt[0] += 1
        # A context no cache has seen: a different first user token.
        other = [{"role": "user", "content": f"({salt[0]}) " + prompt}]
        o, _, _ = call(a.url, "/tokenize", {"messages": other, "add_generation_prompt": True})
        return call(a.url, "/v1/rill/lens", {"tokens": o["tokens"] + answer[:-1]})[1]

    bench("lens on an uncached context (its prefill included)", fresh)
    positions = [len(ids) - 3, len(ids) + 5, len(ids) + 20, len(ctx) - 10, len(ctx) - 2]
    bench("counterfactuals: 5 drops",
          lambda: call(a.url, "/v1/rill/counterfactual",
                       {"tokens": ctx, "edits": [{"position": p} for p in positions]})[1])
    bench("server view (64 steps)", lambda: call(a.url, "/v1/rill/server?steps=64")[1])
    bench("multiverse: 24 tokens + 4 branches of 12",
          lambda: call(a.url, "/v1/rill/multiverse",
                       {"messages": messages, "max_tokens": 24, "branch_tokens": 12, "max_branches": 4,
                        "threshold": 1, "temperature": 0})[1])
    rid = headers.get("x-rill-receipt") or headers.get("X-Rill-Receipt")
    call(a.url, rid)  # the first call hashes the model file
    bench(f"replay of the {n}-token answer", lambda: call(a.url, "/v1/rill/replay", {"id": rid.rsplit('/', 1)[1]})[1])
    bench(f"the {n}-token answer itself (for scale)",
          lambda: call(a.url, "/v1/chat/completions",
                       {"messages": messages, "max_tokens": 64, "temperature": 0, "ignore_eos": True})[1])


if __name__ == "__main__":
    main()
