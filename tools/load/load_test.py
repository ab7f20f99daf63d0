#!/usr/bin/env python3
"""Load and fault runs against one rill replica on loopback, measured from the outside (the
replica's /metrics and /health, its resident memory from /proc, the clients' answers). Not a test
suite: a measurement whose figures go into a report. Each scenario starts its own replica.

  disconnects  N concurrent streaming clients (bounded), half of them closing their connection at
               a random point: afterwards no KV block is in use, no answer but 200/429/503, and
               the replica's resident memory is back near where it started.
  overload     an open-loop arrival rate of 10x what the replica serves: every request is served
               or answered 429 with Retry-After at once; resident memory stays flat; latency of the
               admitted ones stays bounded (reported as percentiles).
  soak         a steady closed-loop load for --duration seconds: resident memory and latency
               percentiles per window, with their least-squares slopes.
  preempt      a KV cache far too small for the load: preemption keeps every seeded answer
               identical to the same request answered alone.

    python3 tools/load/load_test.py disconnects --clients 1000
    python3 tools/load/load_test.py soak --duration 3600 --json soak.json

Every loop is bounded by a count or --duration, every wait by a deadline; the replica is stopped
at the end. Only loopback addresses are used.
"""

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HOST = "127.0.0.1"


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def get_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line.startswith("#") and " " in line:
            k, v = line.rsplit(" ", 1)
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


class Replica:
    def __init__(self, args, port, extra=()):
        self.base = f"http://{HOST}:{port}"
        self.log = tempfile.NamedTemporaryFile("w", prefix="rill-load-", suffix=".log", delete=False)
        cmd = [args.rill, "serve", "--model", args.model, "--host", HOST, "--port", str(port),
               "--threads", str(args.threads), *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if get_json(self.base + "/health", 2).get("status") == "ok":
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"rill serve exited: see {self.log.name}")
            time.sleep(0.2)
        raise RuntimeError("rill serve did not become ready")

    def rss(self):
        return rss_mib(self.proc.pid)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def request(port, body, stream, disconnect_after=None, timeout=600):
    """One HTTP/1.1 request on its own connection. Returns (status, headers, events or body,
    seconds to first byte of body, total seconds). With `disconnect_after`, closes the connection
    after that many stream events."""
    t0 = time.monotonic()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), timeout)
    payload = json.dumps(body).encode()
    writer.write((f"POST /v1/chat/completions HTTP/1.1\r\nhost: {HOST}\r\n"
                  f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
                  "connection: close\r\n\r\n").encode() + payload)
    await writer.drain()
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in
                   (l.split(":", 1) for l in lines[1:] if ":" in l)}
        first = None
        events = []
        if stream and status == 200:
            while True:
                line = await asyncio.wait_for(reader.readline(), timeout)
                if not line:
                    break
                line = line.strip()
                if line.startswith(b"data: "):
                    # Time to the first generated text (the role chunk comes before it).
                    if first is None and b'"content":"' in line and b'"content":""' not in line:
                        first = time.monotonic() - t0
                    events.append(line[6:])
                    if line == b"data: [DONE]":
                        break
                    if disconnect_after is not None and len(events) >= disconnect_after:
                        break
            return status, headers, events, first, time.monotonic() - t0
        data = await asyncio.wait_for(reader.read(), timeout)
        return status, headers, data, time.monotonic() - t0, time.monotonic() - t0
    finally:
        writer.close()


def chat_body(i, max_tokens, stream, seed=None, temperature=0.0):
    body = {"messages": [{"role": "user", "content": f"Request {i}: tell me about rivers."}],
            "max_tokens": max_tokens, "stream": stream, "ignore_eos": True,
            "temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    return body


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def slope(xs, ys):
    """Least-squares slope of ys over xs."""
    if len(xs) < 2:
        return 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def settle(replica):
    """Waits (bounded) until the replica has no request in flight, then a few seconds more (the
    server hands freed memory back to the system when idle, checking every 3 s); returns
    /health."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        h = get_json(replica.base + "/health")
        if h.get("requests_in_flight", 0) == 0 and h["kv_cache"]["blocks_used"] == 0:
            time.sleep(7)
            return h
        time.sleep(0.2)
    return get_json(replica.base + "/health")


async def disconnects(args):
    r = Replica(args, args.port, ["--max-running", "64", "--max-queue", str(args.clients)])
    try:
        port = args.port
        # Warm up, so the starting memory includes what any first request allocates.
        await request(port, chat_body(0, 8, True), True)
        settle(r)
        rss0 = r.rss()
        sem = asyncio.Semaphore(args.clients)
        rng = random.Random(7)
        statuses = {}
        t0 = time.monotonic()
        peak = [rss0]
        after_rounds = []

        async def one(i):
            async with sem:
                cut = rng.randint(1, 30) if i % 2 else None
                try:
                    st, _, _, _, _ = await request(port, chat_body(i, 32, True), True, cut)
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                    st = type(e).__name__
                statuses[st] = statuses.get(st, 0) + 1

        async def sample():
            while True:
                peak[0] = max(peak[0], r.rss())
                await asyncio.sleep(0.5)
        sampler = asyncio.create_task(sample())
        # Several rounds: memory that grows round after round is a leak; memory kept after the
        # first (the allocator's high-water mark) is not.
        for _ in range(args.rounds):
            await asyncio.gather(*(one(i) for i in range(args.clients)))
            settle(r)
            after_rounds.append(round(r.rss(), 1))
        sampler.cancel()
        elapsed = time.monotonic() - t0
        h = settle(r)
        rss1 = r.rss()
        m = metrics(r.base)
        out = {
            "scenario": "disconnects", "clients": args.clients, "seconds": round(elapsed, 1),
            "statuses": statuses, "kv_blocks_used_after": h["kv_cache"]["blocks_used"],
            "requests_in_flight_after": h["requests_in_flight"],
            "rss_mib_start": round(rss0, 1), "rss_mib_peak": round(peak[0], 1),
            "rss_mib_after": round(rss1, 1), "rss_mib_after_each_round": after_rounds,
            "client_disconnects": m.get("rill_http_client_disconnects_total"),
            "cancelled": m.get('rill_requests_finished_total{finish_reason="cancelled"}'),
        }
        bad = {k: v for k, v in statuses.items() if k not in (200, 429, 503)}
        out["ok"] = not bad and out["kv_blocks_used_after"] == 0
        return out
    finally:
        r.stop()


async def served_rate(port, n=8, max_tokens=16):
    """Requests per second the replica completes at concurrency n (closed loop)."""
    t0 = time.monotonic()
    await asyncio.gather(*(request(port, chat_body(i, max_tokens, False), False) for i in range(n)))
    return n / (time.monotonic() - t0)


async def overload(args):
    r = Replica(args, args.port, ["--max-queue", "16"])
    try:
        port = args.port
        await served_rate(port, 2)
        capacity = await served_rate(port)
        rate = 10 * capacity
        settle(r)
        rss0 = r.rss()
        results = []
        rss_samples = []
        t0 = time.monotonic()
        total = int(rate * args.duration)

        async def one(i):
            try:
                st, hd, _, _, dt = await request(port, chat_body(i, 16, False), False)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                st, hd, dt = type(e).__name__, {}, float("nan")
            results.append((st, "retry-after" in hd, dt))
        tasks = []
        for i in range(total):
            # Open loop: arrivals do not wait for answers.
            target = t0 + i / rate
            delay = target - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
            if i % max(1, int(rate)) == 0:
                rss_samples.append((time.monotonic() - t0, r.rss()))
        await asyncio.gather(*tasks)
        settle(r)
        served = [dt for st, _, dt in results if st == 200]
        refused = [dt for st, ra, dt in results if st == 429]
        statuses = {}
        for st, _, _ in results:
            statuses[st] = statuses.get(st, 0) + 1
        out = {
            "scenario": "overload", "capacity_rps": round(capacity, 2),
            "offered_rps": round(rate, 2), "requests": total, "statuses": statuses,
            "all_429_have_retry_after": all(ra for st, ra, _ in results if st == 429),
            "admitted_latency_s": {"p50": round(pct(served, 50), 3), "p99": round(pct(served, 99), 3),
                                   "max": round(max(served, default=float("nan")), 3)},
            "refusal_latency_s": {"p50": round(pct(refused, 50), 4), "p99": round(pct(refused, 99), 4)},
            "rss_mib_start": round(rss0, 1), "rss_mib_end": round(r.rss(), 1),
            "rss_slope_mib_per_min": round(60 * slope([t for t, _ in rss_samples],
                                                      [m for _, m in rss_samples]), 3),
        }
        out["ok"] = set(statuses) <= {200, 429} and out["all_429_have_retry_after"]
        return out
    finally:
        r.stop()


async def soak(args):
    r = Replica(args, args.port)
    try:
        port = args.port
        await served_rate(port, 2)
        window = max(10.0, args.duration / 30)
        windows = []
        t0 = time.monotonic()
        end = t0 + args.duration
        lat, ttft = [], []
        errors = 0
        wstart = t0

        async def worker(k):
            nonlocal errors
            i = 0
            while time.monotonic() < end:
                i += 1
                try:
                    st, _, ev, first, dt = await request(port, chat_body(k * 10**6 + i, 32, True), True)
                    if st == 200:
                        lat.append(dt)
                        ttft.append(first)
                    else:
                        errors += 1
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                    errors += 1

        async def sampler():
            nonlocal wstart, lat, ttft
            while time.monotonic() < end:
                await asyncio.sleep(min(window, max(0.0, end - time.monotonic())))
                now = time.monotonic()
                windows.append({"t_s": round(now - t0, 1), "rss_mib": round(r.rss(), 1),
                                "requests": len(lat), "p50_s": round(pct(lat, 50), 3),
                                "p99_s": round(pct(lat, 99), 3),
                                "ttft_p50_s": round(pct(ttft, 50), 3)})
                print(json.dumps(windows[-1]), flush=True)
                lat, ttft = [], []
                wstart = now
        await asyncio.gather(sampler(), *(worker(k) for k in range(args.concurrency)))
        ts = [w["t_s"] / 60 for w in windows]
        out = {
            "scenario": "soak", "seconds": args.duration, "concurrency": args.concurrency,
            "errors": errors, "windows": windows,
            "rss_slope_mib_per_hour": round(60 * slope(ts, [w["rss_mib"] for w in windows]), 3),
            "p50_slope_s_per_hour": round(60 * slope(ts, [w["p50_s"] for w in windows]), 4),
            "p99_slope_s_per_hour": round(60 * slope(ts, [w["p99_s"] for w in windows]), 4),
        }
        out["ok"] = errors == 0
        return out
    finally:
        r.stop()


async def preempt(args):
    n = args.clients if args.clients < 1000 else 24
    bodies = [chat_body(i, 48, False, seed=1000 + i, temperature=0.8) for i in range(n)]

    def texts(results):
        return [json.loads(b)["choices"][0]["message"]["content"] for _, _, b, _, _ in results]
    alone = Replica(args, args.port)
    try:
        reference = []
        for b in bodies:
            reference.append(await request(args.port, b, False))
    finally:
        alone.stop()
    tiny = Replica(args, args.port + 1, ["--kv-cache-mb", "4", "--ctx-size", "160",
                                         "--max-running", "16"])
    try:
        loaded = await asyncio.gather(*(request(args.port + 1, b, False) for b in bodies))
        m = metrics(tiny.base)
    finally:
        tiny.stop()
    same = [a == b for a, b in zip(texts(reference), texts(loaded))]
    out = {"scenario": "preempt", "requests": n, "identical": sum(same),
           "preemptions": m.get("rill_preemptions_total"),
           "statuses": sorted({st for st, *_ in loaded})}
    out["ok"] = all(same) and (out["preemptions"] or 0) > 0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", choices=["disconnects", "overload", "soak", "preempt"])
    ap.add_argument("--rill", default="target/release/rill")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=18400)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="also write the result to this file")
    args = ap.parse_args()
    result = asyncio.run(globals()[args.scenario](args))
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    sys.exit(0 if result.get("ok") else 1)


if __name__ == "__main__":
    main()
