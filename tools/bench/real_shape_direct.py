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

`--dense qwen3-0.6b` writes Qwen3-0.6B's shape instead (d 1024, FFN 3072, 28 layers, 16 heads of
128 over 8 KV heads, tied 151936-row head) as `<out>/qwen3-0.6b-<TYPE>.gguf`.

Needs numpy and pyyaml, ~4 GB of memory and ~3.5 GB of disk for the F16 copy (`--moe`: ~1 GB of
memory and 18 GB of disk, a few minutes).

`--shape` writes a hybrid model's shape straight into `<out>/<shape>-<TYPE>.gguf`, TYPE Q4_K_M or
IQ4_XS (the types llama-quantize's rules give each tensor, streamed as for `--moe`; F16 also, for
llama-quantize): tensor names, shapes and metadata as the converter writes them (see
`tests/data/tiny/qwen35-tiny`, `qwen35moe-tiny` and `lfm2-tiny`, made through it), tensor order and key order as
llama-quantize leaves them; random codes with scales giving weights of ~0.026 standard deviation,
norms 1.
- `qwen35-4b`: Qwen3.5-4B (`qwen35`, as converted with `--no-mtp`): 32 layers of d 2560, FFN 9216;
  every 4th layer gated full attention (16 query heads of 256 with an output gate each, 4 KV heads,
  rope on 64 dims, theta 1e7), the others a gated delta net (16 key heads, 32 value heads of 128,
  conv 4); tied head; vocabulary 248320 (llama.cpp's qwen35 vocab file, padded with reserved
  control tokens). Q4_K_M 2.71 GB, IQ4_XS 2.53 GB, under a minute.
- `lfm2-1.2b`: LFM2-1.2B (`lfm2`): 16 layers of d 2048, FFN 8192; attention (32 heads of 64, 8 KV
  heads, q/k norms, theta 1e6) in layers 2, 5, 8, 10, 12, 14, gated short convolutions (L 3) in
  the others; tied head; vocabulary 65536 (Falcon's BPE list, padded). Q4_K_M 0.73 GB, IQ4_XS
  0.67 GB.
- `qwen35moe-35b-a3b`: Qwen3.5-35B-A3B (`qwen35moe`, as converted with `--no-mtp`; see
  `tests/data/tiny/qwen35moe-tiny`): qwen35-4b's hybrid layers at d 2048 over 40 layers (every 4th
  gated full attention, 16 query heads of 256 over 2 KV heads, rope on 64 dims, theta 1e7; the
  delta net 16 key heads and 32 value heads of 128, conv 4), the FFN of every layer routed: 256
  experts of 512 (stacked ffn_{gate,up,down}_exps), 8 used, an F32 router ffn_gate_inp, and a
  shared expert of 512 (ffn_{gate,up,down}_shexp) gated by ffn_gate_inp_shexp (F32; ne [d, 1] from
  the converter, [d] after llama-quantize, as written here); untied head; vocabulary 248320. No
  feed_forward_length key; expert_count, expert_used_count, expert_feed_forward_length,
  expert_shared_feed_forward_length. Q4_K_M (experts Q4_K, ffn_down_exps and ffn_down_shexp Q6_K
  in the `use_more_bits` layers of 40, output Q6_K, token_embd Q4_K) 21.2 GB (34.7 B parameters),
  under 2 minutes on 2 cores, 1.1 GB of memory (its F16 would be 69 GB).

    PYTHONPATH=$LLAMA/gguf-py python tools/bench/real_shape_direct.py --llama $LLAMA \\
        --out /tmp/realshape --shape qwen35-4b Q4_K_M IQ4_XS
    PYTHONPATH=$LLAMA/gguf-py python tools/bench/real_shape_direct.py --llama $LLAMA \\
        --out /tmp/realshape --shape qwen35moe-35b-a3b Q4_K_M

The type mixes were checked against llama-quantize itself on F16 files of the same layer layouts
(smaller widths; qwen35moe with 16 experts, as no n_expert == 8 rule applies to 256 either): the
same type, order, shape and metadata for every tensor and key, Q4_K_M and IQ4_XS. qwen35-4b and
lfm2-1.2b load and run in rill and in llama.cpp's llama-bench and llama-perplexity (finite logits);
qwen35moe-35b-a3b's Q4_K_M loads and runs in llama-bench. On an AMX CPU the sdist's llama.cpp build
segfaults on K-quant files unless run with `--repack 0` (or built without AMX, see
`real_shape_vs_llamacpp.sh`).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Dense:
    """A dense Qwen3 (or Qwen2) model's shape (its config.json); the head is tied to
    token_embd. Qwen2 has biases on its query, key and value products and no norms on its query
    and key heads."""
    key: str
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    arch: str = "qwen3"
    head_dim: int = HEAD_DIM


DENSE = {
    "qwen3-1.7b": Dense("qwen3-1.7b", HIDDEN, FFN, LAYERS, HEADS, KV_HEADS),
    # Qwen3-0.6B: the big-vocabulary, small-body shape of issue 41's decoding goal (its tied
    # 151936-row head is a quarter of its weights).
    "qwen3-0.6b": Dense("qwen3-0.6b", 1024, 3072, 28, 16, 8),
    # Qwen2.5-0.5B (and its Coder): the real file issue 41 measured (a 896-wide body, which
    # no K-quant's 256-element blocks divide, so llama-quantize's Q4_K_M makes the same
    # Q5_0/Q8_0/Q6_K/Q4_K mix as the published file).
    "qwen2.5-0.5b": Dense("qwen2.5-0.5b", 896, 4864, 24, 14, 2, arch="qwen2", head_dim=64),
}


def add_metadata(w: GGUFWriter, name: str, heads: int, kv_heads: int, layers: int, ffn: int,
                 file_type: LlamaFileType, vocab_file: Path, hidden: int = HIDDEN,
                 head_dim: int = HEAD_DIM) -> None:
    w.add_name(name)
    w.add_context_length(40960)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
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
        if key not in vocab.fields:  # Falcon's has no padding id
            continue
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


def write_f16(path: Path, vocab_file: Path, shape: Dense = DENSE["qwen3-1.7b"]) -> None:
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), shape.arch)
    d, heads, kv, hd = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim
    qwen2 = shape.arch == "qwen2"
    add_metadata(w, f"{shape.key}-shape-random", heads, kv, shape.layers, shape.ffn,
                 LlamaFileType.MOSTLY_F16, vocab_file, hidden=d, head_dim=hd)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w.add_tensor("token_embd.weight", matrix(VOCAB, d))
    for i in range(shape.layers):
        b = f"blk.{i}"
        w.add_tensor(f"{b}.attn_norm.weight", ones(d))
        w.add_tensor(f"{b}.attn_q.weight", matrix(heads * hd, d))
        w.add_tensor(f"{b}.attn_k.weight", matrix(kv * hd, d))
        w.add_tensor(f"{b}.attn_v.weight", matrix(kv * hd, d))
        w.add_tensor(f"{b}.attn_output.weight", matrix(d, heads * hd))
        if qwen2:
            for part, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
                bias = rng.standard_normal(rows, dtype=np.float32) * 0.02
                w.add_tensor(f"{b}.attn_{part}.bias", bias)
        else:
            w.add_tensor(f"{b}.attn_q_norm.weight", ones(hd))
            w.add_tensor(f"{b}.attn_k_norm.weight", ones(hd))
        w.add_tensor(f"{b}.ffn_norm.weight", ones(d))
        w.add_tensor(f"{b}.ffn_gate.weight", matrix(shape.ffn, d))
        w.add_tensor(f"{b}.ffn_up.weight", matrix(shape.ffn, d))
        w.add_tensor(f"{b}.ffn_down.weight", matrix(d, shape.ffn))
    w.add_tensor("output_norm.weight", ones(d))
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


# Hybrid shapes, written straight in llama-quantize's Q4_K_M or IQ4_XS mix (or F16): Qwen3.5-4B
# (`qwen35`: gated delta-net linear attention in 3 of every 4 layers, gated full attention in the
# 4th) and LFM2-1.2B (`lfm2`: gated short convolutions, grouped-query attention in 6 of 16 layers).
# Names, shapes and metadata are what llama.cpp's `convert_hf_to_gguf.py` writes for
# `Qwen3_5ForCausalLM` (as with `--no-mtp`: no MTP block) and `Lfm2ForCausalLM` (the contract of
# `tests/data/tiny/qwen35-tiny` and `lfm2-tiny`, made through that converter); tensors in the
# order llama-quantize writes them (by layer, then by name), `general.file_type` and
# `general.quantization_version` last, as llama-quantize leaves them.
@dataclass(frozen=True)
class Hybrid:
    key: str  # the --shape name
    arch: str
    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    rope_theta: float
    rms_eps: float
    attention_layers: tuple[int, ...]  # the full-attention layers; the others are recurrent
    vocab_file: str  # llama.cpp's models/ggml-vocab-<this>.gguf, padded to `vocab`
    # qwen35: partial rope, the gated delta net's conv kernel and heads (key dim = value dim)
    rope_dims: int = 0
    conv_kernel: int = 0
    k_heads: int = 0
    v_heads: int = 0
    k_dim: int = 0
    # lfm2: the short convolution's length
    l_cache: int = 0
    # qwen35moe: the routed FFN of every layer (ffn unused) and the shared expert; untied head
    experts: int = 0
    experts_used: int = 0
    expert_ffn: int = 0
    shexp_ffn: int = 0
    tied: bool = True
    # qwen35: the multi-token-prediction block after the layers (as converted without --no-mtp)
    mtp: bool = False

    @property
    def qwen35(self) -> bool:
        """qwen35 or qwen35moe: the same hybrid layers (gated delta net / gated attention)."""
        return self.arch in ("qwen35", "qwen35moe")


# Qwen3.5-4B's text config (transformers' Qwen3_5TextConfig with the published values): 32
# layers, every 4th full attention (16 query heads of 256 over 4 KV heads, a query and an output
# gate per head, rope on 64 of the 256 dims), 16 key heads and 32 value heads of 128 in the delta
# net, a tied head, the real vocabulary size (the Qwen2 token list under Qwen3.5's pre-tokenizer,
# padded with reserved control tokens).
QWEN35_4B = Hybrid(
    key="qwen35-4b", arch="qwen35", vocab=248320, hidden=2560, ffn=9216, layers=32, heads=16,
    kv_heads=4, head_dim=256, context=262144, rope_theta=10_000_000.0, rms_eps=1e-6,
    attention_layers=tuple(i for i in range(32) if (i + 1) % 4 == 0), vocab_file="qwen35",
    rope_dims=64, conv_kernel=4, k_heads=16, v_heads=32, k_dim=128)
# LFM2-1.2B's config: 16 layers, attention (32 heads of 64 over 8 KV heads, q/k norms) in layers
# 2, 5, 8, 10, 12, 14, gated short convolutions (L 3) elsewhere, FFN 8192 (block_ff_dim 12288
# auto-adjusted: 2/3, x1.0, up to a multiple of 256), a tied head. The vocabulary (65536) is
# Falcon's byte-level BPE list (65024) padded with reserved control tokens: LFM2's own is not in
# llama.cpp's models/ and Qwen2's is larger than 65536.
LFM2_1_2B = Hybrid(
    key="lfm2-1.2b", arch="lfm2", vocab=65536, hidden=2048, ffn=8192, layers=16, heads=32,
    kv_heads=8, head_dim=64, context=128000, rope_theta=1_000_000.0, rms_eps=1e-5,
    attention_layers=(2, 5, 8, 10, 12, 14), vocab_file="falcon", l_cache=3)
# Qwen3.5-35B-A3B's text config (the public config.json's text_config; transformers'
# Qwen3_5MoeTextConfig defaults give the same except rope_theta 1e4 and 32768 positions): qwen35-4b's
# hybrid layers at d 2048 over 40 layers (every 4th full attention: 16 query heads of 256 with
# their gates over 2 KV heads, rope on 64 dims, theta 1e7; the delta net 16 key heads and 32 value
# heads of 128, conv 4), every layer's FFN routed: 256 experts of 512, 8 used, and a shared expert
# of 512 scaled by a sigmoid gate; an untied head; vocabulary 248320. As converted with `--no-mtp`
# (no MTP block).
QWEN35MOE_35B_A3B = Hybrid(
    key="qwen35moe-35b-a3b", arch="qwen35moe", vocab=248320, hidden=2048, ffn=0, layers=40, heads=16,
    kv_heads=2, head_dim=256, context=262144, rope_theta=10_000_000.0, rms_eps=1e-6,
    attention_layers=tuple(i for i in range(40) if (i + 1) % 4 == 0), vocab_file="qwen35",
    rope_dims=64, conv_kernel=4, k_heads=16, v_heads=32, k_dim=128,
    experts=256, experts_used=8, expert_ffn=512, shexp_ffn=512, tied=False)
# Qwen3.5-4B as converted with its MTP block (block 32: a gated-attention layer and a dense FFN,
# nextn.eh_proj [2 x 2560 -> 2560], enorm, hnorm, shared_head_norm; nextn_predict_layers 1).
QWEN35_4B_MTP = dataclasses.replace(QWEN35_4B, key="qwen35-4b-mtp", mtp=True)
HYBRIDS = {s.key: s for s in (QWEN35_4B, QWEN35_4B_MTP, LFM2_1_2B, QWEN35MOE_35B_A3B)}
HYBRID_FTYPES = {"Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M, "IQ4_XS": LlamaFileType.MOSTLY_IQ4_XS,
                 "F16": LlamaFileType.MOSTLY_F16}


def hybrid_plan(s: Hybrid) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, dims outermost first, kind) of every tensor, in llama-quantize's order. Kinds:
    "matrix" (quantized), "ones" (norms), "conv" (F32 conv taps), "ssm_a", "dt_bias", "router"
    (qwen35moe's F32 expert and shared-expert gates)."""
    d, hd = s.hidden, s.head_dim
    top = [("token_embd.weight", (s.vocab, d), "matrix"),
           ("output_norm.weight" if s.qwen35 else "token_embd_norm.weight", (d,), "ones")]
    if not s.tied:
        top.append(("output.weight", (s.vocab, d), "matrix"))
    plan: list[tuple[str, tuple[int, ...], str]] = sorted(top)
    for i in range(s.layers):
        b = f"blk.{i}"
        layer = [(f"{b}.attn_norm.weight", (d,), "ones")]
        if s.experts:  # routed experts (stacked, expert outermost) and the shared expert
            e, f, sf = s.experts, s.expert_ffn, s.shexp_ffn
            layer += [(f"{b}.ffn_gate_inp.weight", (e, d), "router"),
                      (f"{b}.ffn_gate_exps.weight", (e, f, d), "matrix"),
                      (f"{b}.ffn_up_exps.weight", (e, f, d), "matrix"),
                      (f"{b}.ffn_down_exps.weight", (e, d, f), "matrix"),
                      (f"{b}.ffn_gate_inp_shexp.weight", (1, d), "router"),
                      (f"{b}.ffn_gate_shexp.weight", (sf, d), "matrix"),
                      (f"{b}.ffn_up_shexp.weight", (sf, d), "matrix"),
                      (f"{b}.ffn_down_shexp.weight", (d, sf), "matrix")]
        else:
            layer += [(f"{b}.ffn_gate.weight", (s.ffn, d), "matrix"),
                      (f"{b}.ffn_up.weight", (s.ffn, d), "matrix"),
                      (f"{b}.ffn_down.weight", (d, s.ffn), "matrix")]
        layer.append((f"{b}.post_attention_norm.weight" if s.qwen35 else f"{b}.ffn_norm.weight",
                      (d,), "ones"))
        if i in s.attention_layers:
            q_rows = 2 * s.heads * hd if s.qwen35 else s.heads * hd  # qwen35: query + gate per head
            layer += [(f"{b}.attn_q.weight", (q_rows, d), "matrix"),
                      (f"{b}.attn_k.weight", (s.kv_heads * hd, d), "matrix"),
                      (f"{b}.attn_v.weight", (s.kv_heads * hd, d), "matrix"),
                      (f"{b}.attn_output.weight", (d, s.heads * hd), "matrix"),
                      (f"{b}.attn_q_norm.weight", (hd,), "ones"),
                      (f"{b}.attn_k_norm.weight", (hd,), "ones")]
        elif s.qwen35:
            key_dim, value_dim = s.k_heads * s.k_dim, s.v_heads * s.k_dim
            layer += [(f"{b}.attn_qkv.weight", (2 * key_dim + value_dim, d), "matrix"),
                      (f"{b}.attn_gate.weight", (value_dim, d), "matrix"),
                      (f"{b}.ssm_conv1d.weight", (2 * key_dim + value_dim, s.conv_kernel), "conv"),
                      (f"{b}.ssm_dt.bias", (s.v_heads,), "dt_bias"),
                      (f"{b}.ssm_a", (s.v_heads,), "ssm_a"),
                      (f"{b}.ssm_beta.weight", (s.v_heads, d), "matrix"),
                      (f"{b}.ssm_alpha.weight", (s.v_heads, d), "matrix"),
                      (f"{b}.ssm_norm.weight", (s.k_dim,), "ones"),
                      (f"{b}.ssm_out.weight", (d, value_dim), "matrix")]
        else:
            layer += [(f"{b}.shortconv.conv.weight", (d, s.l_cache), "conv"),
                      (f"{b}.shortconv.in_proj.weight", (3 * d, d), "matrix"),
                      (f"{b}.shortconv.out_proj.weight", (d, d), "matrix")]
        plan += sorted(layer)
    if s.mtp:
        b, hd = f"blk.{s.layers}", s.head_dim
        plan += sorted([(f"{b}.attn_norm.weight", (d,), "ones"),
                        (f"{b}.attn_q.weight", (2 * s.heads * hd, d), "matrix"),
                        (f"{b}.attn_k.weight", (s.kv_heads * hd, d), "matrix"),
                        (f"{b}.attn_v.weight", (s.kv_heads * hd, d), "matrix"),
                        (f"{b}.attn_output.weight", (d, s.heads * hd), "matrix"),
                        (f"{b}.attn_q_norm.weight", (hd,), "ones"),
                        (f"{b}.attn_k_norm.weight", (hd,), "ones"),
                        (f"{b}.post_attention_norm.weight", (d,), "ones"),
                        (f"{b}.ffn_gate.weight", (s.ffn, d), "matrix"),
                        (f"{b}.ffn_up.weight", (s.ffn, d), "matrix"),
                        (f"{b}.ffn_down.weight", (d, s.ffn), "matrix"),
                        (f"{b}.nextn.eh_proj.weight", (d, 2 * d), "matrix"),
                        (f"{b}.nextn.enorm.weight", (d,), "ones"),
                        (f"{b}.nextn.hnorm.weight", (d,), "ones"),
                        (f"{b}.nextn.shared_head_norm.weight", (d,), "ones")])
    return plan


def hybrid_types(s: Hybrid, ftype: str,
                 plan: list[tuple[str, tuple[int, ...], str]]) -> dict[str, GGMLQuantizationType]:
    """The type `llama-quantize ... <ftype>` gives each matrix (llama-quant.cpp's
    llama_tensor_get_type without an importance matrix; the converter's F32 tensors stay F32).
    Tied head: token_embd Q6_K; untied (qwen35moe): output Q6_K, token_embd the base type.
    attn_v and the delta net's attn_qkv count as "attn_v" (one counter over both, in file
    order): Q4_K_M gives Q6_K where `use_more_bits` picks the counter, IQ4_XS gives Q5_K when
    n_gqa >= 4 (qwen35: 16/4, qwen35moe: 16/2; lfm2's n_gqa reads layer 0, a conv layer with 0
    KV heads, so 0). ffn_down, ffn_down_exps and ffn_down_shexp alike by the layer in their name
    (of n_layer): Q4_K_M Q6_K in the `use_more_bits` layers, IQ4_XS Q5_K in the first eighth.
    Everything else (ssm_alpha/beta, attn_gate, ssm_out, the short-conv projections, the
    experts' gate/up and the shared expert's included) the file type's base type, Q4_K or
    IQ4_XS; the routers (ffn_gate_inp, ffn_gate_inp_shexp) stay F32."""
    T = GGMLQuantizationType
    if ftype == "F16":
        return {n: T.F16 for n, _, kind in plan if kind == "matrix"}

    def more_bits(i: int, n: int) -> bool:
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    kv0 = s.kv_heads if (s.qwen35 or 0 in s.attention_layers) else 0
    n_gqa = s.heads // kv0 if kv0 else 0
    wv = [n for n, _, kind in plan if kind == "matrix" and (".attn_v." in n or ".attn_qkv." in n)]
    base = T.Q4_K if ftype == "Q4_K_M" else T.IQ4_XS
    types = {}
    for name, shape, kind in plan:
        if kind != "matrix":
            continue
        ty = base
        if name == "output.weight" or (name == "token_embd.weight" and s.tied):
            ty = T.Q6_K
        elif name in wv:
            if ftype == "Q4_K_M":
                ty = T.Q6_K if more_bits(wv.index(name), len(wv)) else T.Q4_K
            elif n_gqa >= 4:
                ty = T.Q5_K
        elif ".ffn_down" in name:
            layer = int(name.split(".")[1])
            if ftype == "Q4_K_M":
                ty = T.Q6_K if more_bits(layer, s.layers) else T.Q4_K
            elif layer < s.layers // 8:
                ty = T.Q5_K
        assert shape[-1] % 256 == 0, (name, shape)  # no fallback types needed
        types[name] = ty
    return types


# Byte offset and value of the f16 super-block scales (d, then dmin where there is one), chosen
# so that random codes and sub-block scales give weights of about 0.026 standard deviation and
# zero mean on average (Q4_K/Q5_K: dmin = d x the mean code).
HYBRID_SCALES = {
    GGMLQuantizationType.Q4_K: ((0, 1e-4), (2, 7.5e-4)),
    GGMLQuantizationType.Q5_K: ((0, 5e-5), (2, 7.75e-4)),
    GGMLQuantizationType.Q6_K: ((208, 2e-5),),
    GGMLQuantizationType.IQ4_XS: ((0, 2e-5),),
}


def hybrid_quant_blocks(rng: np.random.Generator, ty: GGMLQuantizationType, n_blocks: int) -> np.ndarray:
    size = gguf.GGML_QUANT_SIZES[ty][1]
    data = np.frombuffer(rng.bytes(n_blocks * size), dtype=np.uint8).copy().reshape(n_blocks, size)
    for offset, value in HYBRID_SCALES[ty]:
        data[:, offset:offset + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return data


def hybrid_metadata(w: GGUFWriter, s: Hybrid, ftype: str, size_label: str, vocab_file: Path) -> None:
    w.add_type("model")
    w.add_name(f"{s.key}-shape-random")
    w.add_size_label(size_label)
    w.add_block_count(s.layers + int(s.mtp))
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    if not s.experts:
        w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    if s.qwen35:
        w.add_head_count_kv(s.kv_heads)
        w.add_rope_dimension_sections([11, 11, 10, 0])
        w.add_rope_freq_base(s.rope_theta)
        w.add_layer_norm_rms_eps(s.rms_eps)
        if s.experts:
            w.add_expert_count(s.experts)
            w.add_expert_used_count(s.experts_used)
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
        if ftype == "F16":
            w.add_file_type(HYBRID_FTYPES[ftype])
        if s.experts:
            w.add_expert_feed_forward_length(s.expert_ffn)
            w.add_expert_shared_feed_forward_length(s.shexp_ffn)
        w.add_ssm_conv_kernel(s.conv_kernel)
        w.add_ssm_state_size(s.k_dim)
        w.add_ssm_group_count(s.k_heads)
        w.add_ssm_time_step_rank(s.v_heads)
        w.add_ssm_inner_size(s.v_heads * s.k_dim)
        w.add_recurrent_layers([i not in s.attention_layers for i in range(s.layers)] + [False] * int(s.mtp))
        if s.mtp:
            w.add_nextn_predict_layers(1)
        w.add_full_attention_interval(4)
        w.add_rope_dimension_count(s.rope_dims)
    else:
        w.add_head_count_kv([s.kv_heads if i in s.attention_layers else 0 for i in range(s.layers)])
        w.add_rope_freq_base(s.rope_theta)
        w.add_layer_norm_rms_eps(s.rms_eps)
        if ftype == "F16":
            w.add_file_type(HYBRID_FTYPES[ftype])
        w.add_vocab_size(s.vocab)
        w.add_shortconv_l_cache(s.l_cache)
    if ftype == "F16":  # the converter's order; llama-quantize moves both keys to the end
        w.add_quantization_version(2)
    add_vocab(w, vocab_file, s.vocab)
    if ftype != "F16":
        w.add_quantization_version(2)
        w.add_file_type(HYBRID_FTYPES[ftype])


def hybrid_size_label(plan: list[tuple[str, tuple[int, ...], str]]) -> str:
    """general.size_label as the converter computes it (GGUFWriter.get_total_parameter_count):
    "<experts>x<shared + one expert's parameters>" where there are stacked experts."""
    total = shared = expert = n_experts = 0
    for name, shape, _ in plan:
        size = int(np.prod(shape))
        total += size
        if "_exps." in name and len(shape) >= 3:
            expert += size // shape[-3]
            n_experts = shape[-3]
        else:
            shared += size
    return gguf.size_label(total, shared, expert, n_experts)


def write_hybrid(path: Path, s: Hybrid, ftype: str, vocab_file: Path) -> None:
    """One hybrid shape in one file type, streamed: one tensor at a time in memory. Matrices
    random (quantized: random codes under the scales of HYBRID_SCALES; F16: N(0, 0.02)); norms 1;
    conv taps U(+-1/sqrt(taps)); qwen35's ssm_a = -exp(U(-1, 1)) (negative, as the converter
    stores -exp(A_log)) and ssm_dt.bias N(0, 0.5); qwen35moe's routers N(0, 0.02)."""
    rng = np.random.default_rng(0)
    plan = hybrid_plan(s)
    types = hybrid_types(s, ftype, plan)
    w = GGUFWriter(str(path), s.arch)
    hybrid_metadata(w, s, ftype, hybrid_size_label(plan), vocab_file)
    if ftype != "F16":
        # llama-quantize writes ggml_n_dims dimensions, dropping trailing ne of 1: qwen35moe's
        # ffn_gate_inp_shexp, ne [d, 1] from the converter, comes out one-dimensional, ne [d].
        plan = [(name, shape[next((k for k, n in enumerate(shape) if n != 1), len(shape) - 1):], kind)
                for name, shape, kind in plan]

    def byte_shape(shape: tuple[int, ...], ty: GGMLQuantizationType) -> tuple[int, ...]:
        elems, size = gguf.GGML_QUANT_SIZES[ty]
        return (*shape[:-1], shape[-1] // elems * size)

    for name, shape, kind in plan:
        ty = types.get(name)
        if ty is None:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        elif ty == GGMLQuantizationType.F16:
            w.add_tensor_info(name, shape, np.dtype(np.float16), int(np.prod(shape)) * 2)
        else:
            bs = byte_shape(shape, ty)
            w.add_tensor_info(name, bs, np.dtype(np.uint8), int(np.prod(bs)), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind in plan:
        ty = types.get(name)
        if kind == "ones":
            data = np.ones(shape, dtype=np.float32)
        elif kind == "conv":
            bound = 1 / np.sqrt(shape[-1])
            data = rng.uniform(-bound, bound, shape).astype(np.float32)
        elif kind == "ssm_a":
            data = -np.exp(rng.uniform(-1, 1, shape)).astype(np.float32)
        elif kind == "dt_bias":
            data = (rng.standard_normal(shape) * 0.5).astype(np.float32)
        elif kind == "router":
            data = rng.standard_normal(shape, dtype=np.float32) * 0.02
        elif ty == GGMLQuantizationType.F16:
            data = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
        else:
            assert ty is not None
            blocks = int(np.prod(shape)) // gguf.GGML_QUANT_SIZES[ty][0]
            data = hybrid_quant_blocks(rng, ty, blocks).reshape(byte_shape(shape, ty))
        w.write_tensor_data(data)
    w.close()


# Gemma 4 E2B's text config (the public config.json's text_config): 35 layers of d 1536, 8 query
# heads over 1 KV head, sliding layers (window 512, heads of 256, rope theta 1e4 on every dim)
# with a global layer every 5th (4, 9, ..., 34: heads of 512, proportional rope theta 1e6 on a
# quarter of the frequencies), the last 20 layers KV-shared (sliding ones read layer 13, global
# ones layer 14) with double-wide FFNs (12288; 6144 below), per-layer inputs of 256 per layer
# (a [262144, 35 x 256] table), final soft cap 30, tied head, Gemma 4's vocabulary (262144).
E2B = dict(layers=35, hidden=1536, heads=8, kv_heads=1, head=256, global_head=512, window=512,
           shared=20, ple=256, vocab=262144, ffn=6144, context=131072)


def gemma4_plan() -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind) of every tensor of the E2B shape, as the converter writes them."""
    e = E2B
    d, n_pl, layers = e["hidden"], e["ple"], e["layers"]
    first_shared = layers - e["shared"]
    plan = [("token_embd.weight", (e["vocab"], d), "matrix"),
            ("per_layer_token_embd.weight", (e["vocab"], layers * n_pl), "matrix"),
            ("per_layer_model_proj.weight", (layers * n_pl, d), "matrix"),
            ("per_layer_proj_norm.weight", (n_pl,), "ones"),
            ("rope_freqs.weight", (e["global_head"] // 2,), "rope_freqs"),
            ("output_norm.weight", (d,), "ones")]
    for i in range(layers):
        b = f"blk.{i}"
        hd = e["head"] if gemma4_sliding(i) else e["global_head"]
        f = e["ffn"] * (2 if i >= first_shared else 1)
        plan += [(f"{b}.attn_norm.weight", (d,), "ones"),
                 (f"{b}.attn_q.weight", (e["heads"] * hd, d), "matrix"),
                 (f"{b}.attn_q_norm.weight", (hd,), "ones")]
        if i < first_shared:
            plan += [(f"{b}.attn_k.weight", (e["kv_heads"] * hd, d), "matrix"),
                     (f"{b}.attn_v.weight", (e["kv_heads"] * hd, d), "matrix"),
                     (f"{b}.attn_k_norm.weight", (hd,), "ones")]
        plan += [(f"{b}.attn_output.weight", (d, e["heads"] * hd), "matrix"),
                 (f"{b}.post_attention_norm.weight", (d,), "ones"),
                 (f"{b}.ffn_norm.weight", (d,), "ones"),
                 (f"{b}.ffn_gate.weight", (f, d), "matrix"),
                 (f"{b}.ffn_up.weight", (f, d), "matrix"),
                 (f"{b}.ffn_down.weight", (d, f), "matrix"),
                 (f"{b}.post_ffw_norm.weight", (d,), "ones"),
                 (f"{b}.inp_gate.weight", (n_pl, d), "matrix"),
                 (f"{b}.proj.weight", (d, n_pl), "matrix"),
                 (f"{b}.post_norm.weight", (d,), "ones"),
                 (f"{b}.layer_output_scale.weight", (1,), "ones")]
    return plan


def gemma4_sliding(i: int) -> bool:
    return (i + 1) % 5 != 0


def write_gemma4_f16(path: Path, vocab_file: Path) -> None:
    """Gemma 4 E2B's shape in F16 (matrices N(0, 0.02), norms and scales 1, rope_freqs as the
    converter computes them), streamed one tensor at a time; llama-quantize makes the rest."""
    e = E2B
    layers, arch = e["layers"], "gemma4"
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), arch)
    w.add_type("model")
    w.add_name("gemma4-e2b-shape-random")
    w.add_block_count(layers)
    w.add_context_length(e["context"])
    w.add_embedding_length(e["hidden"])
    first_shared = layers - e["shared"]
    w.add_feed_forward_length([e["ffn"] * (2 if i >= first_shared else 1) for i in range(layers)])
    w.add_head_count(e["heads"])
    w.add_head_count_kv(e["kv_heads"])
    w.add_rope_freq_base(1_000_000.0)
    w.add_float32(f"{arch}.rope.freq_base_swa", 10_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(e["global_head"])
    w.add_value_length(e["global_head"])
    w.add_file_type(LlamaFileType.MOSTLY_F16)
    w.add_float32(f"{arch}.final_logit_softcapping", 30.0)
    w.add_uint32(f"{arch}.attention.sliding_window", e["window"])
    w.add_uint32(f"{arch}.attention.shared_kv_layers", e["shared"])
    w.add_uint32(f"{arch}.embedding_length_per_layer_input", e["ple"])
    w.add_array(f"{arch}.attention.sliding_window_pattern", [gemma4_sliding(i) for i in range(layers)])
    w.add_uint32(f"{arch}.attention.key_length_swa", e["head"])
    w.add_uint32(f"{arch}.attention.value_length_swa", e["head"])
    w.add_rope_dimension_count(e["global_head"])
    w.add_uint32(f"{arch}.rope.dimension_count_swa", e["head"])
    w.add_quantization_version(2)
    add_vocab(w, vocab_file, e["vocab"])
    plan = gemma4_plan()
    for name, shape, kind in plan:
        dtype = np.float16 if kind == "matrix" else np.float32
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind in plan:
        if kind == "ones":
            data = np.ones(shape, dtype=np.float32)
        elif kind == "rope_freqs":
            rotated = int(0.25 * e["global_head"] // 2)
            data = np.array([1.0] * rotated + [1e30] * (shape[0] - rotated), dtype=np.float32)
        else:
            rows, cols = shape
            data = np.empty(shape, dtype=np.float16)
            step = max(1, (1 << 24) // cols)  # a few tens of MB of f32 at a time
            for r in range(0, rows, step):
                n = min(step, rows - r)
                data[r:r + n] = rng.standard_normal((n, cols), dtype=np.float32) * 0.02
        w.write_tensor_data(data)
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--llama", type=Path, required=True, help="the sdist's vendor/llama.cpp")
    ap.add_argument("--moe", action="store_true", help="Qwen3-30B-A3B's shape, Q4_K_M only")
    ap.add_argument("--gpt-oss", action="store_true", help="gpt-oss-20b's shape, MXFP4_MOE only")
    ap.add_argument("--shape", choices=sorted(HYBRIDS),
                    help="a hybrid shape, written straight as <out>/<shape>-<TYPE>.gguf "
                         "(TYPE Q4_K_M, IQ4_XS or F16)")
    ap.add_argument("--gemma4-e2b", action="store_true",
                    help="Gemma 4 E2B's shape: <out>/gemma4-e2b-F16.gguf, then llama-quantize's TYPEs")
    ap.add_argument("--dense", choices=sorted(DENSE), default="qwen3-1.7b",
                    help="the dense shape (default qwen3-1.7b, written as model-TYPE.gguf; "
                         "others as SHAPE-TYPE.gguf)")
    ap.add_argument("types", nargs="*", help="llama-quantize file types (Q4_K_M, IQ4_XS, ...)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.gemma4_e2b:
        f16 = args.out / "gemma4-e2b-F16.gguf"
        if not f16.exists():
            write_gemma4_f16(f16, args.llama / "models" / "ggml-vocab-gemma-4.gguf")
        for ty in args.types:
            dst = args.out / f"gemma4-e2b-{ty}.gguf"
            if not dst.exists():
                quantize = args.llama / "build" / "bin" / "llama-quantize"
                subprocess.run([str(quantize), str(f16), str(dst), ty, "2"], check=True)
        return
    if args.shape:
        shape = HYBRIDS[args.shape]
        for ty in args.types or ["Q4_K_M"]:
            if ty not in HYBRID_FTYPES:
                ap.error(f"--shape writes {', '.join(HYBRID_FTYPES)}, not {ty}")
            dst = args.out / f"{shape.key}-{ty}.gguf"
            if not dst.exists():
                write_hybrid(dst, shape, ty, args.llama / "models" / f"ggml-vocab-{shape.vocab_file}.gguf")
                print(f"{dst}: {dst.stat().st_size / 1e9:.2f} GB", flush=True)
        return
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
    dense = DENSE[args.dense]
    stem = "model" if args.dense == "qwen3-1.7b" else dense.key
    f16 = args.out / f"{stem}-F16.gguf"
    if not f16.exists():
        write_f16(f16, vocab, dense)
    for ty in args.types:
        dst = args.out / f"{stem}-{ty}.gguf"
        if not dst.exists():
            quantize = args.llama / "build" / "bin" / "llama-quantize"
            subprocess.run([str(quantize), str(f16), str(dst), ty, "2"], check=True)


if __name__ == "__main__":
    main()
