#!/usr/bin/env python3
"""Picks the JSONSchemaBench (MaskBench) subset that rill's replay test runs.

usage: python3 tools/constrain/maskbench_subset.py MASKBENCH_DATA_DIR [--count 300]

MASKBENCH_DATA_DIR is `maskbench/data` of github.com/guidance-ai/jsonschemabench (one JSON file
per schema: {"description", "meta", "schema", "tests": [{"description", "valid", "data"}]}).
Writes tests/data/maskbench/subset.json: every k-th file (sorted by name) that has tests and
whose schema is under 16 kB, until --count schemas, so every source (BFCL, Github, Glaive,
Kubernetes, Snowplow, WashingtonPost, JsonSchemaStore, ...) is represented in its share. Each
instance is stored as the text the replay feeds the matcher: json.dumps with Python's default
separators (", " and ": ", the layout rill generates) and raw UTF-8.
"""

import argparse
import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=pathlib.Path)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--max-schema-bytes", type=int, default=16_000)
    args = ap.parse_args()
    files = sorted(p for p in args.data.glob("*.json"))
    usable = []
    for p in files:
        doc = json.loads(p.read_text())
        if not doc.get("tests"):
            continue
        if len(json.dumps(doc["schema"])) > args.max_schema_bytes:
            continue
        usable.append((p.name, doc))
    step = max(1, len(usable) // args.count)
    picked = usable[::step][: args.count]
    out = []
    for name, doc in picked:
        out.append(
            {
                "file": name,
                "schema": doc["schema"],
                "tests": [
                    {
                        "valid": t["valid"],
                        "text": json.dumps(t["data"], ensure_ascii=False),
                    }
                    for t in doc["tests"]
                ],
            }
        )
    dest = REPO / "tests" / "data" / "maskbench" / "subset.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(
        json.dumps(
            {
                "source": "github.com/guidance-ai/jsonschemabench maskbench/data",
                "generator": "tools/constrain/maskbench_subset.py",
                "usable_files": len(usable),
                "schemas": out,
            },
            ensure_ascii=False,
        )
    )
    n_tests = sum(len(s["tests"]) for s in out)
    print(f"{len(out)} schemas, {n_tests} instances -> {dest} ({dest.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
