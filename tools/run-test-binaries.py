#!/usr/bin/env python3
"""Runs the already-built test binaries of some workspace packages, as `cargo test` would (each in
its package's directory), without building anything: the kernel-path legs of .ci/run use it, so
that a leg runs exactly the binaries of the suite's own build (a `cargo test -p ...` would resolve
the packages' features apart from the workspace's and rebuild their dependencies first).

    tools/run-test-binaries.py PACKAGE... [-- TEST-ARGS...]

Prints each binary's summary and one total; exits non-zero when a binary fails or crashes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def executables(packages: set[str]) -> list[tuple[str, str, Path, Path]]:
    """(package, target, executable, package directory) of every test binary of `packages`, from
    the build's record."""
    out = subprocess.run(
        ["cargo", "test", "--release", "--workspace", "--no-run", "--message-format=json"],
        check=True, capture_output=True, text=True,
    ).stdout
    found = []
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        name = msg["target"]["name"]
        pkg = next((p for p in packages if msg["manifest_path"].endswith(f"/{p}/Cargo.toml")), None)
        if pkg is None:
            continue
        found.append((pkg, name, Path(msg["executable"]), Path(msg["manifest_path"]).parent))
    return sorted(found, key=lambda f: (f[0], f[1]))


def main() -> int:
    args = sys.argv[1:]
    extra: list[str] = []
    if "--" in args:
        i = args.index("--")
        args, extra = args[:i], args[i + 1:]
    if not args:
        print(__doc__)
        return 2
    binaries = executables(set(args))
    missing = set(args) - {b[0] for b in binaries}
    if missing:
        print(f"no test binaries for {sorted(missing)}")
        return 2
    passed = failed = 0
    bad = []
    for package, name, exe, cwd in binaries:
        run = subprocess.run([str(exe), *extra], cwd=cwd, capture_output=True, text=True)
        text = run.stdout + run.stderr
        result = re.findall(r"^test result: \w+\. (\d+) passed; (\d+) failed", text, re.M)
        custom = re.findall(r"^(\d+) passed, (\d+) failed$", text, re.M)
        p = sum(int(a) for a, _ in result + custom)
        f = sum(int(b) for _, b in result + custom)
        if run.returncode != 0 and f == 0:
            f = 1  # crashed
        passed, failed = passed + p, failed + f
        print(f"{package} {name}: {p} passed, {f} failed")
        if run.returncode != 0:
            bad.append(name)
            print(text[-6000:])
    print(f"{passed} passed, {failed} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
