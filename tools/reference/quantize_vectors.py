"""Weight quantization test vectors from llama.cpp's reference (the `gguf` Python package).

Writes tests/data/reference/quantize/<TYPE>.f32 (random rows, little-endian f32: 64 blocks of
32 with a few all-zero, constant and tie blocks) and <TYPE>.bin (gguf.quants.quantize of them),
for the types rill quantizes weights into (Q4_0, Q5_0). Run with a Python that has gguf and
numpy: python tools/reference/quantize_vectors.py
"""
import os

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "quantize")


def rows() -> np.ndarray:
    rng = np.random.default_rng(20261128)
    x = rng.standard_normal((4, 512)).astype(np.float32) * rng.uniform(0.001, 3.0, (4, 1)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block
    x[1, 32:64] = 0.25  # a constant block
    x[2, 64:96] = np.linspace(-1.0, 1.0, 32, dtype=np.float32)  # a magnitude tie (-1 first)
    x[3, 96:128] *= 1000.0  # large values
    return x


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    x = rows()
    for name in ["Q4_0", "Q5_0"]:
        q = quantize(x, GGMLQuantizationType[name])
        x.tofile(os.path.join(OUT, f"{name}.f32"))
        np.asarray(q, dtype=np.uint8).tofile(os.path.join(OUT, f"{name}.bin"))
        print(name, q.shape)


if __name__ == "__main__":
    main()
