"""More prompts for comparing the fast path's fidelity with llama.cpp's on every quantized tiny model
(`tests/data/tiny-quant/<TYPE>/`, made by `quantize_tiny.py`).

Four prompts cannot rank two engines: a prompt's last-position KL against the reference spans two
orders of magnitude on these random models (0.0002 to 0.1), so the mean of four moves by tens of
percent with the choice of prompts. This script adds `N` (default 96) random prompts per type, the
same for every type, lengths spread over 2..200 (the model's context is 256):

- the reference's last-position logits, transformers in f32 on gguf-py's dequantization of the
  committed `model.gguf` (checked bit for bit on two matrices, as in `quantize_tiny.py`);
- llama.cpp's next-token distribution after each prompt (`llama-server`, `n_probs` = vocabulary,
  1 thread, as in `quantize_tiny.py`) and its KL from the reference.

Writes `kl_cases.json` (the prompts, llama.cpp's KL and top-1 agreement per prompt) and
`kl_cases.last_logits.f32` (the reference logits, prompt after prompt, little-endian f32) into
each type's folder. `crates/rill-model/tests/tiny_quantized.rs` runs the fast path on the same
prompts and compares the two engines prompt by prompt (paired).

    LLAMA_BIN=~/.cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp/build/bin \\
      nice -n 10 /root/refvenv/bin/python tools/models/kl_cases.py [--spec qwen35-q256] [--only Q4_K ...]

`--spec` as in `quantize_tiny.py`: the hybrids' folders `<spec>-<TYPE>/` (default types Q8_0, Q4_0,
Q4_K), their references through `quantize_tiny.load_dequantized` (gguf-py's dequantization, every
tensor checked bit for bit).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tools/reference"))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import write_json  # noqa: E402
from quantize_tiny import (BASE_SPEC, HYBRID_SPECS, HYBRID_TYPES, TYPES, folder_name, kl,  # noqa: E402
                           llama_cpp_distributions, load_reference_model)
from tokenizer import N_ORDINARY  # noqa: E402

SEED = 20261127
MIN_LEN, MAX_LEN = 2, 200


def kl_prompts(n: int) -> list[dict]:
    rng = np.random.default_rng(SEED)
    lengths = rng.integers(MIN_LEN, MAX_LEN + 1, n)
    return [{"id": f"kl{i:03}", "token_ids": [int(x) for x in rng.integers(0, N_ORDINARY, int(m))]}
            for i, m in enumerate(lengths)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=REPO / "tests/data/tiny-quant")
    ap.add_argument("--bin", type=Path, default=Path(os.environ.get("LLAMA_BIN", "")))
    ap.add_argument("--spec", default=BASE_SPEC, choices=(BASE_SPEC, *HYBRID_SPECS))
    ap.add_argument("--only", nargs="+", choices=TYPES)
    ap.add_argument("-n", type=int, default=96)
    args = ap.parse_args()
    server = args.bin / "llama-server"
    if not server.is_file():
        raise SystemExit(f"llama-server not in --bin / $LLAMA_BIN ({args.bin})")
    torch.set_num_threads(1)
    cases = kl_prompts(args.n)
    work = Path(tempfile.mkdtemp(prefix="kl-cases-"))
    for ty in args.only or (TYPES if args.spec == BASE_SPEC else HYBRID_TYPES):
        folder = args.dir / folder_name(args.spec, ty)
        gguf_path = folder / "model.gguf"
        model = load_reference_model(args.spec, gguf_path)
        vocab = model.config.vocab_size
        refs = []
        with torch.no_grad():
            for case in cases:
                out = model(input_ids=torch.tensor([case["token_ids"]]))
                refs.append(out.logits[0, -1].float().numpy().astype("<f4"))
        dists = llama_cpp_distributions(server, gguf_path, cases, vocab, work / f"server.{ty}.log")
        doc_cases = []
        for case, ref in zip(cases, refs):
            x = ref.astype(np.float64)
            p_ref = np.exp(x - x.max())
            p_ref /= p_ref.sum()
            q = dists[case["id"]]["probs"]
            doc_cases.append({"id": case["id"], "token_ids": case["token_ids"], "llama_cpp_kl": kl(p_ref, q),
                              "llama_cpp_top1_same": bool(np.argmax(q) == np.argmax(p_ref)),
                              "llama_cpp_probs_returned": dists[case["id"]]["returned"]})
        np.concatenate(refs).tofile(folder / "kl_cases.last_logits.f32")
        kls = [c["llama_cpp_kl"] for c in doc_cases]
        write_json(folder / "kl_cases.json", {
            "what": "random prompts for a paired fidelity comparison: the reference's last-position logits "
                    "(kl_cases.last_logits.f32, transformers f32 on gguf-py's dequantization of model.gguf) and "
                    "llama.cpp's KL(reference || llama.cpp) there (llama-server /completion, n_probs = "
                    "vocabulary, 1 thread)",
            "generator": "tools/models/kl_cases.py" + ("" if args.spec == BASE_SPEC else f" --spec {args.spec}"),
            "seed": SEED,
            "vocab": vocab,
            "llama_cpp_python": "0.3.36",
            "llama_cpp_mean_kl": float(np.mean(kls)),
            "cases": doc_cases,
        })
        print(f"{folder.name}: llama.cpp mean KL {np.mean(kls):.5f} over {len(kls)} prompts, top-1 "
              f"{np.mean([c['llama_cpp_top1_same'] for c in doc_cases]):.3f}", flush=True)


if __name__ == "__main__":
    main()
