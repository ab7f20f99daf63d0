"""Builds the tiny random test models of `tests/data/tiny/` (qwen2, qwen3, llama, gemma2, gemma3, olmo2,
smollm3, granite, phi3, qwen3moe, gpt-oss, lfm2, lfm2moe, qwen35, qwen35moe, granitehybrid, gemma4) the way real files
are made:
HF transformers' own model classes -> an HF checkpoint (safetensors + tokenizer) -> llama.cpp's own
`convert_hf_to_gguf.py` -> an F32 GGUF; and computes the exact references with transformers (float32,
eager attention) on the checkpoint's weights, in the layout of `tests/data/reference/`.

    nice -n 10 /root/refvenv/bin/python tools/models/make_tiny.py [--only qwen2-tiny ...]

Deterministic: running it again writes the same bytes. See README.md."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent / "reference"))  # the reference generators' helpers

import numpy as np  # noqa: E402
import torch  # noqa: E402

from common import r6, write_f32, write_json  # noqa: E402
from logits import run_case, top_k  # noqa: E402

import gguf_info  # noqa: E402
from specs import SPECS, Spec, build_model  # noqa: E402
from tokenizer import N_ORDINARY, SPECIAL_TOKENS, save_tokenizer  # noqa: E402

DEFAULT_LLAMA_CPP = Path.home() / ".cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp"
LLAMA_CPP_PYTHON = "0.3.36"  # the PyPI sdist the llama.cpp tree is vendored in
PRE_TOKENIZER = "qwen2"
CASE_SEED = 20240600
CASE_LENGTHS = (1, 7, 33, 70)  # 70 > 64: crosses a 64-token prompt chunk / window
REFERENCE_NOTE = "transformers f32 on the original HF weights (before GGUF conversion)"


def log(msg: str) -> None:
    print(msg, flush=True)


def prompt_cases() -> list[dict]:
    """Fixed random prompts (the same for every spec): ids in [0, N_ORDINARY), no special tokens."""
    rng = np.random.default_rng(CASE_SEED)
    return [
        {"id": f"len{n}", "text": "", "token_ids": [int(x) for x in rng.integers(0, N_ORDINARY, n)]}
        for n in CASE_LENGTHS
    ]


def llama_cpp_commit(llama_cpp: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(llama_cpp), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def converter_sources_sha256(llama_cpp: Path) -> str:
    """One sha256 over the converter's Python sources (convert_hf_to_gguf.py, conversion/, gguf-py/gguf/):
    identifies the converter where the tree is not a git checkout (the sdist)."""
    files = [llama_cpp / "convert_hf_to_gguf.py", *sorted((llama_cpp / "conversion").rglob("*.py")),
             *sorted((llama_cpp / "gguf-py/gguf").rglob("*.py"))]
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(llama_cpp).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def converter_gguf_version(llama_cpp: Path) -> str | None:
    import tomllib

    try:
        with open(llama_cpp / "gguf-py/pyproject.toml", "rb") as f:
            return tomllib.load(f)["project"]["version"]
    except (OSError, KeyError):
        return None


def convert(llama_cpp: Path, hf_dir: Path, out: Path, spec: Spec) -> None:
    name = spec.name
    options = []
    if spec.vocab is not None:
        assert spec.vocab == "gpt2", spec.vocab
        options = ["--gpt2-vocab", spec.arch]
    cmd = [sys.executable, str(HERE / "convert.py"), str(llama_cpp), PRE_TOKENIZER, *options, "--",
           str(hf_dir), "--outfile", str(out), "--outtype", "f32", "--model-name", name, *spec.converter_args]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    env.pop("NO_LOCAL_GGUF", None)
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    (hf_dir / "convert.log").write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        sys.stderr.write(res.stdout + res.stderr)
        raise SystemExit(f"convert_hf_to_gguf failed for {name} (rc {res.returncode})")


def reference(model, cases: list[dict], folder: Path, gguf_name: str) -> dict:
    """reference.json, <case>.last_logits.f32 and greedy_min_margin.json; returns the stats."""
    doc_cases, margins, top1 = [], {}, []
    for case in cases:
        ids = case["token_ids"]
        logits, greedy, margin = run_case(model, ids)
        positions = []
        for i in range(len(ids)):
            top_ids, top_lp = top_k(logits[i])
            positions.append({"top_ids": top_ids, "top_logprobs": top_lp})
        x = logits.to(torch.float64)
        top1 += torch.softmax(x, dim=-1).max(dim=-1).values.tolist()
        write_f32(folder / f"{case['id']}.last_logits.f32", logits[-1].numpy())
        doc_cases.append({"id": case["id"], "text": case["text"], "token_ids": ids,
                          "positions": positions, "greedy_ids": greedy, "greedy_text": ""})
        margins[case["id"]] = r6(margin)
    write_json(folder / "reference.json", {
        "model": gguf_name,
        "reference": REFERENCE_NOTE,
        "transformers": version("transformers"),
        "cases": doc_cases,
    }, ascii_only=True)
    write_json(folder / "greedy_min_margin.json", margins)
    return {"mean_top1_prob": r6(float(np.mean(top1))), "n_positions": len(top1),
            "greedy_min_margin": min(margins.values()), "greedy_min_margin_per_case": margins}


def longrope_always_long(model, cases: list[dict], folder: Path) -> dict:
    """LongRoPE as llama.cpp applies it with a context longer than the original one: the long factors
    for every position of every call (HF switches per call, see the spec's notes). Per case: the greedy
    ids, their min margin, and the largest |last logit - the reference's|. Leaves the model as it was."""
    rotary = model.model.rotary_emb
    saved = rotary.original_inv_freq.clone()
    orig = model.config.rope_parameters["original_max_position_embeddings"]
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    long_inv, _ = ROPE_INIT_FUNCTIONS["longrope"](model.config, None, seq_len=orig + 1)
    out = {}
    try:
        rotary.original_inv_freq.copy_(long_inv)
        for case in cases:
            logits, greedy, margin = run_case(model, case["token_ids"])
            want = np.fromfile(folder / f"{case['id']}.last_logits.f32", dtype="<f4")
            out[case["id"]] = {"greedy_ids": greedy, "greedy_min_margin": r6(margin),
                               "max_abs_last_logit_diff": r6(float(np.abs(logits[-1].numpy() - want).max()))}
    finally:
        rotary.original_inv_freq.copy_(saved)
        rotary.inv_freq.copy_(saved)
    return out


def expert_bias_routing(model, folder: Path) -> dict:
    """lfm2moe: what the selection bias does to the routing, per MoE layer, over every position an engine
    routes in the cases (each case's prompt and then its greedy tokens but the last, from reference.json;
    the router's input captured in one forward over that sequence): how many positions' top-k expert set
    differs with and without expert_bias, how often each expert is chosen (with the bias), the mean largest
    chosen weight, and the smallest gap between the last chosen and the first unchosen biased score."""
    import torch.nn.functional as F

    captured, hooks = {}, []
    for il, layer in enumerate(model.model.layers):
        ff = layer.feed_forward
        if getattr(ff, "use_expert_bias", False):
            hooks.append(ff.gate.register_forward_pre_hook(
                lambda mod, args, il=il: captured.setdefault(il, []).append(args[0].detach().clone())))
    try:
        with torch.inference_mode():
            for case in json.loads((folder / "reference.json").read_text())["cases"]:
                model(input_ids=torch.tensor([case["token_ids"] + case["greedy_ids"][:-1]]))
    finally:
        for h in hooks:
            h.remove()
    out = {}
    with torch.no_grad():
        for il, xs in sorted(captured.items()):
            ff = model.model.layers[il].feed_forward
            x, k = torch.cat(xs), ff.gate.top_k
            s = torch.sigmoid(F.linear(x, ff.gate.weight))
            top = torch.topk(s + ff.expert_bias, k + 1, dim=-1)
            biased = top.indices[:, :k]
            plain = torch.topk(s, k, dim=-1).indices
            differs = (biased.sort(-1).values != plain.sort(-1).values).any(-1)
            w = torch.gather(s, 1, biased)
            w = w / (w.sum(-1, keepdim=True) + 1e-6)
            out[f"layer_{il}"] = {
                "positions": int(x.shape[0]),
                "top_k_set_differs_without_bias": int(differs.sum()),
                "expert_counts": torch.bincount(biased.reshape(-1), minlength=s.shape[1]).tolist(),
                "mean_max_weight": r6(float(w.max(-1).values.mean())),
                # the smallest gap between the k-th and (k+1)-th biased score: how far from a tie the choice is
                "min_selection_gap": r6(float((top.values[:, k - 1] - top.values[:, k]).min())),
                "expert_bias": [r6(float(b)) for b in ff.expert_bias],
            }
    return out


def check_gguf_load(gguf_path: Path, cases: list[dict], folder: Path, original) -> dict:
    """An independent second path: transformers loading the GGUF itself (its own GGUF reader and
    config mapping). Returns the largest |logit difference| against the written last logits."""
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32,
            attn_implementation="eager")
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        return {"loaded": False, "error": f"{type(e).__name__}: {e}"[:300]}
    model.eval()
    config = {"rope_parameters": model.config.rope_parameters,
              "head_dim": getattr(model.config, "head_dim", None)}
    worst = 0.0
    with torch.inference_mode():
        for case in cases:
            got = model(input_ids=torch.tensor([case["token_ids"]])).logits[0, -1].float().numpy()
            want = np.fromfile(folder / f"{case['id']}.last_logits.f32", dtype="<f4")
            worst = max(worst, float(np.abs(got - want).max()))
    same = config == {"rope_parameters": original.rope_parameters,
                      "head_dim": getattr(original, "head_dim", None)}
    return {"loaded": True, "max_abs_logit_diff": worst, "config_as_loaded": config,
            "config_as_original": same}


def hf_config(model) -> dict:
    """The full config (`to_dict()`, JSON-typed), without `_name_or_path` (a temporary directory)."""
    config = json.loads(model.config.to_json_string(use_diff=False))
    config.pop("_name_or_path", None)
    return config


def init_note(spec: Spec) -> str:
    note = ("HF init (normal, std initializer_range), then with torch.Generator(seed + 1): "
            "every bias ~ N(0, 0.1), every RMSNorm weight ~ U(0.5, 1.5), the final norm's "
            f"times {spec.out_norm_gain}")
    if spec.norm_offset:
        note += f", minus {spec.norm_offset} (the stored weight w of a (1 + w) norm)"
        if spec.plain_norms:
            note += f" except {', '.join(spec.plain_norms)} (a plain gain w)"
    if spec.arch.startswith("Qwen3_5"):
        note += ("; the linear attention's dt_bias ~ N(0, 0.5) and A_log ~ U(-1, 1) (HF: 1 and "
                 "log U(0.01, 16))")
    if spec.arch == "GraniteMoeHybridForCausalLM":
        note += ("; the Mamba-2 layers' dt_bias ~ N(0, 0.5), A_log ~ U(-1, 1) and D ~ N(0, 1) (HF: 1, "
                 "log(1..n_heads) and 1); the gated norm (mamba.norm) and the conv1d bias as every RMSNorm "
                 "weight / bias")
    if spec.arch == "Gemma4ForCausalLM":
        note += ("; every layer's layer_scalar (a saved buffer, HF: 1) ~ U(0.5, 1.5); the v norm has no "
                 "weight")
    if spec.arch == "Lfm2MoeForCausalLM":
        note += ("; every MoE layer's expert_bias (a saved buffer: the expert selection bias, HF: 0) ~ "
                 "N(0, 0.1)")
    if spec.arch == "GptOssForCausalLM":
        note += "; the experts' biases ~ N(0, 0.1) too, the attention sinks ~ N(0, 1)"
    if spec.gate_up_scale != 1.0:
        note += f"; the experts' gate_up_proj times {spec.gate_up_scale} (before all that)"
    return note


def make(spec: Spec, out_root: Path, llama_cpp: Path, work: Path, cases: list[dict]) -> dict:
    from transformers import AutoModelForCausalLM

    from gguf import GGUFReader

    log(f"{spec.name}: building ({spec.arch}, seed {spec.seed})")
    hf_dir = work / spec.name
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    model = build_model(spec)
    model.save_pretrained(str(hf_dir))
    if spec.config_json:  # config.json keys as real checkpoints spell them (see Spec.config_json)
        cfg_path = hf_dir / "config.json"
        saved = json.loads(cfg_path.read_text())
        saved.update(spec.config_json)
        cfg_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    save_tokenizer(hf_dir)
    folder = out_root / spec.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    gguf_path = folder / "model.gguf"

    log(f"{spec.name}: converting with {llama_cpp / 'convert_hf_to_gguf.py'}")
    convert(llama_cpp, hf_dir, gguf_path, spec)

    # The references run on the checkpoint as saved, reloaded the ordinary way.
    ref_model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                     attn_implementation="eager")
    ref_model.eval()
    state = ref_model.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(state[k], v), f"reloaded checkpoint differs: {k}"
    tied = bool(ref_model.config.tie_word_embeddings)
    assert tied == (ref_model.lm_head.weight is ref_model.model.embed_tokens.weight)

    # HF's rope frequencies as built (LongRoPE swaps inv_freq in place while it runs)
    # (Lfm2MoeModel calls it pos_emb)
    rotary = ref_model.model.rotary_emb if hasattr(ref_model.model, "rotary_emb") else ref_model.model.pos_emb
    if rotary is None:  # no rope at all (granitehybrid: position_embedding_type "nope")
        inv_freq, hf_rope = None, None
    elif hasattr(rotary, "inv_freq"):
        inv_freq = rotary.inv_freq
        hf_rope = {"inv_freq": [float(x) for x in inv_freq],
                   "attention_scaling": float(rotary.attention_scaling)}
    else:
        # one rotary table per layer type (gemma3: sliding_attention, full_attention)
        inv_freq = rotary.full_attention_inv_freq
        hf_rope = {f"{t}_inv_freq": [float(x) for x in getattr(rotary, f"{t}_inv_freq")]
                   for t in rotary.layer_types}
        hf_rope.update({f"{t}_attention_scaling": float(getattr(rotary, f"{t}_attention_scaling"))
                        for t in rotary.layer_types})
    if rotary is not None and ref_model.config.rope_parameters.get("rope_type") == "longrope":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        orig = ref_model.config.rope_parameters["original_max_position_embeddings"]
        long_inv, _ = ROPE_INIT_FUNCTIONS["longrope"](ref_model.config, None, seq_len=orig + 1)
        hf_rope["inv_freq_long"] = [float(x) for x in long_inv]
        hf_rope["inv_freq_short"] = hf_rope.pop("inv_freq")

    reader = GGUFReader(gguf_path)
    gguf_info.check_against_hf(reader, state, ref_model.config,
                               None if inv_freq is None else np.asarray(inv_freq, dtype=np.float64))
    log(f"{spec.name}: GGUF tensors == HF weights (bit for bit, after the converter's known "
        "transformations)")

    stats = reference(ref_model, cases, folder, gguf_path.name)
    stats["hf_rope"] = hf_rope
    if hf_rope and "inv_freq_long" in hf_rope:
        stats["longrope_always_long"] = longrope_always_long(ref_model, cases, folder)
    if spec.arch == "Lfm2MoeForCausalLM":
        stats["expert_bias_routing"] = expert_bias_routing(ref_model, folder)
        log(f"{spec.name}: expert_bias routing {stats['expert_bias_routing']}")
    stats["gguf_load_check"] = check_gguf_load(gguf_path, cases, folder, ref_model.config)
    log(f"{spec.name}: mean top-1 prob {stats['mean_top1_prob']}, greedy min margin "
        f"{stats['greedy_min_margin']}, transformers-from-GGUF check {stats['gguf_load_check']}")

    data = gguf_path.read_bytes()
    spec_doc = {
        "name": spec.name,
        "architecture": spec.arch,
        "tests": spec.tests,
        "seed": spec.seed,
        "init": init_note(spec),
        "case_seed": CASE_SEED,
        "hf_config": hf_config(model),
        "tokenizer": {"type": "byte-level BPE (tools/models/tokenizer.py)", "vocab_size": N_ORDINARY
                      + len(SPECIAL_TOKENS), "special_tokens": {t: N_ORDINARY + i for i, t in
                                                                 enumerate(SPECIAL_TOKENS)},
                      "gguf_pre": PRE_TOKENIZER},
        "converter": {"script": "convert_hf_to_gguf.py --outtype f32", "llama_cpp_python":
                      LLAMA_CPP_PYTHON, "llama_cpp_commit": llama_cpp_commit(llama_cpp),
                      "gguf_py": converter_gguf_version(llama_cpp),
                      "sources_sha256": converter_sources_sha256(llama_cpp)},
        "versions": {p: version(p) for p in ("torch", "transformers", "tokenizers", "safetensors")},
        "gguf": {"file": gguf_path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                 "metadata": gguf_info.metadata(reader), "tensors": gguf_info.tensors(reader)},
        "stats": stats,
    }
    if spec.notes:
        spec_doc["notes"] = spec.notes
    if spec.converter_args:
        spec_doc["converter"]["options"] = list(spec.converter_args)
    if spec.config_json:
        spec_doc["converter"]["config_json"] = {
            "replaced": spec.config_json,
            "why": "config.json keys rewritten after save_pretrained, as real checkpoints spell them "
                   "(transformers 5 writes layer_types as linear_attention / full_attention; the converter "
                   "looks for 'attention')"}
    if spec.vocab:
        spec_doc["converter"]["vocab"] = (f"{spec.arch}'s set_vocab replaced by the converter's "
                                          "_set_vocab_gpt2 (convert.py --gpt2-vocab)")
    write_json(folder / "spec.json", spec_doc)
    log(f"{spec.name}: wrote {folder} (model.gguf {len(data):,} bytes)")
    return spec_doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "tests/data/tiny")
    ap.add_argument("--llama-cpp", type=Path, default=Path(os.environ.get("LLAMA_CPP_DIR", DEFAULT_LLAMA_CPP)),
                    help="llama.cpp source tree holding convert_hf_to_gguf.py and gguf-py/")
    ap.add_argument("--only", nargs="+", choices=[s.name for s in SPECS])
    ap.add_argument("--keep-hf", type=Path, help="keep the HF checkpoints (and convert.log) here")
    args = ap.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"no convert_hf_to_gguf.py in {args.llama_cpp} (see README.md)")

    torch.set_num_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    cases = prompt_cases()
    specs = [s for s in SPECS if not args.only or s.name in args.only]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep_hf or Path(tmp)
        for spec in specs:
            make(spec, args.out, args.llama_cpp.resolve(), work, cases)


if __name__ == "__main__":
    main()
