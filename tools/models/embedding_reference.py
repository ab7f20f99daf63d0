"""The embedding references of tiny test models: transformers (float32, eager attention) on the
same random checkpoint `make_tiny.py` builds (same spec, same seed; checked against the committed
logits first), the last hidden state (after the final norm) of each reference prompt pooled by
mean, first position and last position, each normalised to unit length.

    nice -n 10 /root/refvenv/bin/python tools/models/embedding_reference.py [--only qwen3-tiny ...]

Writes tests/data/tiny/<model>/embeddings.json."""

from __future__ import annotations

import argparse
import json
import struct
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_tiny  # noqa: E402
from specs import SPECS, build_model  # noqa: E402

MODELS = ("qwen3-tiny", "llama-tiny", "gemma3-27b-shape")


def read_f32(path: Path) -> list[float]:
    data = path.read_bytes()
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.only:
        spec = next(s for s in SPECS if s.name == name)
        folder = make_tiny.REPO / "tests/data/tiny" / name
        reference = json.loads((folder / "reference.json").read_text())
        model = build_model(spec)
        model.eval()
        cases = []
        for case in reference["cases"]:
            ids = case["token_ids"]
            with torch.no_grad():
                out = model(torch.tensor([ids]), output_hidden_states=True)
            # The checkpoint is the one the GGUF was made from: its logits are the committed ones.
            want = torch.tensor(read_f32(folder / f"{case['id']}.last_logits.f32"))
            got = out.logits[0, -1].float()
            assert torch.allclose(got, want, atol=1e-5), f"{name}: rebuilt model differs"
            h = out.hidden_states[-1][0].double()
            pooled = {"mean": h.mean(0), "cls": h[0], "last": h[-1]}
            cases.append({
                "id": case["id"],
                "token_ids": ids,
                **{k: [round(float(x), 7) for x in v / v.norm()] for k, v in pooled.items()},
            })
        (folder / "embeddings.json").write_text(json.dumps({
            "what": "unit-length pooled final hidden states (after the final norm) of each prompt; "
                    "see tools/models/embedding_reference.py",
            "reference": make_tiny.REFERENCE_NOTE,
            "cases": cases,
        }, indent=1) + "\n")
        print(f"{name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
