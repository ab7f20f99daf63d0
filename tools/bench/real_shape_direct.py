"""A random model of Qwen3-1.7B's shape written straight into an F16 GGUF with gguf-py and numpy
(no torch, no transformers: speed does not depend on the weights' values), with the real Qwen2
vocabulary from llama.cpp's `models/ggml-vocab-qwen2.gguf`; `llama-quantize` then makes the
types asked for. `--gpt-oss` writes gpt-oss-20b's shape into `model-MXFP4_MOE.gguf` (experts
MXFP4, every other matrix Q8_0, as llama-quantize's MXFP4_MOE and the published file have
them; 12 GB, a few minutes). `--moe` writes Qwen3-30B-A3B's shape instead (48 layers, 128 experts of 768,
8 used, an untied head) straight into `model-Q4_K_M.gguf`: random Q4_K and Q6_K blocks in the
types llama-quantize's Q4_K_M rules give each tensor, streamed to disk (an F16 copy would be
61 GB, and llama-quantize takes over an hour for it on 2 cores). The tensors, names and metadata are those `convert_hf_to_gguf.py` writes for
`Qwen3ForCausalLM` (see `real_shape.py`, which goes through transformers and the converter and
gives the same shapes).

    LLAMA=~/.cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp
    PYTHONPATH=$LLAMA/gguf-py python tools/bench/real_shape_direct.py --llama $LLAMA \\
        --out /tmp/qwen3-1.7b Q4_K_M IQ4_XS IQ4_NL

Needs numpy and pyyaml, ~4 GB of memory and ~3.5 GB of disk for the F16 copy (`--moe`: ~1 GB of
memory and 18 GB of disk, a few minutes).
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter, LlamaFileType

# Qwen3-1.7B's config.json (the shape).
VOCAB, HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 151936, 2048, 6144, 28, 16, 8, 128
TOKENIZER_KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.bos_token_id",
]


def add_metadata(w: GGUFWriter, name: str, heads: int, kv_heads: int, layers: int, ffn: int,
                 file_type: LlamaFileType, vocab_file: Path) -> None:
    w.add_name(name)
    w.add_context_length(40960)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(file_type)
    add_vocab(w, vocab_file)


def add_vocab(w: GGUFWriter, vocab_file: Path, size: int | None = None) -> None:
    """The tokenizer keys of `vocab_file`, its token list padded with reserved control tokens
    up to `size` where given (so the embedding and the head have a model's real size)."""
    vocab = GGUFReader(str(vocab_file))
    tokens = list(vocab.fields["tokenizer.ggml.tokens"].contents())
    types = list(vocab.fields["tokenizer.ggml.token_type"].contents())
    extra = (size or len(tokens)) - len(tokens)
    tokens += [f"<|reserved_{i}|>" for i in range(extra)]
    types += [3] * extra  # control
    for key in TOKENIZER_KEYS:
        value = vocab.fields[key].contents()
        if key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            w.add_string(key, value)
        elif key == "tokenizer.ggml.tokens":
            w.add_token_list(tokens)
        elif key == "tokenizer.ggml.token_type":
            w.add_token_types(types)
        elif key == "tokenizer.ggml.merges":
            w.add_token_merges(value)
        else:
            w.add_uint32(key, int(value))


def write_f16(path: Path, vocab_file: Path) -> None:
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "qwen3")
    add_metadata(w, "qwen3-1.7b-shape-random", HEADS, KV_HEADS, LAYERS, FFN,
                 LlamaFileType.MOSTLY_F16, vocab_file)

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


# Qwen3-30B-A3B's config.json (the shape of the mixture of experts).
MOE_LAYERS, MOE_HEADS, MOE_KV_HEADS, MOE_FFN = 48, 32, 4, 6144
EXPERTS, EXPERTS_USED, EXPERT_FFN = 128, 8, 768
# Block sizes: (elements, bytes) of Q4_K and Q6_K.
BLOCK = {GGMLQuantizationType.Q4_K: (256, 144), GGMLQuantizationType.Q6_K: (256, 210)}


def q4_k_m_type(name: str, layer: int | None) -> GGMLQuantizationType:
    """The type `llama-quantize ... Q4_K_M` gives a tensor of this model (llama-quant.cpp's
    rules, without an importance matrix): the head Q6_K; attn_v and ffn_down(_exps) Q6_K in the
    layers `use_more_bits` picks (the first and last eighth, every third between), else Q4_K;
    everything else Q4_K. (Checked against llama-quantize's log on this shape's first layers.)"""
    if name == "output.weight":
        return GGMLQuantizationType.Q6_K
    n = MOE_LAYERS
    more_bits = layer is not None and (layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2)
    if (".attn_v." in name or ".ffn_down" in name) and more_bits:
        return GGMLQuantizationType.Q6_K
    return GGMLQuantizationType.Q4_K


def random_blocks(rng: np.random.Generator, ty: GGMLQuantizationType, n_blocks: int) -> np.ndarray:
    """Random codes and scales with fixed, finite f16 super-block scales (values of roughly
    the F16 model's spread)."""
    size = BLOCK[ty][1]
    data = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).copy().reshape(n_blocks, size)
    if ty == GGMLQuantizationType.Q4_K:  # d, dmin, scales[12], qs[128]
        data[:, 0:2] = np.frombuffer(np.float16(1e-4).tobytes(), dtype=np.uint8)
        data[:, 2:4] = np.frombuffer(np.float16(1e-4).tobytes(), dtype=np.uint8)
    else:  # ql[128], qh[64], scales[16], d
        data[:, 208:210] = np.frombuffer(np.float16(6.5e-5).tobytes(), dtype=np.uint8)
    return data


def write_moe_q4_k_m(path: Path, vocab_file: Path) -> None:
    """Qwen3-30B-A3B's tensors as the converter names them, written straight in the types
    llama-quantize's Q4_K_M gives them (norms and the router F32, as it leaves them). Tensors
    are streamed: one at a time in memory."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "qwen3moe")
    add_metadata(w, "qwen3-30b-a3b-shape-random", MOE_HEADS, MOE_KV_HEADS, MOE_LAYERS, MOE_FFN,
                 LlamaFileType.MOSTLY_Q4_K_M, vocab_file)
    w.add_quantization_version(2)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(EXPERTS_USED)
    w.add_expert_feed_forward_length(EXPERT_FFN)

    # (name, dims outermost first, layer, "matrix" / "ones" / "f32")
    plan: list[tuple[str, tuple[int, ...], int | None, str]] = [
        ("token_embd.weight", (VOCAB, HIDDEN), None, "matrix")]
    for i in range(MOE_LAYERS):
        b = f"blk.{i}"
        plan += [
            (f"{b}.attn_norm.weight", (HIDDEN,), i, "ones"),
            (f"{b}.attn_q.weight", (MOE_HEADS * HEAD_DIM, HIDDEN), i, "matrix"),
            (f"{b}.attn_k.weight", (MOE_KV_HEADS * HEAD_DIM, HIDDEN), i, "matrix"),
            (f"{b}.attn_v.weight", (MOE_KV_HEADS * HEAD_DIM, HIDDEN), i, "matrix"),
            (f"{b}.attn_output.weight", (HIDDEN, MOE_HEADS * HEAD_DIM), i, "matrix"),
            (f"{b}.attn_q_norm.weight", (HEAD_DIM,), i, "ones"),
            (f"{b}.attn_k_norm.weight", (HEAD_DIM,), i, "ones"),
            (f"{b}.ffn_norm.weight", (HIDDEN,), i, "ones"),
            (f"{b}.ffn_gate_inp.weight", (EXPERTS, HIDDEN), i, "f32"),
            (f"{b}.ffn_gate_exps.weight", (EXPERTS, EXPERT_FFN, HIDDEN), i, "matrix"),
            (f"{b}.ffn_up_exps.weight", (EXPERTS, EXPERT_FFN, HIDDEN), i, "matrix"),
            (f"{b}.ffn_down_exps.weight", (EXPERTS, HIDDEN, EXPERT_FFN), i, "matrix"),
        ]
    plan += [("output_norm.weight", (HIDDEN,), None, "ones"),
             ("output.weight", (VOCAB, HIDDEN), None, "matrix")]

    def byte_shape(shape: tuple[int, ...], ty: GGMLQuantizationType) -> tuple[int, ...]:
        elems, size = BLOCK[ty]
        return (*shape[:-1], shape[-1] // elems * size)

    for name, shape, layer, kind in plan:
        if kind == "matrix":
            ty = q4_k_m_type(name, layer)
            bs = byte_shape(shape, ty)
            w.add_tensor_info(name, bs, np.dtype(np.uint8), int(np.prod(bs)), raw_dtype=ty)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, layer, kind in plan:
        if kind == "ones":
            data = np.ones(shape, dtype=np.float32)
        elif kind == "f32":
            data = rng.standard_normal(shape, dtype=np.float32) * 0.02
        else:
            ty = q4_k_m_type(name, layer)
            blocks = int(np.prod(shape)) // BLOCK[ty][0]
            data = random_blocks(rng, ty, blocks).reshape(byte_shape(shape, ty))
        w.write_tensor_data(data)
    w.close()


# gpt-oss-20b's config.json (the shape), and the types llama-quantize's MXFP4_MOE gives it
# (llama-quant.cpp: the experts MXFP4, every other matrix Q8_0; the router, norms, biases and
# sinks stay F32), as in the published gpt-oss-20b-mxfp4.gguf (12.1 GB).
OSS_VOCAB, OSS_HIDDEN, OSS_LAYERS, OSS_HEADS, OSS_KV_HEADS, OSS_HEAD_DIM = 201088, 2880, 24, 64, 8, 64
OSS_EXPERTS, OSS_EXPERTS_USED, OSS_EXPERT_FFN, OSS_WINDOW = 32, 4, 2880, 128
# Block sizes: (elements, bytes).
OSS_BLOCK = {GGMLQuantizationType.Q8_0: (32, 34), GGMLQuantizationType.MXFP4: (32, 17)}


def random_oss_blocks(rng: np.random.Generator, ty: GGMLQuantizationType, n_blocks: int) -> np.ndarray:
    """Random codes with fixed, finite scales: Q8_0 an f16 0.00025 (weights up to ~0.03),
    MXFP4 an E8M0 2^-8 (the same spread)."""
    size = OSS_BLOCK[ty][1]
    data = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).copy().reshape(n_blocks, size)
    if ty == GGMLQuantizationType.Q8_0:
        data[:, 0:2] = np.frombuffer(np.float16(2.5e-4).tobytes(), dtype=np.uint8)
    else:
        data[:, 0] = 127 - 8
    return data


def write_gpt_oss_mxfp4(path: Path, vocab_file: Path) -> None:
    """gpt-oss-20b's tensors as the converter names them (`tests/data/tiny/gptoss-tiny` was
    made through it), streamed one at a time. The vocabulary is Qwen2's (the sdist has no
    o200k file) with reserved control tokens up to gpt-oss's 201088, so the embedding and the
    head have their real size; the tokenizer's speed is not measured."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "gpt-oss")
    w.add_name("gpt-oss-20b-shape-random")
    w.add_context_length(131072)
    w.add_embedding_length(OSS_HIDDEN)
    w.add_block_count(OSS_LAYERS)
    w.add_feed_forward_length(OSS_EXPERT_FFN)
    w.add_head_count(OSS_HEADS)
    w.add_head_count_kv(OSS_KV_HEADS)
    w.add_key_length(OSS_HEAD_DIM)
    w.add_value_length(OSS_HEAD_DIM)
    w.add_rope_freq_base(150000.0)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    w.add_float32("gpt-oss.rope.scaling.yarn_beta_fast", 32.0)
    w.add_float32("gpt-oss.rope.scaling.yarn_beta_slow", 1.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_sliding_window(OSS_WINDOW)
    w.add_expert_count(OSS_EXPERTS)
    w.add_expert_used_count(OSS_EXPERTS_USED)
    w.add_expert_feed_forward_length(OSS_EXPERT_FFN)
    w.add_file_type(LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_quantization_version(2)
    add_vocab(w, vocab_file, OSS_VOCAB)

    q8, mx = GGMLQuantizationType.Q8_0, GGMLQuantizationType.MXFP4
    q_dim, kv_dim = OSS_HEADS * OSS_HEAD_DIM, OSS_KV_HEADS * OSS_HEAD_DIM
    # (name, dims outermost first, type or None for F32 (ones when "norm" is in the name))
    plan: list[tuple[str, tuple[int, ...], GGMLQuantizationType | None]] = [
        ("token_embd.weight", (OSS_VOCAB, OSS_HIDDEN), q8)]
    for i in range(OSS_LAYERS):
        b = f"blk.{i}"
        plan += [
            (f"{b}.attn_norm.weight", (OSS_HIDDEN,), None),
            (f"{b}.attn_q.weight", (q_dim, OSS_HIDDEN), q8),
            (f"{b}.attn_q.bias", (q_dim,), None),
            (f"{b}.attn_k.weight", (kv_dim, OSS_HIDDEN), q8),
            (f"{b}.attn_k.bias", (kv_dim,), None),
            (f"{b}.attn_v.weight", (kv_dim, OSS_HIDDEN), q8),
            (f"{b}.attn_v.bias", (kv_dim,), None),
            (f"{b}.attn_output.weight", (OSS_HIDDEN, q_dim), q8),
            (f"{b}.attn_output.bias", (OSS_HIDDEN,), None),
            (f"{b}.attn_sinks.weight", (OSS_HEADS,), None),
            (f"{b}.post_attention_norm.weight", (OSS_HIDDEN,), None),
            (f"{b}.ffn_gate_inp.weight", (OSS_EXPERTS, OSS_HIDDEN), None),
            (f"{b}.ffn_gate_inp.bias", (OSS_EXPERTS,), None),
            (f"{b}.ffn_gate_exps.weight", (OSS_EXPERTS, OSS_EXPERT_FFN, OSS_HIDDEN), mx),
            (f"{b}.ffn_gate_exps.bias", (OSS_EXPERTS, OSS_EXPERT_FFN), None),
            (f"{b}.ffn_up_exps.weight", (OSS_EXPERTS, OSS_EXPERT_FFN, OSS_HIDDEN), mx),
            (f"{b}.ffn_up_exps.bias", (OSS_EXPERTS, OSS_EXPERT_FFN), None),
            (f"{b}.ffn_down_exps.weight", (OSS_EXPERTS, OSS_HIDDEN, OSS_EXPERT_FFN), mx),
            (f"{b}.ffn_down_exps.bias", (OSS_EXPERTS, OSS_HIDDEN), None),
        ]
    plan += [("output_norm.weight", (OSS_HIDDEN,), None),
             ("output.weight", (OSS_VOCAB, OSS_HIDDEN), q8)]

    def byte_shape(shape: tuple[int, ...], ty: GGMLQuantizationType) -> tuple[int, ...]:
        elems, size = OSS_BLOCK[ty]
        return (*shape[:-1], shape[-1] // elems * size)

    for name, shape, ty in plan:
        if ty is None:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            bs = byte_shape(shape, ty)
            w.add_tensor_info(name, bs, np.dtype(np.uint8), int(np.prod(bs)), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, ty in plan:
        if ty is not None:
            blocks = int(np.prod(shape)) // OSS_BLOCK[ty][0]
            data = random_oss_blocks(rng, ty, blocks).reshape(byte_shape(shape, ty))
        elif "norm" in name:
            data = np.ones(shape, dtype=np.float32)
        else:
            data = rng.standard_normal(shape, dtype=np.float32) * 0.02
        w.write_tensor_data(data)
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--llama", type=Path, required=True, help="the sdist's vendor/llama.cpp")
    ap.add_argument("--moe", action="store_true", help="Qwen3-30B-A3B's shape, Q4_K_M only")
    ap.add_argument("--gpt-oss", action="store_true", help="gpt-oss-20b's shape, MXFP4_MOE only")
    ap.add_argument("types", nargs="*", help="llama-quantize file types (Q4_K_M, IQ4_XS, ...)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = args.llama / "models" / "ggml-vocab-qwen2.gguf"
    if args.gpt_oss:
        dst = args.out / "model-MXFP4_MOE.gguf"
        if not dst.exists():
            write_gpt_oss_mxfp4(dst, vocab)
        return
    if args.moe:
        dst = args.out / "model-Q4_K_M.gguf"
        if not dst.exists():
            write_moe_q4_k_m(dst, vocab)
        return
    f16 = args.out / "model-F16.gguf"
    if not f16.exists():
        write_f16(f16, vocab)
    for ty in args.types:
        dst = args.out / f"model-{ty}.gguf"
        if not dst.exists():
            quantize = args.llama / "build" / "bin" / "llama-quantize"
            subprocess.run([str(quantize), str(f16), str(dst), ty, "2"], check=True)


if __name__ == "__main__":
    main()
