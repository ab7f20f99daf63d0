"""A random model of a real model's shape, for speed measurements only (speed does not depend on
the weights' values): HF transformers builds it (`Qwen3ForCausalLM` with Qwen3-1.7B's config),
llama.cpp's `convert_hf_to_gguf.py` converts it to F16, and `llama-quantize` makes the types asked
for (the 1- and 2-bit i-quants with an importance matrix from `llama-imatrix`).

    LLAMA_BIN=~/.cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp/build/bin \\
      nice -n 10 /root/refvenv/bin/python tools/bench/real_shape.py --out /tmp/qwen3-1.7b Q4_K_M IQ4_XS

Writes `<out>/model-F16.gguf` and `<out>/model-<TYPE>.gguf`. Needs ~14 GB of memory and ~3.5 GB of
disk per F16 copy.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "models"))
sys.path.insert(0, str(HERE.parent / "reference"))

import torch  # noqa: E402

from make_tiny import DEFAULT_LLAMA_CPP, convert  # noqa: E402
from specs import Spec  # noqa: E402
from tokenizer import save_tokenizer  # noqa: E402

# Qwen3-1.7B's config.json (the shape; rope and norms as published).
QWEN3_1_7B = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
    max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, attention_bias=False,
    initializer_range=0.02, use_cache=True,
)
NEED_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--bin", type=Path, default=Path(os.environ.get("LLAMA_BIN", "")))
    ap.add_argument("types", nargs="*", help="llama-quantize file types (Q4_K_M, IQ4_XS, ...)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    f16 = args.out / "model-F16.gguf"
    if not f16.exists():
        from transformers import AutoConfig, Qwen3ForCausalLM

        torch.manual_seed(0)
        config = AutoConfig.for_model("qwen3", **QWEN3_1_7B)
        config.architectures = ["Qwen3ForCausalLM"]
        model = Qwen3ForCausalLM(config).to(torch.float16)
        hf = args.out / "hf"
        model.save_pretrained(str(hf))
        save_tokenizer(hf)
        del model
        spec = Spec(name="qwen3-1.7b-shape", arch="Qwen3ForCausalLM", seed=0, config={}, tests="")
        tmp = args.out / "model-F32.gguf"
        convert(DEFAULT_LLAMA_CPP, hf, tmp, spec)
        subprocess.run([str(args.bin / "llama-quantize"), str(tmp), str(f16), "F16", "2"], check=True,
                       capture_output=True)
        tmp.unlink()
    imatrix = args.out / "imatrix.gguf"
    for ty in args.types:
        out = args.out / f"model-{ty}.gguf"
        if out.exists():
            continue
        extra = []
        if ty in NEED_IMATRIX:
            if not imatrix.exists():
                text = args.out / "calibration.txt"
                text.write_text((HERE.parent / "models/README.md").read_text())
                subprocess.run([str(args.bin / "llama-imatrix"), "-m", str(f16), "-f", str(text), "-o",
                                str(imatrix), "-c", "128", "--chunks", "4", "-t", "2", "--no-ppl"], check=True,
                               capture_output=True)
            extra = ["--imatrix", str(imatrix)]
        subprocess.run([str(args.bin / "llama-quantize"), *extra, str(f16), str(out), ty, "2"], check=True,
                       capture_output=True)
        print(f"{out}: {out.stat().st_size / 1e9:.2f} GB", flush=True)


if __name__ == "__main__":
    main()
