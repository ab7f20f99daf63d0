"""The exact f32 forward pass: HF transformers (float32 throughout, eager attention) on the GGUF's
weights, which transformers dequantizes with gguf-py when it loads a GGUF (`from_pretrained(dir,
gguf_file=..., dtype=torch.float32)`). Writes `reference.json`, `<case>.last_logits.f32` and
`greedy_min_margin.json` for one model."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from common import Model, r6, write_f32, write_json

TOP_K = 8
GREEDY_TOKENS = 32
REFERENCE_NOTE = "transformers f32 on dequantized GGUF weights"


def load_model(gguf: Path):
    from transformers import AutoModelForCausalLM

    gguf = Path(gguf).resolve()
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32, (name, p.dtype)
    return model


def verify_weights(model, gguf: Path) -> None:
    """Checks that the loaded model holds the GGUF's weights exactly: the token embedding (the tied
    output head too) equals gguf-py's dequantization bit for bit, and every norm weight survives the
    one arithmetic step of the GGUF import (Gemma's loader stores g - 1, the model uses 1 + (g - 1)).
    """
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(gguf)
    tensors = {t.name: t for t in reader.tensors}
    t = tensors["token_embd.weight"]
    want = np.asarray(dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
    got = model.get_input_embeddings().weight.detach().numpy()
    assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), "token_embd"
    if model.config.model_type.startswith("gemma"):
        for name, t in tensors.items():
            if "norm" in name:
                g = np.asarray(t.data, dtype=np.float32)
                assert np.array_equal(np.float32(1) + (g - np.float32(1)), g), f"{name}: 1 + (g - 1) != g"


def top_k(logits_row: torch.Tensor) -> tuple[list[int], list[float]]:
    """The 8 most likely next tokens and their natural-log probabilities (log-softmax taken in f64
    over the f32 logits; ties broken by the lower id)."""
    x = logits_row.detach().to(torch.float64).numpy()
    logp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    order = np.lexsort((np.arange(x.size), -x))[:TOP_K]
    return [int(i) for i in order], [r6(logp[i]) for i in order]


def top2_margin(logits_row: torch.Tensor) -> float:
    x = logits_row.detach().to(torch.float64)
    a, b = torch.topk(x, 2).values.tolist()
    return a - b


def argmax(logits_row: torch.Tensor) -> int:
    # torch.argmax returns the first (lowest) index among equal maxima
    return int(torch.argmax(logits_row).item())


@torch.inference_mode()
def run_case(model, ids: list[int]):
    """Prompt logits at every position, then GREEDY_TOKENS greedy steps on the KV cache (no EOS
    stop). Returns (prompt logits [n, vocab], greedy ids, smallest top-2 logit gap along them)."""
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    logits = out.logits[0].float()
    past = out.past_key_values
    row = logits[-1]
    greedy, margins = [], []
    for step in range(GREEDY_TOKENS):
        margins.append(top2_margin(row))
        nxt = argmax(row)
        greedy.append(nxt)
        if step + 1 == GREEDY_TOKENS:
            break
        out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        row = out.logits[0, -1].float()
    return logits, greedy, min(margins)


def write_reference(model_spec: Model, gguf: Path, cases: list[dict], tok, out: Path, log=print) -> None:
    """`cases`: [{"id", "text", "token_ids"}] (token ids already made). Fills reference.json,
    <case>.last_logits.f32 and greedy_min_margin.json."""
    model = load_model(gguf)
    verify_weights(model, gguf)
    folder = out / model_spec.folder
    doc_cases, margins = [], {}
    for case in cases:
        ids = case["token_ids"]
        logits, greedy, margin = run_case(model, ids)
        positions = []
        for i in range(len(ids)):
            top_ids, top_lp = top_k(logits[i])
            positions.append({"top_ids": top_ids, "top_logprobs": top_lp})
        write_f32(folder / f"{case['id']}.last_logits.f32", logits[-1].numpy())
        doc_cases.append(
            {
                "id": case["id"],
                "text": case["text"],
                "token_ids": ids,
                "positions": positions,
                "greedy_ids": greedy,
                "greedy_text": tok.decode(greedy, skip_special_tokens=False),
            }
        )
        margins[case["id"]] = r6(margin)
        log(f"  {model_spec.folder}/{case['id']}: {len(ids)} tokens, greedy min margin {margin:.4f}")
    doc = {
        "model": model_spec.file,
        "reference": REFERENCE_NOTE,
        "transformers": version("transformers"),
        "cases": doc_cases,
    }
    write_json(folder / "reference.json", doc, ascii_only=True)
    write_json(folder / "greedy_min_margin.json", margins)
