#!/usr/bin/env python3
"""rill, llama.cpp and ik_llama.cpp on the same files, same threads, in alternating rounds (each
round runs every engine once per file, starting with another engine each round, so drift on the
machine hits all three alike), and one table
with both ratios: the median tokens/s of each engine per test, rill / llama.cpp and rill / ik.

    tools/bench/three_engines.py MODEL.gguf [MODEL.gguf ...]
    env: ROUNDS=3 PP=512 TG=128 THREADS=2 RILL=target/release/rill
         LLAMA_BIN=<folder of llama.cpp's llama-bench> (default: what
         ../shared/bench/setup-llamacpp.sh builds; on AMX CPUs use a build without AMX, see
         docs/performance.md)
         IK_BIN=<folder of ik_llama.cpp's llama-bench> (default ~/.cache/rill-peers/ik_llama/src/
         build/bin; building it: docs/performance.md, "ik_llama.cpp")
         LD_LIBRARY_PATH as each build needs (LLAMA_LIB / IK_LIB are prepended for its runs)
         RILL_BEFORE=<another rill binary> (optional: an earlier build, run in the same rounds,
         with its own column and its ratios to both engines: a before/after table from one run)

ik_llama.cpp runs with `-rtr 1` (its run-time repacking into interleaved rows, how it is fastest
on CPUs). Its `-o json` prints one JSON array per run, not JSON lines; both forms are read.
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUNDS = int(os.environ.get("ROUNDS", "3"))
PP = int(os.environ.get("PP", "512"))
TG = int(os.environ.get("TG", "128"))
THREADS = int(os.environ.get("THREADS", "2"))
RILL = os.environ.get("RILL", "target/release/rill")
RILL_BEFORE = os.environ.get("RILL_BEFORE")


def llama_bin() -> Path:
    if os.environ.get("LLAMA_BIN"):
        return Path(os.environ["LLAMA_BIN"])
    out = subprocess.run([str(HERE / "../../../shared/bench/setup-llamacpp.sh")],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


IK_BIN = Path(os.environ.get("IK_BIN", Path.home() / ".cache/rill-peers/ik_llama/src/build/bin"))


def env_with(lib: str | None) -> dict:
    env = dict(os.environ)
    if lib:
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def json_objects(text: str) -> list[dict]:
    """Every JSON object printed: JSON lines, or whole JSON arrays (ik's `-o json`)."""
    out, dec, i = [], json.JSONDecoder(), 0
    while i < len(text):
        if text[i] in "[{":
            try:
                v, end = dec.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            out.extend(v if isinstance(v, list) else [v])
            i = end
        else:
            i += 1
    return [o for o in out if isinstance(o, dict)]


def rill(model: str, binary: str = RILL) -> dict[str, float]:
    out = subprocess.run([binary, "bench", "--model", model, "--threads", str(THREADS), "-p", str(PP),
                          "-n", str(TG), "-r", "1", "--json"], capture_output=True, text=True, check=True)
    return {o["test"]: o["tokens_per_s"] for o in json_objects(out.stdout)}


def llama_bench(binary: Path, model: str, extra: list[str], lib: str | None) -> dict[str, float]:
    out = subprocess.run([str(binary / "llama-bench"), "-m", model, "-t", str(THREADS), "-p", str(PP),
                          "-n", str(TG), "-r", "1", "-o", "json", *extra],
                         capture_output=True, text=True, env=env_with(lib), check=True)
    res = {}
    for o in json_objects(out.stdout):
        test = f"pp{o['n_prompt']}" if o.get("n_prompt") else f"tg{o['n_gen']}"
        res[test] = o["avg_ts"]
    return res


def main() -> None:
    models = sys.argv[1:]
    if not models:
        sys.exit(__doc__)
    llama = llama_bin()
    engines = {
        "rill": rill,
        **({"rill before": lambda m: rill(m, RILL_BEFORE)} if RILL_BEFORE else {}),
        "llama.cpp": lambda m: llama_bench(llama, m, [], os.environ.get("LLAMA_LIB")),
        "ik_llama": lambda m: llama_bench(IK_BIN, m, ["-rtr", "1"], os.environ.get("IK_LIB")),
    }
    runs: dict[tuple[str, str, str], list[float]] = {}
    order = list(engines.items())
    for r in range(ROUNDS):
        for model in models:
            # Each round starts with another engine: none always runs right after the same one.
            for name, run in order[r % len(order):] + order[:r % len(order)]:
                for test, ts in run(model).items():
                    runs.setdefault((Path(model).name, test, name), []).append(ts)
        print(f"round {r + 1} of {ROUNDS} done", file=sys.stderr)
    print(f"{THREADS} threads, {ROUNDS} alternating rounds, median tokens/s")
    names = {"rill": "rill", "rill before": "rill (before)", "llama.cpp": "llama.cpp",
             "ik_llama": "ik_llama.cpp -rtr 1"}
    ratios = [(a, b) for a in ("rill", "rill before") if a in engines for b in ("llama.cpp", "ik_llama")]
    header = [names[e] for e in engines] + [f"{names[a]} / {names[b]}" for a, b in ratios]
    print("| model | test | " + " | ".join(header) + " |")
    print("|---|---|" + "---|" * len(header))
    for model in models:
        name = Path(model).name
        for test in sorted({t for (m, t, _) in runs if m == name}, key=lambda t: (t[:2] != "pp", t)):
            med = {e: statistics.median(runs[(name, test, e)]) for e in engines if (name, test, e) in runs}
            ratio = lambda a, b: f"{med[a] / med[b]:.2f}x" if a in med and b in med else "-"
            cells = [f"{med[e]:.1f}" if e in med else "-" for e in engines]
            cells += [ratio(a, b) for a, b in ratios]
            print(f"| {name} | {test} | " + " | ".join(cells) + " |")

if __name__ == "__main__":
    main()
