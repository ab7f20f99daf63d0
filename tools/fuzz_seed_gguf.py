#!/usr/bin/env python3
"""Writes a small, complete GGUF v3 file as a fuzzing seed: a llama-shaped metadata set (every
key rill reads, with a 300-token vocabulary) and two tiny F32 tensors, so the fuzzer starts from
an input the reader accepts whole."""
import struct
import sys

U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, value):
    out = s(key) + struct.pack("<I", typ)
    if typ == U32:
        out += struct.pack("<I", value)
    elif typ == F32:
        out += struct.pack("<f", value)
    elif typ == BOOL:
        out += struct.pack("<?", value)
    elif typ == STR:
        out += s(value)
    elif typ == ARR:
        inner, items = value
        out += struct.pack("<IQ", inner, len(items))
        for it in items:
            out += s(it) if inner == STR else struct.pack("<i" if inner == I32 else "<f", it)
    return out


tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + [f"t{i}" for i in range(41)]
meta = [
    kv("general.architecture", STR, "llama"),
    kv("general.name", STR, "seed"),
    kv("llama.context_length", U32, 64),
    kv("llama.embedding_length", U32, 8),
    kv("llama.block_count", U32, 1),
    kv("llama.feed_forward_length", U32, 16),
    kv("llama.attention.head_count", U32, 2),
    kv("llama.attention.head_count_kv", U32, 1),
    kv("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
    kv("llama.rope.freq_base", F32, 10000.0),
    kv("tokenizer.ggml.model", STR, "llama"),
    kv("tokenizer.ggml.tokens", ARR, (STR, tokens)),
    kv("tokenizer.ggml.scores", ARR, (F32, [0.0] * len(tokens))),
    kv("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3] + [6] * 256 + [1] * 41)),
    kv("tokenizer.ggml.bos_token_id", U32, 1),
    kv("tokenizer.ggml.eos_token_id", U32, 2),
    kv("tokenizer.chat_template", STR, "{% for m in messages %}{{ m.content }}{% endfor %}"),
]
tensors = [("token_embd.weight", [8, 4]), ("output_norm.weight", [8])]
header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)) + b"".join(meta)
offset = 0
infos = b""
for name, dims in tensors:
    infos += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    infos += struct.pack("<IQ", 0, offset)  # F32
    n = 1
    for d in dims:
        n *= d
    offset += (n * 4 + 31) // 32 * 32
body = header + infos
body += b"\0" * ((-len(body)) % 32)
data = b""
for name, dims in tensors:
    n = 1
    for d in dims:
        n *= d
    chunk = struct.pack(f"<{n}f", *[0.01 * i for i in range(n)])
    data += chunk + b"\0" * ((-len(chunk)) % 32)
with open(sys.argv[1], "wb") as f:
    f.write(body + data)
