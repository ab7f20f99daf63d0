"""Regenerates the reference data of tests/data/reference/ from independent implementations:
HF transformers (logits, log-probs, greedy tokens), llama.cpp's llama-tokenize (token ids, checked
against HF's tokenizer) and the gguf Python package (dequantization). See README.md beside this file.

usage: python generate.py [--out DIR] [--smollm2 GGUF] [--gemma3 GGUF] [--llama-tokenize BIN]
                          [--only PART ...] [--threads N]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import HERE, MODELS, default_gguf, load_json

REPO = HERE.parent.parent
PARTS = ("dequant", "tokenization", "logits")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def llama_tokenize_binary(arg: str | None) -> Path:
    """--llama-tokenize, else the cached build (built by build-llama-tokenize.sh if missing)."""
    if arg:
        return Path(arg)
    out = subprocess.run(["bash", str(HERE / "build-llama-tokenize.sh")], check=True, stdout=subprocess.PIPE)
    return Path(out.stdout.decode().strip().splitlines()[-1])


def check_gguf(model, path: Path, verify: bool) -> Path:
    if not path.is_file():
        raise SystemExit(
            f"{path}: missing. Run `rill pull`, or `python {HERE / 'fetch_models.py'}`, or pass --{model.key} PATH"
        )
    if verify:
        got = sha256(path)
        if got != model.sha256:
            raise SystemExit(f"{path}: sha256 {got}, expected {model.sha256} (--no-verify to use it anyway)")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "data" / "reference")
    for m in MODELS:
        ap.add_argument(f"--{m.key}", type=Path, default=None, help=f"{m.file} (default: {default_gguf(m)})")
    ap.add_argument("--llama-tokenize", default=None, help="llama-tokenize binary (default: build/cache it)")
    ap.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    ap.add_argument("--no-verify", action="store_true", help="skip the GGUFs' sha256 check")
    args = ap.parse_args()

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    notes: list[str] = []

    # Inputs committed beside the scripts: copied as they are.
    shutil.copyfile(HERE / "prompts.json", out / "prompts.json")
    shutil.copyfile(HERE / "data-README.md", out / "README.md")
    prompts = load_json(HERE / "prompts.json")

    if "dequant" in args.only:
        from dequant import write_random_dequant

        write_random_dequant(out)
        log("dequant/: written")

    ggufs = {m.key: check_gguf(m, getattr(args, m.key) or default_gguf(m), not args.no_verify) for m in MODELS}

    if "dequant" in args.only:
        from dequant import write_model_dequant

        for m in MODELS:
            write_model_dequant(m, ggufs[m.key], out)
            log(f"{m.folder}/dequant.json: written")

    if not {"tokenization", "logits"} & set(args.only):
        return
    import torch

    torch.set_num_threads(args.threads)
    from tokenization import LlamaTokenize, hf_tokenizer, prompt_ids, write_tokenization

    binary = llama_tokenize_binary(args.llama_tokenize)
    log(f"llama-tokenize: {binary}")
    for m in MODELS:
        gguf = ggufs[m.key]
        llama = LlamaTokenize(binary, gguf)
        tok = hf_tokenizer(gguf)
        if "tokenization" in args.only:
            notes += write_tokenization(m, llama, tok, out)
            log(f"{m.folder}/tokenization.json: written")
        if "logits" in args.only:
            from logits import write_reference

            cases = []
            for p in prompts:
                ids, note = prompt_ids(m, llama, tok, p["text"])
                if note:
                    notes.append(note)
                cases.append({"id": p["id"], "text": p["text"], "token_ids": ids})
            write_reference(m, gguf, cases, tok, out, log=log)
            log(f"{m.folder}/reference.json: written")

    log(f"done in {time.time() - t0:.0f} s")
    if notes:
        log("llama.cpp and HF transformers tokenizers DISAGREE on:")
        for n in notes:
            log(f"  {n}")
    else:
        log("llama.cpp and HF transformers tokenizers agree on every text and prompt")


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
