#!/usr/bin/env python3
"""Long-context references: prompts of 2,048 and 8,192 tokens for both models, and 30,000 for
Gemma 3 (trained for 32,768), run by HF transformers in float32 (eager attention) on the GGUF's
weights, as `logits.py` loads them, with each model's own sliding windows.

The text is the license texts Debian ships in /usr/share/common-licenses, concatenated in the order
of LICENSES (real prose, long enough for 30k tokens); it is tokenized with transformers' tokenizer
from the same GGUF (Gemma 3: BOS first), and the first N ids are a case. The committed ids are the
input: the tests feed them to rill as they are, so the reference does not depend on rill's
tokenizer. A prompt runs through the model in chunks of CHUNK tokens on transformers' KV cache
(eager attention over 30k positions at once would need ~14 GB per layer); only the last position's
logits are kept.

usage: ~/refvenv/bin/python tools/reference/long_context.py [--out tests/data/reference]
Writes <model>/long_context.json (per case: the ids, the last position's top-8 ids and natural-log
probabilities, its argmax and top-1 - top-2 logit gap) and <model>/long-<N>.last_logits.f32.
"""

from __future__ import annotations

import argparse
import time
from importlib.metadata import version
from pathlib import Path

import torch

from common import MODELS, r6, rill_model_dir, write_f32, write_json
from logits import argmax, load_model, top2_margin, top_k, verify_weights

LICENSES = (
    "GPL-3", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "GPL-2", "LGPL-2", "MPL-1.1",
    "GFDL-1.2", "GPL-1", "CC0-1.0", "Artistic", "LGPL-3", "BSD",
)
LENGTHS = {"smollm2": (2048, 8192), "gemma3": (2048, 8192, 30000)}
CHUNK = 2048


def text() -> str:
    base = Path("/usr/share/common-licenses")
    return "\n\n".join((base / name).read_text(encoding="utf-8") for name in LICENSES)


@torch.inference_mode()
def last_logits(model, ids: list[int]) -> torch.Tensor:
    past = None
    for start in range(0, len(ids), CHUNK):
        chunk = torch.tensor([ids[start : start + CHUNK]])
        out = model(input_ids=chunk, past_key_values=past, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
    return out.logits[0, -1].float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "tests" / "data" / "reference")
    ap.add_argument("--only", choices=[m.key for m in MODELS])
    args = ap.parse_args()
    from transformers import AutoTokenizer

    for spec in MODELS:
        if args.only and spec.key != args.only:
            continue
        gguf = rill_model_dir() / spec.file
        model = load_model(gguf)
        verify_weights(model, gguf)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        ids = tok(text(), add_special_tokens=False)["input_ids"]
        if spec.add_bos:
            ids = [tok.bos_token_id] + ids
        cases = []
        for n in LENGTHS[spec.key]:
            assert len(ids) >= n, (spec.key, len(ids), n)
            started = time.time()
            logits = last_logits(model, ids[:n])
            write_f32(args.out / spec.folder / f"long-{n}.last_logits.f32", logits.numpy())
            top_ids, top_lp = top_k(logits)
            cases.append(
                {
                    "id": f"long-{n}",
                    "token_ids": ids[:n],
                    "top_ids": top_ids,
                    "top_logprobs": top_lp,
                    "argmax": argmax(logits),
                    "top2_gap": r6(top2_margin(logits)),
                }
            )
            print(f"{spec.folder}/long-{n}: {time.time() - started:.0f} s, argmax {argmax(logits)}")
        write_json(
            args.out / spec.folder / "long_context.json",
            {
                "model": spec.file,
                "reference": "transformers f32 on dequantized GGUF weights, eager attention, the prompt in "
                f"chunks of {CHUNK} on its KV cache; text: /usr/share/common-licenses "
                + ", ".join(LICENSES),
                "transformers": version("transformers"),
                "cases": cases,
            },
        )


if __name__ == "__main__":
    main()
