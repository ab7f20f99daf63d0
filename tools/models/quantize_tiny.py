"""Quantized tiny models (`tests/data/tiny-quant/<TYPE>/`): the `qwen2-q256` spec converted by
`make_tiny.py`, then quantized to every type by llama.cpp's own `llama-quantize` (`--pure`: every
matrix in that type, with an importance matrix from llama.cpp's `llama-imatrix`, which the 1- and
2-bit i-quants require), with

- references from transformers in f32 on gguf-py's dequantization of the quantized file
  (transformers loads the GGUF itself and dequantizes it with gguf-py; checked bit for bit here);
- llama.cpp's own next-token distribution at the last position of every prompt (`llama-server`,
  `n_probs` = the whole vocabulary), and its KL divergence from the reference, so that rill's fast
  path can be compared with llama.cpp's on the same file and prompts (`llama_cpp.json`).

    LLAMA_BIN=~/.cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp/build/bin \\
      nice -n 10 /root/refvenv/bin/python tools/models/quantize_tiny.py

`LLAMA_BIN` holds `llama-quantize`, `llama-imatrix` and `llama-server` (`../shared/bench/setup-llamacpp.sh`
builds the first and the last; add `--target llama-imatrix`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(REPO / "tools/reference"))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import write_json  # noqa: E402
from make_tiny import prompt_cases, reference  # noqa: E402

BASE_SPEC = "qwen2-q256"
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
         "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0",
         "MXFP4")
# llama-quantize's file type whose matrices are of the type (its IQ2_S file type stores IQ2_XS; with
# --pure, MXFP4_MOE's default type MXFP4 goes to every matrix, not only experts).
FTYPE = {"IQ2_S": "IQ2_M", "MXFP4": "MXFP4_MOE"}
NEED_IMATRIX = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M")
# Quantized without the importance matrix: ggml's MXFP4 quantizer takes none (it ignores one).
NO_IMATRIX = ("MXFP4",)
REFERENCE_NOTE = ("transformers f32 on gguf-py's dequantization of this quantized file (transformers "
                  "loads the GGUF and dequantizes it with gguf-py)")
# Calibration text for the importance matrix: byte-level tokens, any text works.
CALIBRATION = (REPO / "tools/models/README.md").read_text() * 2


def run(cmd: list[str], log: Path) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log.write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        sys.stderr.write(res.stdout[-2000:] + res.stderr[-2000:])
        raise SystemExit(f"{cmd[0]} failed (rc {res.returncode}), log: {log}")


def check_weights(model, gguf_path: Path) -> None:
    """transformers' weights are gguf-py's dequantization, bit for bit (two matrices)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    for name, param in (("blk.0.attn_q.weight", model.model.layers[0].self_attn.q_proj.weight),
                        ("blk.1.ffn_down.weight", model.model.layers[1].mlp.down_proj.weight)):
        t = tensors[name]
        want = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(param.shape)
        got = param.detach().numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


def check_types(gguf_path: Path, ty: str) -> None:
    """Every layer matrix of the file is of type `ty`."""
    from gguf import GGUFReader

    for t in GGUFReader(gguf_path).tensors:
        if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2:
            got = t.tensor_type.name
            assert got == ty, f"{gguf_path}: {t.name} is {got}, not {ty}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_cpp_distributions(server: Path, gguf_path: Path, cases: list[dict], vocab: int, log: Path) -> dict:
    """llama.cpp's next-token probabilities after each prompt: {case id: [p_0 .. p_vocab-1]}."""
    port = free_port()
    proc = subprocess.Popen([str(server), "-m", str(gguf_path), "--port", str(port), "-t", "1", "-c", "256",
                             "-np", "1", "--no-warmup"], stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(base + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.1)
        # The server reports probabilities only with a token whose text is complete UTF-8: every token
        # but "a" is banned from being *chosen* (logit_bias applies in the sampler chain; the reported
        # probabilities are the softmax of the raw logits, before it).
        req = urllib.request.Request(base + "/tokenize", json.dumps({"content": "a"}).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            (a_id,) = json.load(r)["tokens"]
        bias = [[i, False] for i in range(vocab) if i != a_id]
        out = {}
        for case in cases:
            body = json.dumps({"prompt": case["token_ids"], "n_predict": 1, "n_probs": vocab,
                               "temperature": 0, "cache_prompt": False, "logit_bias": bias,
                               "post_sampling_probs": False}).encode()
            req = urllib.request.Request(base + "/completion", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                doc = json.load(r)
            top = doc["completion_probabilities"][0]["top_logprobs"]
            p = np.zeros(vocab, dtype=np.float64)
            for entry in top:
                p[entry["id"]] = np.exp(entry["logprob"])
            out[case["id"]] = {"probs": p, "returned": len(top)}
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def kl(p_ref: np.ndarray, q: np.ndarray) -> float:
    """KL(p_ref || q) in nats; q's zero entries (below what llama.cpp reports) are floored."""
    q = np.maximum(q, 1e-30)
    m = p_ref > 0
    return float(np.sum(p_ref[m] * (np.log(p_ref[m]) - np.log(q[m]))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "tests/data/tiny-quant")
    ap.add_argument("--bin", type=Path, default=Path(os.environ.get("LLAMA_BIN", "")))
    ap.add_argument("--only", nargs="+", choices=TYPES)
    args = ap.parse_args()
    imatrix_needed = any(ty not in NO_IMATRIX for ty in args.only or TYPES)
    for tool in ("llama-quantize", "llama-server") + (("llama-imatrix",) if imatrix_needed else ()):
        if not (args.bin / tool).is_file():
            raise SystemExit(f"{tool} not in --bin / $LLAMA_BIN ({args.bin})")
    from transformers import AutoModelForCausalLM

    cases = prompt_cases()
    work = Path(tempfile.mkdtemp(prefix="tiny-quant-"))
    run([sys.executable, str(HERE / "make_tiny.py"), "--only", BASE_SPEC, "--out", str(work)], work / "make_tiny.log")
    base = work / BASE_SPEC / "model.gguf"
    calib = work / "calibration.txt"
    calib.write_text(CALIBRATION)
    imatrix = work / "imatrix.gguf"
    if imatrix_needed:
        run([str(args.bin / "llama-imatrix"), "-m", str(base), "-f", str(calib), "-o", str(imatrix), "-c",
             "128", "-t", "1", "--no-ppl"], work / "imatrix.log")
    vocab = json.loads((work / BASE_SPEC / "spec.json").read_text())["tokenizer"]["vocab_size"]
    summary = {}
    for ty in args.only or TYPES:
        folder = args.out / ty
        folder.mkdir(parents=True, exist_ok=True)
        gguf_path = folder / "model.gguf"
        # The 1- and 2-bit i-quants need an importance matrix, which covers the layers' matrices only:
        # their token embedding and output matrix are Q4_K, as in llama.cpp's own mixes of them.
        edges = ["--token-embedding-type", "Q4_K", "--output-tensor-type", "Q4_K"] if ty in NEED_IMATRIX else []
        with_imatrix = [] if ty in NO_IMATRIX else ["--imatrix", str(imatrix)]
        run([str(args.bin / "llama-quantize"), "--pure", *edges, *with_imatrix, str(base),
             str(gguf_path), FTYPE.get(ty, ty), "1"], work / f"quantize.{ty}.log")
        check_types(gguf_path, ty)
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf_path.name, dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()
        check_weights(model, gguf_path)
        stats = reference(model, cases, folder, gguf_path.name)
        doc = json.loads((folder / "reference.json").read_text())
        doc["reference"] = REFERENCE_NOTE
        write_json(folder / "reference.json", doc, ascii_only=True)

        dists = llama_cpp_distributions(args.bin / "llama-server", gguf_path, cases, vocab, work / f"server.{ty}.log")
        per_case = {}
        for case in cases:
            ref = np.fromfile(folder / f"{case['id']}.last_logits.f32", dtype="<f4").astype(np.float64)
            p_ref = np.exp(ref - ref.max())
            p_ref /= p_ref.sum()
            q = dists[case["id"]]["probs"]
            per_case[case["id"]] = {"kl": kl(p_ref, q), "top1_same": bool(np.argmax(q) == np.argmax(p_ref)),
                                    "probs_returned": dists[case["id"]]["returned"]}
        mean_kl = float(np.mean([c["kl"] for c in per_case.values()]))
        data = gguf_path.read_bytes()
        write_json(folder / "llama_cpp.json", {
            "what": "llama.cpp's next-token distribution at the last prompt position (llama-server /completion, "
                    "n_probs = vocabulary, 1 thread) against the reference: KL(reference || llama.cpp)",
            "llama_cpp_python": "0.3.36",
            "mean_kl": mean_kl,
            "cases": per_case,
        })
        write_json(folder / "spec.json", {
            "base": BASE_SPEC,
            "type": ty,
            "quantized_by": ("llama-quantize --pure MXFP4_MOE (no importance matrix: ggml's MXFP4 quantizer takes none)"
                             if ty in NO_IMATRIX else
                             "llama-quantize --pure --imatrix (imatrix: llama-imatrix -c 128 on tools/models/README.md x2)")
                            + (", token embedding and output Q4_K" if ty in NEED_IMATRIX else ""),
            "reference": REFERENCE_NOTE,
            "transformers": version("transformers"),
            "gguf": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
            "stats": stats,
        })
        summary[ty] = {"size": len(data), "llama_cpp_mean_kl": mean_kl,
                       "mean_top1_prob": stats["mean_top1_prob"], "greedy_min_margin": stats["greedy_min_margin"]}
        print(f"{ty}: {len(data):,} bytes, llama.cpp mean KL {mean_kl:.3g}, greedy min margin "
              f"{stats['greedy_min_margin']}", flush=True)
    # `--only` updates its types' entries and keeps the others'.
    old = args.out / "summary.json"
    merged = json.loads(old.read_text()) if old.is_file() else {}
    merged.update(summary)
    write_json(old, {ty: merged[ty] for ty in TYPES if ty in merged})


if __name__ == "__main__":
    main()
