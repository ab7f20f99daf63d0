#!/usr/bin/env python3
"""The logit lens reference: HF transformers (float32, eager attention) on the GGUF's weights, as
`logits.py` loads them. For three prompts of `reference.json` (their token ids as committed), at the
last prompt position: after the embeddings (layer 0) and after every block (layer l), the residual
stream's L2 norm, and the model's final norm and output head applied to it (the unadjusted logit
lens): the top-8 ids and natural-log probabilities, and the top-1 - top-2 logit gap. The last layer's
lens is the model's own output (transformers' last hidden state is already normed). And every
block's attention weights of the last position, per head, over every position (eager attention,
`output_attentions`).

usage: ~/refvenv/bin/python tools/reference/lens.py [--out tests/data/reference]
Writes <model>/lens.json.
"""

from __future__ import annotations

import argparse
import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from common import MODELS, r6, rill_model_dir, write_json
from logits import load_model, top_k, verify_weights

CASES = ("capital", "story", "code")


@torch.inference_mode()
def lens_case(model, ids):
    out = model(input_ids=torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
    hs = out.hidden_states  # embeddings, then after each block (the last one normed)
    # Per block, per head: the last position's attention weights over every position.
    attention = [
        [[round(float(w), 8) for w in head] for head in a[0, :, -1, :]] for a in out.attentions
    ]
    n_layers = len(hs) - 1
    body = model.model
    layers = []
    for layer in range(n_layers + 1):
        if layer < n_layers:
            h = hs[layer][0, -1]
            logits = model.lm_head(body.norm(h))
            cap = getattr(model.config, "final_logit_softcapping", None)
            if cap:
                logits = torch.tanh(logits / cap) * cap
            norm = float(torch.linalg.vector_norm(h.double()))
        else:
            logits = out.logits[0, -1]
            norm = None
        ids8, lp8 = top_k(logits.float())
        x = logits.double()
        a, b = torch.topk(x, 2).values.tolist()
        entry = {"layer": layer, "top_ids": ids8, "top_logprobs": lp8, "top2_gap": r6(a - b)}
        if norm is not None:
            entry["residual_norm"] = r6(norm)
        layers.append(entry)
    return layers, attention


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "tests" / "data" / "reference")
    args = ap.parse_args()
    for spec in MODELS:
        gguf = rill_model_dir() / spec.file
        model = load_model(gguf)
        verify_weights(model, gguf)
        ref = json.loads((args.out / spec.folder / "reference.json").read_text())
        cases = []
        for case in ref["cases"]:
            if case["id"] not in CASES:
                continue
            layers, attention = lens_case(model, case["token_ids"])
            cases.append(
                {"id": case["id"], "token_ids": case["token_ids"], "layers": layers, "attention": attention}
            )
            print(f"{spec.folder}/{case['id']}: {len(layers)} lens layers")
        write_json(
            args.out / spec.folder / "lens.json",
            {
                "model": spec.file,
                "reference": "transformers f32 on dequantized GGUF weights, output_hidden_states; "
                "lens = final norm + output head on the residual at the last prompt position",
                "transformers": version("transformers"),
                "cases": cases,
            },
        )


if __name__ == "__main__":
    main()
