#!/usr/bin/env python3
"""Three rill replicas behind the routers people run, on one machine, checked from the replicas'
own metrics and the clients' answers:

1. sglang-router, `cache_aware` against `round_robin`: a workload of documents each asked several
   questions gets a higher prefix-cache hit ratio (summed over the replicas' metrics) when the
   router keeps a document on one replica;
2. a replica killed with SIGKILL mid-load: the router drops it (health checks on /ready) and every
   client request still succeeds (the router's retries, then the clients' own);
3. a replica sent SIGTERM mid-stream: its streams finish normally (finish_reason "length", no
   cancellation) while new requests, answered 503 there, go to the others; it exits 0;
4. the same kill and drain behind HAProxy, health-checking /ready and retrying on 503.

Replicas listen on 127.0.0.2, .3 and .4 (single-thread each), the routers on 127.0.0.1. Every loop
is bounded by a count and every wait by a deadline; the script stops everything it started.

    python3 tools/fleet/fleet_test.py --rill target/release/rill --router-python VENV/bin/python

Needs: the model (`rill pull smollm2-135m`), sglang-router installed in --router-python's
environment, and haproxy on PATH (Debian's package) unless --skip-haproxy. Prints one line per
check and "N passed, N failed" at the end; exits non-zero if any check failed.
"""

import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
PORT = 18100
ROUTER_PORT = 18200
HAPROXY_PORT = 18300

results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def http(method, url, body=None, timeout=120):
    """(status, headers, text); status 0 when the connection failed."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode(errors="replace")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
        return 0, {}, str(e)


def wait_for(what, predicate, deadline_s=120, step_s=0.2):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step_s)
    raise RuntimeError(f"timed out waiting for {what}")


def metrics(host):
    """The replica's Prometheus text as {name{labels}: value}."""
    status, _, text = http("GET", f"http://{host}:{PORT}/metrics", timeout=10)
    if status != 200:
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, value = line.rsplit(" ", 1)
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out


class Replica:
    def __init__(self, rill, model, host, log_dir):
        self.host = host
        self.url = f"http://{host}:{PORT}"
        self.log = open(os.path.join(log_dir, f"rill-{host}.log"), "w")
        self.proc = subprocess.Popen(
            [rill, "serve", "--model", model, "--threads", "1", "--host", host,
             "--port", str(PORT), "--replica-id", host, "--kv-cache-mb", "96",
             "--max-running", "8", "--shutdown-timeout", "120", "--metrics-compat", "vllm"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self):
        return http("GET", self.url + "/ready", timeout=5)[0] == 200

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def start_replicas(args, log_dir):
    replicas = [Replica(args.rill, args.model, h, log_dir) for h in HOSTS]
    wait_for("the replicas to be ready", lambda: all(r.ready() for r in replicas), 300)
    return replicas


def stop_all(replicas):
    for r in replicas:
        r.stop()


class Router:
    """sglang-router in front of the replicas, health-checking /ready every second."""

    def __init__(self, python, policy, log_dir):
        self.url = f"http://127.0.0.1:{ROUTER_PORT}"
        self.log = open(os.path.join(log_dir, f"router-{policy}.log"), "w")
        self.proc = subprocess.Popen(
            [python, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
             "--port", str(ROUTER_PORT), "--policy", policy,
             "--worker-urls", *[f"http://{h}:{PORT}" for h in HOSTS],
             "--health-check-endpoint", "/ready", "--health-check-interval-secs", "1",
             "--health-failure-threshold", "1", "--health-success-threshold", "1",
             "--prometheus-port", str(ROUTER_PORT + 1), "--prometheus-host", "127.0.0.1",
             "--log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT)

        def registered():
            s, _, t = http("GET", self.url + "/workers", timeout=5)
            if s != 200:
                return False
            return t.count(f":{PORT}") >= len(HOSTS)
        wait_for("the router to register the replicas", registered, 120)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class HAProxy:
    def __init__(self, log_dir):
        self.url = f"http://127.0.0.1:{HAPROXY_PORT}"
        cfg = os.path.join(log_dir, "haproxy.cfg")
        servers = "\n".join(
            f"    server r{i} {h}:{PORT} check inter 300ms fall 1 rise 2" for i, h in enumerate(HOSTS))
        with open(cfg, "w") as f:
            f.write(f"""global
    maxconn 2000
defaults
    mode http
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response 503
    option http-buffer-request
frontend api
    bind 127.0.0.1:{HAPROXY_PORT}
    default_backend rill
backend rill
    balance leastconn
    option httpchk GET /ready
    http-check expect status 200
{servers}
""")
        self.log = open(os.path.join(log_dir, "haproxy.log"), "w")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", cfg], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        wait_for("haproxy", lambda: http("GET", self.url + "/health", timeout=5)[0] == 200, 30)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()
        self.log.close()


def chat(base, messages, max_tokens, retries=3):
    """A non-streamed chat request with the client's own retries; (ok, attempts, last status)."""
    status = 0
    for attempt in range(1, retries + 2):
        status, _, text = http("POST", base + "/v1/chat/completions",
                               {"messages": messages, "max_tokens": max_tokens,
                                "temperature": 0}, timeout=300)
        if status == 200 and json.loads(text)["choices"][0]["finish_reason"] in ("stop", "length"):
            return True, attempt, status
        time.sleep(0.5 * attempt)
    return False, retries + 1, status


def stream(base, messages, max_tokens):
    """A streamed chat request: (finish_reason, saw [DONE], error)."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    finish, done = None, False
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                for c in chunk.get("choices", []):
                    finish = c.get("finish_reason") or finish
        return finish, done, None
    except Exception as e:  # noqa: BLE001 - a broken stream is a result here
        return finish, done, str(e)


def prefix_totals(replicas):
    hits = queries = 0.0
    for r in replicas:
        m = metrics(r.host) or {}
        hits += m.get("rill_prefix_cache_hits_total", 0.0)
        queries += m.get("rill_prefix_cache_queries_total", 0.0)
    return hits, queries


WORDS = ("river stone lantern orchard copper meadow harbor violet thunder cedar glacier ember "
         "falcon quartz willow canyon saffron tundra beacon marble").split()


def document(seed, words=220):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def shared_prefix_workload(router, replicas, seed, docs=6, questions=5, concurrency=3):
    """Every document asked `questions` questions, in a shuffled order; the hit ratio of the
    prompt tokens this workload looked up, from the replicas' counters."""
    jobs = [(d, q) for d in range(docs) for q in range(questions)]
    random.Random(seed).shuffle(jobs)
    h0, q0 = prefix_totals(replicas)

    def one(job):
        d, q = job
        messages = [{"role": "system", "content": "Read this document. " + document(seed * 100 + d)},
                    {"role": "user", "content": f"Question {q}: which word comes first?"}]
        return chat(router.url, messages, 4)[0]
    with cf.ThreadPoolExecutor(concurrency) as pool:
        ok = all(pool.map(one, jobs))
    h1, q1 = prefix_totals(replicas)
    return ok, (h1 - h0) / max(q1 - q0, 1.0)


def kill_mid_load(front, replicas, label, requests=24, concurrency=6):
    """SIGKILLs the last replica once a few requests have finished; every request must succeed."""
    victim = replicas[-1]
    done = []

    def one(i):
        messages = [{"role": "user", "content": f"Count to five, take {i}."}]
        result = chat(front.url, messages, 24)
        done.append(result)
        return result
    with cf.ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(one, i) for i in range(requests)]
        wait_for("a few requests to finish", lambda: len(done) >= 4, 300, 0.05)
        victim.proc.kill()
        victim.proc.wait()
        results_ = [f.result() for f in futures]
    failed = [r for r in results_ if not r[0]]
    retried = sum(1 for r in results_ if r[1] > 1)
    check(f"{label}: every request succeeds though a replica was SIGKILLed mid-load",
          not failed, f"{len(results_) - len(failed)}/{len(results_)} ok, {retried} needed a client retry")
    # Afterwards the dead replica gets nothing: all of a new batch succeed at the first attempt.
    after = [chat(front.url, [{"role": "user", "content": f"Say hi {i}."}], 4, retries=0)
             for i in range(6)]
    check(f"{label}: after the kill, requests go to the live replicas at once",
          all(ok and attempts == 1 for ok, attempts, _ in after),
          f"{sum(1 for a in after if a[0])}/6 first-attempt successes")


def drain_mid_stream(front, replicas, label, streams=6):
    """Streams spread over the replicas; SIGTERM one that is running some; its streams finish
    normally while new requests succeed on the others; it exits 0."""
    victim = replicas[1]
    with cf.ThreadPoolExecutor(streams + 4) as pool:
        futures = [pool.submit(stream, front.url,
                               [{"role": "user", "content": f"Tell a long story, part {i}."}], 160)
                   for i in range(streams)]

        def all_admitted():
            return sum((metrics(r.host) or {}).get("rill_requests_submitted_total", 0)
                       for r in replicas) >= streams
        # Every stream has reached its replica (so none arrives at the victim after the count).
        wait_for("every stream to be admitted", all_admitted, 300, 0.05)

        def victim_busy():
            m = metrics(victim.host) or {}
            return m.get("rill_requests_running", 0) >= 1
        wait_for("the victim to run a stream", victim_busy, 300, 0.05)
        running_before = (metrics(victim.host) or {}).get("rill_requests_running", 0)
        submitted_before = (metrics(victim.host) or {}).get("rill_requests_submitted_total", 0)
        victim.proc.send_signal(signal.SIGTERM)
        wait_for("the victim to turn unready",
                 lambda: http("GET", victim.url + "/ready", timeout=5)[0] in (0, 503), 60, 0.05)
        # New work while it drains: all of it succeeds (elsewhere).
        new = list(pool.map(lambda i: chat(front.url, [{"role": "user", "content": f"Hello {i}"}], 4),
                            range(6)))
        m = metrics(victim.host) or {}
        outcomes = [f.result() for f in futures]
    code = victim.proc.wait(300)
    check(f"{label}: the draining replica had streams running when SIGTERM came",
          running_before >= 1, f"{running_before:.0f} running")
    check(f"{label}: every stream finished normally (none cancelled or cut)",
          all(f == "length" and d and e is None for f, d, e in outcomes),
          ", ".join(f"{f}{'' if d else ' no [DONE]'}{' ' + e if e else ''}" for f, d, e in outcomes))
    check(f"{label}: new requests during the drain all succeeded",
          all(ok for ok, _, _ in new), f"{sum(1 for n in new if n[0])}/6")
    if m:
        refused = m.get('rill_requests_rejected_total{reason="shutting_down"}', 0)
        check(f"{label}: the draining replica admitted no new request",
              m.get("rill_requests_submitted_total", 0) == submitted_before,
              f"{refused:.0f} refused with 503")
    check(f"{label}: the drained replica exited 0", code == 0, f"exit code {code}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rill", default="target/release/rill")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--router-python", default=sys.executable)
    ap.add_argument("--skip-haproxy", action="store_true")
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args()
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="rill-fleet-")
    os.makedirs(log_dir, exist_ok=True)
    print(f"logs in {log_dir}", flush=True)
    replicas, front = [], None
    t0 = time.monotonic()
    try:
        # 1. Prefix-aware routing against round robin (fresh replicas for each).
        ratios = {}
        for seed, policy in enumerate(["round_robin", "cache_aware"], start=1):
            replicas = start_replicas(args, log_dir)
            front = Router(args.router_python, policy, log_dir)
            ok, ratios[policy] = shared_prefix_workload(front, replicas, seed)
            check(f"sglang-router {policy}: the shared-prefix workload succeeds", ok,
                  f"prefix-cache hit ratio {ratios[policy]:.3f}")
            front.stop()
            stop_all(replicas)
        check("cache_aware gets a higher prefix-cache hit ratio than round_robin",
              ratios["cache_aware"] > ratios["round_robin"],
              f"{ratios['cache_aware']:.3f} vs {ratios['round_robin']:.3f}")

        # 2 and 3. Kill and drain behind each front.
        fronts = [("sglang-router", lambda: Router(args.router_python, "round_robin", log_dir))]
        if not args.skip_haproxy:
            fronts.append(("haproxy", lambda: HAProxy(log_dir)))
        for label, make in fronts:
            replicas = start_replicas(args, log_dir)
            front = make()
            kill_mid_load(front, replicas, label)
            front.stop()
            stop_all(replicas)
            replicas = start_replicas(args, log_dir)
            front = make()
            drain_mid_stream(front, replicas, label)
            front.stop()
            stop_all(replicas)
    except Exception as e:  # noqa: BLE001
        check("the fleet run completed", False, repr(e))
    finally:
        if front is not None:
            front.stop()
        stop_all(replicas)
    print(f"fleet run took {time.monotonic() - t0:.0f} s", flush=True)
    print(f"{results['passed']} passed, {results['failed']} failed", flush=True)
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
