"""Builds `tests/data/tiny/qwen35mtp-tiny/`: qwen35-tiny (the same spec, seed and weights) with a
multi-token-prediction (MTP) block, as real Qwen3.5 checkpoints carry one, converted by llama.cpp's
own `convert_hf_to_gguf.py` without `--no-mtp` (it appends the block as layer `n_layers`, with
`nextn.eh_proj` / `enorm` / `hnorm` / `shared_head_norm`), and the MTP block's reference logits.

transformers loads Qwen3.5 checkpoints without their `mtp.*` weights (`_keys_to_ignore_on_load_
unexpected`) and has no MTP forward, so the reference is assembled from transformers' own modules:
the block is a `Qwen3_5DecoderLayer` of the full-attention kind, its input `fc(cat(norm_e(embed(x_p)),
norm_h(h_{p-1})))` (`Qwen3_5RMSNorm`s, `nn.Linear`), its output `lm_head(norm(.))`, where `h_{p-1}` is
the main model's last hidden state (after its final norm) at the position before token `x_p`, as
DeepSeek-V3's MTP and vLLM's Qwen3-Next MTP define it: for a prompt `x_0..x_{n-1}` the block reads the
pairs `(h_{p-1}, x_p)`, `p = 1..n-1`, under causal attention among themselves (rotary positions
`0..n-2`; only their differences matter), and its output at pair `p` predicts `x_{p+1}`.

    nice -n 10 /root/refvenv/bin/python tools/models/make_mtp.py

The random MTP weights: linear layers ~ N(0, initializer_range), RMSNorm gains ~ U(0.5, 1.5) stored
as gain - 1 (Qwen3.5's (1 + w) norms; the output norm's gain x 3, as the main model's final norm),
from their own seed. Deterministic."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "reference"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import make_tiny  # noqa: E402
from common import write_f32, write_json  # noqa: E402
from specs import SPECS, build_model  # noqa: E402
from tokenizer import save_tokenizer  # noqa: E402

NAME = "qwen35mtp-tiny"
MTP_SEED = 20240624
OUT_NORM_GAIN = 3.0  # qwen35-tiny's final norm's (specs.Spec.out_norm_gain)


def mtp_modules(config):
    """The MTP block's modules, from transformers' own classes: fc, the two input norms, the
    decoder layer (full attention) and the output norm."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

    full = config.layer_types.index("full_attention")
    d = config.hidden_size
    return {
        "fc": torch.nn.Linear(2 * d, d, bias=False),
        "pre_fc_norm_embedding": Qwen3_5RMSNorm(d, eps=config.rms_norm_eps),
        "pre_fc_norm_hidden": Qwen3_5RMSNorm(d, eps=config.rms_norm_eps),
        "layers.0": Qwen3_5DecoderLayer(config, layer_idx=full),
        "norm": Qwen3_5RMSNorm(d, eps=config.rms_norm_eps),
    }


@torch.no_grad()
def random_mtp(config) -> dict[str, torch.Tensor]:
    """`mtp.*` tensor name -> random weights (see the module docstring)."""
    gen = torch.Generator().manual_seed(MTP_SEED)
    out = {}
    for prefix, module in mtp_modules(config).items():
        for name, p in module.named_parameters():
            if prefix == "norm":  # the output norm, as the main model's final one: x out_norm_gain
                w = (0.5 + torch.rand(p.shape, generator=gen)) * OUT_NORM_GAIN - 1.0
            elif "norm" in name or prefix.startswith("pre_fc_norm"):
                w = 0.5 + torch.rand(p.shape, generator=gen) - 1.0
            else:
                w = torch.randn(p.shape, generator=gen) * config.initializer_range
            out[f"mtp.{prefix}.{name}"] = w.to(torch.float32).contiguous()
    return out


@torch.no_grad()
def mtp_logits(model, mtp: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """The MTP block's logits at pairs p = 1..n-1 ([n-1, vocab]) after the prompt `ids`."""
    config = model.config
    modules = mtp_modules(config)
    for prefix, module in modules.items():
        module.load_state_dict({k[len(f"mtp.{prefix}."):]: v for k, v in mtp.items()
                                if k.startswith(f"mtp.{prefix}.")}, strict=True)
        module.eval()
    x = torch.tensor([ids])
    h = model.model(input_ids=x).last_hidden_state  # after the final norm
    n = len(ids)
    e = model.model.embed_tokens(x[:, 1:])
    u = modules["fc"](torch.cat([modules["pre_fc_norm_embedding"](e),
                                 modules["pre_fc_norm_hidden"](h[:, :-1])], dim=-1))
    m = n - 1
    position_ids = torch.arange(m).view(1, 1, -1).expand(4, 1, -1)
    text_positions, rope_positions = position_ids[0], position_ids[1:]
    position_embeddings = model.model.rotary_emb(u, rope_positions)
    mask = torch.full((m, m), float("-inf")).triu(1).view(1, 1, m, m)
    y = modules["layers.0"](u, position_embeddings=position_embeddings, attention_mask=mask,
                            position_ids=text_positions)
    return model.lm_head(modules["norm"](y))[0]


def main() -> None:
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    base = next(s for s in SPECS if s.name == "qwen35-tiny")
    spec = dataclasses.replace(base, name=NAME, converter_args=())
    cases = make_tiny.prompt_cases()
    folder = make_tiny.REPO / "tests/data/tiny" / NAME
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / NAME
        model = build_model(spec)
        model.save_pretrained(str(hf_dir))
        save_tokenizer(hf_dir)
        weights = hf_dir / "model.safetensors"
        state = load_file(str(weights))
        mtp = random_mtp(model.config)
        save_file({**state, **mtp}, str(weights), metadata={"format": "pt"})
        cfg_path = hf_dir / "config.json"
        saved = json.loads(cfg_path.read_text())
        saved["mtp_num_hidden_layers"] = 1
        cfg_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        make_tiny.convert(make_tiny.DEFAULT_LLAMA_CPP, hf_dir, folder / "model.gguf", spec)
        ref = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32,
                                                   attn_implementation="eager")
        ref.eval()
        for k, v in model.state_dict().items():
            assert torch.equal(ref.state_dict()[k], v), k
        stats = make_tiny.reference(ref, cases, folder, "model.gguf")
        doc = []
        top1 = []
        for case in cases:
            ids = case["token_ids"]
            if len(ids) < 2:
                continue
            logits = mtp_logits(ref, mtp, ids)
            write_f32(folder / f"{case['id']}.mtp_logits.f32", logits.numpy().reshape(-1))
            top1 += torch.softmax(logits.double(), -1).max(-1).values.tolist()
            doc.append({"id": case["id"], "token_ids": ids, "pairs": len(ids) - 1})
        write_json(folder / "mtp_reference.json", {
            "what": "the MTP block's logits at each pair (h_{p-1}, x_p), p = 1..n-1, of each prompt "
                    "(<id>.mtp_logits.f32: pairs x vocab, row-major); see tools/models/make_mtp.py",
            "cases": doc,
            "mean_top1_prob": float(np.mean(top1)),
        })
        write_json(folder / "spec.json", {"name": NAME, "base": "qwen35-tiny", "mtp_seed": MTP_SEED,
                                          "stats": stats, "generator": "tools/models/make_mtp.py"})
        print(f"{NAME}: wrote {folder}; MTP mean top-1 {np.mean(top1):.3f}; main {stats['mean_top1_prob']}")


if __name__ == "__main__":
    main()
