"""A random model of Qwen3-1.7B's shape written straight into an F16 GGUF with gguf-py and numpy
(no torch, no transformers: speed does not depend on the weights' values), with the real Qwen2
vocabulary from llama.cpp's `models/ggml-vocab-qwen2.gguf`; `llama-quantize` then makes the
types asked for. The tensors, names and metadata are those `convert_hf_to_gguf.py` writes for
`Qwen3ForCausalLM` (see `real_shape.py`, which goes through transformers and the converter and
gives the same shapes).

    LLAMA=~/.cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp
    PYTHONPATH=$LLAMA/gguf-py python tools/bench/real_shape_direct.py --llama $LLAMA \\
        --out /tmp/qwen3-1.7b Q4_K_M IQ4_XS IQ4_NL

Needs numpy and pyyaml, ~4 GB of memory and ~3.5 GB of disk for the F16 copy.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter, LlamaFileType

# Qwen3-1.7B's config.json (the shape).
VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 151936, 2048, 6144, 28, 16, 8, 128
TOKENIZER_KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.bos_token_id",
]


def write_f16(path: Path, vocab_file: Path) -> None:
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "qwen3")
    w.add_name("qwen3-1.7b-shape-random")
    w.add_context_length(40960)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(LlamaFileType.MOSTLY_F16)
    vocab = GGUFReader(str(vocab_file))
    for key in TOKENIZER_KEYS:
        field = vocab.fields[key]
        value = field.contents()
        if key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            w.add_string(key, value)
        elif key == "tokenizer.ggml.tokens":
            w.add_token_list(value)
        elif key == "tokenizer.ggml.token_type":
            w.add_token_types(value)
        elif key == "tokenizer.ggml.merges":
            w.add_token_merges(value)
        else:
            w.add_uint32(key, int(value))

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", matrix(VOCAB, HIDDEN))
    for i in range(LAYERS):
        b = f"blk.{i}"
        w.add_tensor(f"{b}.attn_norm.weight", ones(HIDDEN))
        w.add_tensor(f"{b}.attn_q.weight", matrix(HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(f"{b}.attn_k.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(f"{b}.attn_v.weight", matrix(KV_HEADS * HEAD_DIM, HIDDEN))
        w.add_tensor(f"{b}.attn_output.weight", matrix(HIDDEN, HEADS * HEAD_DIM))
        w.add_tensor(f"{b}.attn_q_norm.weight", ones(HEAD_DIM))
        w.add_tensor(f"{b}.attn_k_norm.weight", ones(HEAD_DIM))
        w.add_tensor(f"{b}.ffn_norm.weight", ones(HIDDEN))
        w.add_tensor(f"{b}.ffn_gate.weight", matrix(FFN, HIDDEN))
        w.add_tensor(f"{b}.ffn_up.weight", matrix(FFN, HIDDEN))
        w.add_tensor(f"{b}.ffn_down.weight", matrix(HIDDEN, FFN))
    w.add_tensor("output_norm.weight", ones(HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--llama", type=Path, required=True, help="the sdist's vendor/llama.cpp")
    ap.add_argument("types", nargs="*", help="llama-quantize file types (Q4_K_M, IQ4_XS, ...)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    f16 = args.out / "model-F16.gguf"
    if not f16.exists():
        write_f16(f16, args.llama / "models" / "ggml-vocab-qwen2.gguf")
    for ty in args.types:
        dst = args.out / f"model-{ty}.gguf"
        if not dst.exists():
            quantize = args.llama / "build" / "bin" / "llama-quantize"
            subprocess.run([str(quantize), str(f16), str(dst), ty, "2"], check=True)


if __name__ == "__main__":
    main()
