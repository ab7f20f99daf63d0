"""Compares two copies of the reference data (e.g. the committed one and a fresh `generate.py` run).

usage: python compare.py OLD_DIR NEW_DIR [--logit-tol X] [--logprob-tol X]

Checks
- prompts.json: the same prompts.
- per model, reference.json: the same prompt ids and greedy ids (and greedy text); at every position
  the same top-8 ids, except for reorderings among log-probs within --logprob-tol of each other (and
  the 8th/9th candidates trading places when they are that close); top log-probs within
  --logprob-tol; <case>.last_logits.f32 within --logit-tol (max abs diff reported);
  greedy_min_margin.json within --logit-tol.
- per model, tokenization.json: the same texts and identical `ids`, `ids_parse_special` and
  `hf_ids_parse_special`; and, in each copy, llama.cpp's ids == HF's ids.
- per model, dequant.json and its row files: identical bytes.
- dequant/: gguf-py must dequantize OLD's `.bin` files to OLD's `.f32` files bit for bit (and NEW's
  likewise), with the same types and element counts in both index files; where OLD's and NEW's
  blocks are the same bytes, their `.f32` files must be too (the first committed copy was made from
  other random blocks than generate.py's seed gives).

Prints a summary; exits 1 on any disagreement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MODELS, load_json, read_f32  # noqa: E402


class Report:
    def __init__(self):
        self.failures: list[str] = []
        self.lines: list[str] = []

    def fail(self, msg: str) -> None:
        self.failures.append(msg)

    def info(self, msg: str) -> None:
        self.lines.append(msg)
        print(msg)


def compare_top(old_ids, old_lp, new_ids, new_lp, tol):
    """Returns (problems, reordered): top-8 lists agree up to near-ties within tol."""
    problems = []
    o = dict(zip(old_ids, old_lp))
    n = dict(zip(new_ids, new_lp))
    for tid in o.keys() & n.keys():
        if abs(o[tid] - n[tid]) > tol:
            problems.append(f"id {tid}: logprob {o[tid]} vs {n[tid]}")
    for tid in o.keys() - n.keys():  # dropped out of NEW's top 8: must tie with NEW's 8th
        if o[tid] > new_lp[-1] + tol:
            problems.append(f"id {tid} (old logprob {o[tid]}) missing from new top-8 (8th: {new_lp[-1]})")
    for tid in n.keys() - o.keys():
        if n[tid] > old_lp[-1] + tol:
            problems.append(f"id {tid} (new logprob {n[tid]}) missing from old top-8 (8th: {old_lp[-1]})")
    # NEW's order must be OLD's order up to near-ties
    common = [tid for tid in new_ids if tid in o]
    for a, b in zip(common, common[1:]):
        if o[a] < o[b] - 2 * tol:
            problems.append(f"ids {a}, {b} ordered differently (old logprobs {o[a]}, {o[b]})")
    return problems, list(old_ids) != list(new_ids)


def compare_reference(model, old: Path, new: Path, args, rep: Report) -> dict:
    ro = load_json(old / model.folder / "reference.json")
    rn = load_json(new / model.folder / "reference.json")
    tag = model.folder
    for key in ("model", "reference", "transformers"):
        if ro.get(key) != rn.get(key):
            rep.info(f"  note: reference.json {key}: {ro.get(key)!r} -> {rn.get(key)!r}")
    if set(ro) != set(rn):
        rep.fail(f"{tag}: reference.json keys {sorted(ro)} vs {sorted(rn)}")
    co = {c["id"]: c for c in ro["cases"]}
    cn = {c["id"]: c for c in rn["cases"]}
    if list(co) != list(cn):
        rep.fail(f"{tag}: cases {list(co)} vs {list(cn)}")
    stats = dict(positions=0, same_top=0, reordered=0, max_lp=0.0, max_logit=0.0, greedy_same=0, cases=0)
    for cid in co.keys() & cn.keys():
        a, b = co[cid], cn[cid]
        stats["cases"] += 1
        if set(a) != set(b):
            rep.fail(f"{tag}/{cid}: case keys {sorted(a)} vs {sorted(b)}")
        if a["text"] != b["text"]:
            rep.fail(f"{tag}/{cid}: prompt text differs")
        if a["token_ids"] != b["token_ids"]:
            rep.fail(f"{tag}/{cid}: prompt token ids differ")
            continue
        if a["greedy_ids"] == b["greedy_ids"]:
            stats["greedy_same"] += 1
        else:
            k = next(i for i, (x, y) in enumerate(zip(a["greedy_ids"], b["greedy_ids"])) if x != y)
            rep.fail(f"{tag}/{cid}: greedy ids differ from step {k}")
        if a["greedy_text"] != b["greedy_text"]:
            rep.fail(f"{tag}/{cid}: greedy text differs: {a['greedy_text']!r} vs {b['greedy_text']!r}")
        if len(a["positions"]) != len(b["positions"]):
            rep.fail(f"{tag}/{cid}: {len(a['positions'])} positions vs {len(b['positions'])}")
        for i, (pa, pb) in enumerate(zip(a["positions"], b["positions"])):
            stats["positions"] += 1
            probs, reordered = compare_top(pa["top_ids"], pa["top_logprobs"], pb["top_ids"], pb["top_logprobs"], args.logprob_tol)
            for p in probs:
                rep.fail(f"{tag}/{cid} position {i}: {p}")
            stats["same_top"] += not reordered
            stats["reordered"] += reordered and not probs
            same = [
                abs(x - y)
                for ia, x in zip(pa["top_ids"], pa["top_logprobs"])
                for ib, y in zip(pb["top_ids"], pb["top_logprobs"])
                if ia == ib
            ]
            stats["max_lp"] = max(stats["max_lp"], max(same, default=0.0))
        lo = read_f32(old / model.folder / f"{cid}.last_logits.f32")
        ln = read_f32(new / model.folder / f"{cid}.last_logits.f32")
        if lo.shape != ln.shape:
            rep.fail(f"{tag}/{cid}: last_logits {lo.size} values vs {ln.size}")
            continue
        d = float(np.abs(lo.astype(np.float64) - ln).max())
        stats["max_logit"] = max(stats["max_logit"], d)
        if d > args.logit_tol or not np.isfinite(ln).all():
            rep.fail(f"{tag}/{cid}: last_logits max abs diff {d:.3g} > {args.logit_tol}")
    if stats["max_lp"] > args.logprob_tol:
        rep.fail(f"{tag}: top logprob max abs diff {stats['max_lp']:.3g} > {args.logprob_tol}")
    mo = load_json(old / model.folder / "greedy_min_margin.json")
    mn = load_json(new / model.folder / "greedy_min_margin.json")
    if list(mo) != list(mn):
        rep.fail(f"{tag}: greedy_min_margin cases differ")
    stats["max_margin"] = max((abs(mo[k] - mn[k]) for k in mo.keys() & mn.keys()), default=0.0)
    stats["min_margin"] = min(mn.values(), default=0.0)
    if stats["max_margin"] > args.logit_tol:
        rep.fail(f"{tag}: greedy_min_margin max abs diff {stats['max_margin']:.3g}")
    return stats


def compare_tokenization(model, old: Path, new: Path, rep: Report) -> dict:
    to = load_json(old / model.folder / "tokenization.json")
    tn = load_json(new / model.folder / "tokenization.json")
    tag = model.folder
    if set(to) != set(tn):
        rep.fail(f"{tag}: tokenization.json keys {sorted(to)} vs {sorted(tn)}")
    if to.get("add_bos_token") != tn.get("add_bos_token"):
        rep.fail(f"{tag}: add_bos_token {to.get('add_bos_token')} vs {tn.get('add_bos_token')}")
    if to.get("tokenizer") != tn.get("tokenizer"):
        rep.info(f"  note: tokenization.json tokenizer: {to.get('tokenizer')!r} -> {tn.get('tokenizer')!r}")
    if [c["text"] for c in to["cases"]] != [c["text"] for c in tn["cases"]]:
        rep.fail(f"{tag}: tokenization texts differ")
    keys = ("ids", "ids_parse_special", "hf_ids_parse_special")
    same = {k: 0 for k in keys}
    hf_vs_llama = {"old": 0, "new": 0}
    for a, b in zip(to["cases"], tn["cases"]):
        for k in keys:
            if a[k] == b[k]:
                same[k] += 1
            else:
                rep.fail(f"{tag}: {a['text']!r}: {k} {a[k]} vs {b[k]}")
        for name, c in (("old", a), ("new", b)):
            if c["ids_parse_special"] == c["hf_ids_parse_special"]:
                hf_vs_llama[name] += 1
            else:
                rep.fail(f"{tag} ({name}): {c['text']!r}: llama.cpp {c['ids_parse_special']} != HF {c['hf_ids_parse_special']}")
    return dict(cases=len(tn["cases"]), same=same, hf_vs_llama=hf_vs_llama)


def compare_model_dequant(model, old: Path, new: Path, rep: Report) -> int:
    do = load_json(old / model.folder / "dequant.json")
    dn = load_json(new / model.folder / "dequant.json")
    if do != dn:
        rep.fail(f"{model.folder}: dequant.json differs")
        return 0
    n = 0
    for e in do:
        a = (old / model.folder / e["file"]).read_bytes()
        b = (new / model.folder / e["file"]).read_bytes()
        if a == b and len(a) == 4 * 2 * e["row_length"]:
            n += 1
        else:
            rep.fail(f"{model.folder}: {e['file']} differs")
    return n


def compare_random_dequant(old: Path, new: Path, rep: Report) -> None:
    from dequant import check_old_dequant

    io = load_json(old / "dequant" / "index.json")
    inn = load_json(new / "dequant" / "index.json")
    if io["cases"] != inn["cases"]:
        rep.fail("dequant/index.json: types, block sizes, element counts or file names differ")
    if set(io) != set(inn):
        rep.fail(f"dequant/index.json keys {sorted(io)} vs {sorted(inn)}")
    same_raw = 0
    for c in io["cases"]:
        ro, rn = old / "dequant" / c["raw"], new / "dequant" / c["raw"]
        if rn.is_file() and ro.read_bytes() == rn.read_bytes():
            same_raw += 1
            if (old / "dequant" / c["f32"]).read_bytes() != (new / "dequant" / c["f32"]).read_bytes():
                rep.fail(f"dequant/{c['f32']}: same blocks, different values")
    rep.info(f"dequant/: {same_raw}/{len(io['cases'])} .bin files identical in old and new (new random blocks otherwise)")
    for name, d in (("old", old), ("new", new)):
        problems = check_old_dequant(d)
        for p in problems:
            rep.fail(f"{name} {p}")
        rep.info(
            f"dequant/ ({name}, gguf_version {load_json(d / 'dequant' / 'index.json').get('gguf_version')!r}): "
            f"gguf-py reproduces {len(io['cases']) - len(problems)}/{len(io['cases'])} .f32 files bit for bit"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--logit-tol", type=float, default=1e-3, help="max abs diff of logits (default 1e-3)")
    ap.add_argument("--logprob-tol", type=float, default=1e-4, help="max abs diff of log-probs (default 1e-4)")
    args = ap.parse_args()
    rep = Report()

    if load_json(args.old / "prompts.json") != load_json(args.new / "prompts.json"):
        rep.fail("prompts.json differs")
    for model in MODELS:
        rep.info(f"{model.folder}:")
        s = compare_reference(model, args.old, args.new, args, rep)
        rep.info(
            f"  logits: last_logits max abs diff {s['max_logit']:.3g} over {s['cases']} cases; "
            f"top-8 logprob max abs diff {s['max_lp']:.3g}; greedy_min_margin max abs diff {s['max_margin']:.3g} "
            f"(smallest margin {s['min_margin']})"
        )
        rep.info(
            f"  token ids: greedy identical in {s['greedy_same']}/{s['cases']} cases; top-8 ids identical at "
            f"{s['same_top']}/{s['positions']} positions, near-tie reorders at {s['reordered']}"
        )
        t = compare_tokenization(model, args.old, args.new, rep)
        rep.info(
            f"  tokenization: {t['cases']} texts; old == new: ids {t['same']['ids']}, ids_parse_special "
            f"{t['same']['ids_parse_special']}, hf_ids_parse_special {t['same']['hf_ids_parse_special']}; "
            f"llama.cpp == HF: old {t['hf_vs_llama']['old']}, new {t['hf_vs_llama']['new']}"
        )
        n = compare_model_dequant(model, args.old, args.new, rep)
        rep.info(f"  dequant rows: {n}/{len(load_json(args.old / model.folder / 'dequant.json'))} files identical")
    compare_random_dequant(args.old, args.new, rep)

    if rep.failures:
        print(f"\nDISAGREE: {len(rep.failures)} problem(s)")
        for f in rep.failures[:200]:
            print(f"  {f}")
        sys.exit(1)
    print("\nAGREE: every check passed")


if __name__ == "__main__":
    main()
