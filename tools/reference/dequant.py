"""Dequantization vectors, all from the `gguf` Python package (llama.cpp's gguf-py, whose
`gguf.quants.dequantize` is the reference implementation of every ggml block format):

- `dequant/`: random blocks of every type from a fixed seed, and what gguf-py dequantizes them to.
- per model: the first two rows of one tensor of each quant type in the GGUF.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from common import Model, load_json, write_f32, write_json

SEED = 20250101

# (type, number of blocks): 1024 bytes of F16/BF16, 8 blocks of every other type. All drawn in this
# order from one generator seeded with SEED, so a type added later goes at the END (it then leaves the
# blocks of every earlier type unchanged).
RANDOM_CASES = (
    ("F16", 512),
    ("BF16", 512),
    ("Q4_0", 8),
    ("Q4_1", 8),
    ("Q5_0", 8),
    ("Q5_1", 8),
    ("Q8_0", 8),
    ("Q2_K", 8),
    ("Q3_K", 8),
    ("Q4_K", 8),
    ("Q5_K", 8),
    ("Q6_K", 8),
    ("IQ4_NL", 8),
    ("IQ4_XS", 8),
    ("MXFP4", 8),
    ("IQ2_XXS", 8),
    ("IQ2_XS", 8),
    ("IQ2_S", 8),
    ("IQ3_XXS", 8),
    ("IQ3_S", 8),
    ("IQ1_S", 8),
    ("IQ1_M", 8),
    ("TQ1_0", 8),
    ("TQ2_0", 8),
)

# Byte offsets of the f16 scale fields (d, and dmin/m where the type has one) inside one block, from
# ggml's block layouts (ggml-common.h).
F16_FIELDS = {
    "Q4_0": (0,),  # d, qs[16]
    "Q4_1": (0, 2),  # d, m, qs[16]
    "Q5_0": (0,),  # d, qh[4], qs[16]
    "Q5_1": (0, 2),  # d, m, qh[4], qs[16]
    "Q8_0": (0,),  # d, qs[32]
    "Q2_K": (80, 82),  # scales[16], qs[64], d, dmin
    "Q3_K": (108,),  # hmask[32], qs[64], scales[12], d
    "Q4_K": (0, 2),  # d, dmin, scales[12], qs[128]
    "Q5_K": (0, 2),  # d, dmin, scales[12], qh[32], qs[128]
    "Q6_K": (208,),  # ql[128], qh[64], scales[16], d
    "IQ4_NL": (0,),  # d, qs[16]
    "IQ4_XS": (0,),  # d, scales_h (u16), scales_l[4], qs[128]
    "MXFP4": (),  # e (E8M0), qs[16]: no f16 field
    "IQ2_XXS": (0,),  # d, qs[64] (u32 pairs: grid bytes, signs + scale)
    "IQ2_XS": (0,),  # d, qs[64] (u16: 9-bit index, 7-bit signs), scales[8]
    "IQ2_S": (0,),  # d, qs[32], signs[32], qh[8], scales[8]
    "IQ3_XXS": (0,),  # d, qs[64], scales_and_signs[32]
    "IQ3_S": (0,),  # d, qs[64], qh[8], signs[32], scales[4]
    "IQ1_S": (0,),  # d, qs[32], qh[16]
    "IQ1_M": (),  # qs[32], qh[16], scales[8]: the f16 scale is in SPLIT_F16_FIELDS
    "TQ1_0": (52,),  # qs[48], qh[4], d
    "TQ2_0": (64,),  # qs[64], d
}

# IQ1_M's f16 scale is spread over the high nibbles of these bytes (its four u16 sub-scale words),
# lowest nibble first.
SPLIT_F16_FIELDS = {"IQ1_M": (49, 51, 53, 55)}

# Byte offsets of the E8M0 (power-of-two exponent) scale bytes inside one block, and the range they
# are drawn from: 115..=135 keeps every value a finite, normal f32 (gguf-py's scale is 2^(e-128)).
E8M0_FIELDS = {"MXFP4": (0,)}  # e, qs[16]
E8M0_RANGE = (115, 135)


def _random_blocks(rng: np.random.Generator, name: str, n_blocks: int) -> np.ndarray:
    """Raw bytes of `n_blocks` blocks. Quantized types: uniformly random bytes, then every f16 scale
    field overwritten with a finite value uniform in [-0.05, 0.05) (random f16 bits would include
    inf/NaN and huge scales), then every E8M0 scale byte (MXFP4) with an integer uniform in
    E8M0_RANGE (inclusive). F16/BF16: standard-normal values (finite by construction)."""
    qtype = Q[name]
    block_elements, block_bytes = GGML_QUANT_SIZES[qtype]
    if name == "F16":
        return rng.standard_normal(n_blocks).astype("<f2").view(np.uint8)
    if name == "BF16":
        bits = rng.standard_normal(n_blocks).astype("<f4").view("<u4").astype(np.uint64)
        # round to nearest even, as a float32 -> bfloat16 conversion does
        bf = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
        return bf.view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        scale = rng.uniform(-0.05, 0.05, size=n_blocks).astype("<f2")
        raw[:, off : off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    for offs in (SPLIT_F16_FIELDS.get(name),):
        if offs is None:
            continue
        bits = rng.uniform(-0.05, 0.05, size=n_blocks).astype("<f2").view("<u2")
        for k, off in enumerate(offs):
            nib = ((bits >> (4 * k)) & 0xF).astype(np.uint8)
            raw[:, off] = (raw[:, off] & 0x0F) | (nib << 4)
    for off in E8M0_FIELDS.get(name, ()):
        raw[:, off] = rng.integers(E8M0_RANGE[0], E8M0_RANGE[1] + 1, size=n_blocks, dtype=np.uint8)
    return raw.reshape(-1)


def gguf_dequantize(raw: np.ndarray, name: str) -> np.ndarray:
    """Dequantizes a flat byte buffer of whole blocks of type `name` with gguf-py, to f32."""
    qtype = Q[name]
    out = dequantize(np.ascontiguousarray(raw, dtype=np.uint8).reshape(1, -1), qtype)
    return np.asarray(out, dtype=np.float32).reshape(-1)


def write_random_dequant(out: Path) -> None:
    """`dequant/`: index.json + <TYPE>.bin + <TYPE>.f32."""
    rng = np.random.default_rng(SEED)
    cases = []
    d = out / "dequant"
    for name, n_blocks in RANDOM_CASES:
        block_elements, block_bytes = GGML_QUANT_SIZES[Q[name]]
        raw = _random_blocks(rng, name, n_blocks)
        assert raw.size == n_blocks * block_bytes
        values = gguf_dequantize(raw, name)
        assert values.size == n_blocks * block_elements and np.isfinite(values).all(), name
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{name}.bin.tmp"
        raw.tofile(tmp)
        tmp.replace(d / f"{name}.bin")
        write_f32(d / f"{name}.f32", values)
        cases.append(
            {
                "type": name,
                "block_elements": block_elements,
                "block_bytes": block_bytes,
                "elements": n_blocks * block_elements,
                "raw": f"{name}.bin",
                "f32": f"{name}.f32",
            }
        )
    index = {
        "made_by": "gguf Python package (llama.cpp's reference dequantize)",
        "gguf_version": version("gguf"),
        "cases": cases,
    }
    write_json(d / "index.json", index)


def write_model_dequant(model: Model, gguf_path: Path, out: Path) -> None:
    """`<model>/dequant.json` + `dequant.<TYPE>.<tensor>.rows0-1.f32`."""
    reader = GGUFReader(gguf_path)
    tensors = {t.name: t for t in reader.tensors}
    entries = []
    for name in model.dequant_tensors:
        t = tensors[name]
        qtype = Q(int(t.tensor_type)).name
        row_length = int(t.shape[0])  # ggml order: ne[0] is the row length
        rows = np.asarray(t.data)[:2]  # numpy view: (rows, bytes per row) or (rows, elements)
        values = np.asarray(dequantize(rows, t.tensor_type), dtype=np.float32).reshape(-1)
        assert values.size == 2 * row_length, (name, values.shape)
        fname = f"dequant.{qtype}.{name}.rows0-1.f32"
        write_f32(out / model.folder / fname, values)
        entries.append({"tensor": name, "type": qtype, "row_length": row_length, "file": fname})
    write_json(out / model.folder / "dequant.json", entries)


def check_old_dequant(old: Path) -> list[str]:
    """gguf-py must turn the OLD random blocks into the OLD f32 vectors bit for bit. Returns the
    problems found (empty: all agree)."""
    problems = []
    index = load_json(old / "dequant" / "index.json")
    for case in index["cases"]:
        raw = np.fromfile(old / "dequant" / case["raw"], dtype=np.uint8)
        want = np.fromfile(old / "dequant" / case["f32"], dtype="<f4")
        got = gguf_dequantize(raw, case["type"])
        if got.shape != want.shape or case["elements"] != want.size:
            problems.append(f"dequant/{case['type']}: {got.size} values, file has {want.size}")
        elif not np.array_equal(got.view("<u4"), want.view("<u4")):
            diff = np.abs(got.astype(np.float64) - want)
            problems.append(f"dequant/{case['type']}: max abs diff {diff.max():.3g}")
    return problems
