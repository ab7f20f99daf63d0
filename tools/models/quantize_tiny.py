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
      nice -n 10 /root/refvenv/bin/python tools/models/quantize_tiny.py [--spec qwen35-q256] [--only Q4_K ...]

`--spec qwen35-q256` / `--spec lfm2-q256` (the hybrids; default types Q8_0, Q4_0, Q4_K, any of the
list with `--only`) write `tests/data/tiny-quant/<spec>-<TYPE>/`. transformers cannot load those
through gguf-py (its GGUF loader for them is a separate one with its own dequantization code), so
their references run on the spec's HF class with gguf-py's dequantization of every tensor of the file
loaded as its weights, the converter's transformations undone (`gguf_info.hf_from_gguf`) and checked
bit for bit for every tensor (`gguf_info.expected_tensors` of the loaded weights == the dequantized
file); the same loader on the F32 file reproduces make_tiny's reference logits (checked), and
transformers' own GGUF loader is run as a second path (its largest logit difference goes to spec.json).

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
from make_tiny import check_gguf_load, prompt_cases, reference  # noqa: E402

import gguf_info  # noqa: E402
from specs import SPECS, make_config  # noqa: E402

BASE_SPEC = "qwen2-q256"
# the hybrids' quantized bases (`--spec`): folders <spec>-<TYPE>, references through hf_from_gguf
HYBRID_SPECS = ("qwen35-q256", "lfm2-q256", "gemma4-q256")
HYBRID_TYPES = ("Q8_0", "Q4_0", "Q4_K")
# 2-D tensors llama-quantize never quantizes (its tensor_allows_quantization): the conv kernels
KEPT_F32 = ("ssm_conv1d.weight", "shortconv.conv.weight")
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
HYBRID_REFERENCE_NOTE = ("transformers f32 (the spec's HF class and config, eager) with gguf-py's dequantization "
                         "of every tensor of this quantized file as its weights, the converter's transformations "
                         "undone (tools/models/gguf_info.py hf_from_gguf; checked bit for bit: expected_tensors "
                         "of the loaded weights == the dequantized file)")
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
    """Every layer matrix of the file is of type `ty` (the conv kernels, which llama-quantize never
    quantizes, F32)."""
    from gguf import GGUFReader

    for t in GGUFReader(gguf_path).tensors:
        if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2:
            got = t.tensor_type.name
            want = "F32" if t.name.endswith(KEPT_F32) else ty
            assert got == want, f"{gguf_path}: {t.name} is {got}, not {want}"


def folder_name(spec: str, ty: str) -> str:
    return ty if spec == BASE_SPEC else f"{spec}-{ty}"


def dequantized_tensors(gguf_path: Path) -> dict:
    """GGUF tensor name -> gguf-py's dequantization (float32, row-major: ne reversed)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    out = {}
    for t in GGUFReader(gguf_path).tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        out[t.name] = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    return out


def load_dequantized(spec_name: str, gguf_path: Path):
    """The spec's HF model with gguf-py's dequantization of every tensor of the file as its weights
    (gguf_info.hf_from_gguf), checked: the converter's mapping of the loaded weights
    (gguf_info.expected_tensors) is the dequantized file, bit for bit, tensor for tensor."""
    import transformers

    spec = next(s for s in SPECS if s.name == spec_name)
    config = make_config(spec)
    config._attn_implementation = "eager"
    torch.manual_seed(spec.seed)
    model = getattr(transformers, spec.arch)(config).to(torch.float32)
    arrays = dequantized_tensors(gguf_path)
    state = gguf_info.hf_from_gguf(arrays, model.config, list(model.state_dict()))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    model.eval()
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    want = gguf_info.expected_tensors(model.state_dict(), model.config)
    # the rope factors the converter computes from the config (gemma4's rope_freqs) are no HF weight
    computed = {"rope_freqs.weight"} & set(arrays) - set(want)
    assert set(want) == set(arrays) - computed, (sorted(set(want) ^ set(arrays)))
    for name, w in want.items():
        got = arrays[name]
        assert got.shape == w.shape and np.array_equal(got.view(np.uint32), np.ascontiguousarray(w).view(
            np.uint32)), f"{gguf_path}: {name} differs after the round trip"
    return model


def load_reference_model(spec_name: str, gguf_path: Path):
    """The reference model on gguf-py's dequantization of the file (see the module docstring)."""
    if spec_name != BASE_SPEC:
        return load_dequantized(spec_name, gguf_path)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.float32, attn_implementation="eager")
    model.eval()
    check_weights(model, gguf_path)
    return model


def kept_f32(gguf_path: Path) -> list[str]:
    """The tensor kinds (names without blk.N.) the quantized file keeps in F32."""
    from gguf import GGUFReader

    return sorted({t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name
                   for t in GGUFReader(gguf_path).tensors if t.tensor_type.name == "F32"})


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


def f32_roundtrip(spec_name: str, base: Path, cases: list[dict]) -> float:
    """load_dequantized on the F32 file against make_tiny's reference (transformers on the original HF
    weights): the largest |last-logit difference| over the prompts (0.0: the loader is exact)."""
    model = load_dequantized(spec_name, base)
    worst = 0.0
    with torch.inference_mode():
        for case in cases:
            got = model(input_ids=torch.tensor([case["token_ids"]])).logits[0, -1].float().numpy()
            want = np.fromfile(base.parent / f"{case['id']}.last_logits.f32", dtype="<f4")
            worst = max(worst, float(np.abs(got - want).max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "tests/data/tiny-quant")
    ap.add_argument("--bin", type=Path, default=Path(os.environ.get("LLAMA_BIN", "")))
    ap.add_argument("--spec", default=BASE_SPEC, choices=(BASE_SPEC, *HYBRID_SPECS))
    ap.add_argument("--only", nargs="+", choices=TYPES)
    args = ap.parse_args()
    spec_name = args.spec
    types = args.only or (TYPES if spec_name == BASE_SPEC else HYBRID_TYPES)
    imatrix_needed = any(ty not in NO_IMATRIX for ty in types)
    for tool in ("llama-quantize", "llama-server") + (("llama-imatrix",) if imatrix_needed else ()):
        if not (args.bin / tool).is_file():
            raise SystemExit(f"{tool} not in --bin / $LLAMA_BIN ({args.bin})")
    # transformers' own GGUF loader (the second path for the hybrids) looks for a kernel on the Hub first
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if spec_name != BASE_SPEC:  # as make_tiny's reference, which the F32 round trip matches bit for bit
        torch.set_num_threads(1)

    cases = prompt_cases()
    work = Path(tempfile.mkdtemp(prefix="tiny-quant-"))
    run([sys.executable, str(HERE / "make_tiny.py"), "--only", spec_name, "--out", str(work)], work / "make_tiny.log")
    base = work / spec_name / "model.gguf"
    roundtrip = None
    if spec_name != BASE_SPEC:
        roundtrip = f32_roundtrip(spec_name, base, cases)
        assert roundtrip == 0.0, f"the dequantizing loader on the F32 file is off by {roundtrip}"
        print(f"{spec_name}: the dequantizing loader on the F32 file reproduces make_tiny's reference exactly",
              flush=True)
    calib = work / "calibration.txt"
    calib.write_text(CALIBRATION)
    imatrix = work / "imatrix.gguf"
    if imatrix_needed:
        run([str(args.bin / "llama-imatrix"), "-m", str(base), "-f", str(calib), "-o", str(imatrix), "-c",
             "128", "-t", "1", "--no-ppl"], work / "imatrix.log")
    vocab = json.loads((work / spec_name / "spec.json").read_text())["tokenizer"]["vocab_size"]
    summary = {}
    for ty in types:
        name = folder_name(spec_name, ty)
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        gguf_path = folder / "model.gguf"
        # The 1- and 2-bit i-quants need an importance matrix, which covers the layers' matrices only:
        # their token embedding and output matrix are Q4_K, as in llama.cpp's own mixes of them.
        edges = ["--token-embedding-type", "Q4_K", "--output-tensor-type", "Q4_K"] if ty in NEED_IMATRIX else []
        with_imatrix = [] if ty in NO_IMATRIX else ["--imatrix", str(imatrix)]
        run([str(args.bin / "llama-quantize"), "--pure", *edges, *with_imatrix, str(base),
             str(gguf_path), FTYPE.get(ty, ty), "1"], work / f"quantize.{ty}.log")
        check_types(gguf_path, ty)
        model = load_reference_model(spec_name, gguf_path)
        stats = reference(model, cases, folder, gguf_path.name)
        note = REFERENCE_NOTE if spec_name == BASE_SPEC else HYBRID_REFERENCE_NOTE
        doc = json.loads((folder / "reference.json").read_text())
        doc["reference"] = note
        write_json(folder / "reference.json", doc, ascii_only=True)
        if spec_name != BASE_SPEC:
            stats["gguf_load_check"] = {
                "what": "transformers' own GGUF loader (its own dequantization code, not gguf-py's; without the "
                        "`kernels` package it dequantizes the whole model at load) against this reference",
                **check_gguf_load(gguf_path, cases, folder, model.config)}

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
        spec_doc = {
            "base": spec_name,
            "type": ty,
            "quantized_by": ("llama-quantize --pure MXFP4_MOE (no importance matrix: ggml's MXFP4 quantizer takes none)"
                             if ty in NO_IMATRIX else
                             "llama-quantize --pure --imatrix (imatrix: llama-imatrix -c 128 on tools/models/README.md x2)")
                            + (", token embedding and output Q4_K" if ty in NEED_IMATRIX else ""),
            "reference": note,
            "transformers": version("transformers"),
            "gguf": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
            "stats": stats,
        }
        if spec_name != BASE_SPEC:
            spec_doc["kept_f32"] = kept_f32(gguf_path)
            spec_doc["loader_f32_check"] = {
                "what": "the same loader on the F32 file before quantization against make_tiny's reference "
                        "(transformers on the original HF weights): largest |last-logit difference|",
                "max_abs_logit_diff": roundtrip}
        write_json(folder / "spec.json", spec_doc)
        summary[name] = {"size": len(data), "llama_cpp_mean_kl": mean_kl,
                         "mean_top1_prob": stats["mean_top1_prob"], "greedy_min_margin": stats["greedy_min_margin"]}
        print(f"{name}: {len(data):,} bytes, llama.cpp mean KL {mean_kl:.3g}, greedy min margin "
              f"{stats['greedy_min_margin']}", flush=True)
    # `--only` / `--spec` update their folders' entries and keep the others' (qwen2-q256's types first)
    old = args.out / "summary.json"
    merged = json.loads(old.read_text()) if old.is_file() else {}
    merged.update(summary)
    order = [ty for ty in TYPES if ty in merged] + sorted(k for k in merged if k not in TYPES)
    write_json(old, {k: merged[k] for k in order})


if __name__ == "__main__":
    main()
