"""Shared helpers for the reference generators: the two models, where their GGUFs live, and how the
output files are written (the exact JSON layout the tests read)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Model:
    key: str  # command-line name (--smollm2 / --gemma3)
    folder: str  # output folder under the reference directory
    file: str  # GGUF file name in rill's model cache
    sha256: str
    size: int
    add_bos: bool  # the prompts of reference.json start with BOS
    dequant_tensors: tuple[str, ...]  # one tensor of each quant type: dequant.json


MODELS = (
    Model(
        key="smollm2",
        folder="smollm2-135m-instruct-q4_1",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        add_bos=False,
        dequant_tensors=("token_embd.weight", "blk.0.ffn_down.weight"),
    ),
    Model(
        key="gemma3",
        folder="gemma3-270m-q4_k_m",
        file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        add_bos=True,
        dequant_tensors=(
            "token_embd.weight",
            "blk.0.attn_k.weight",
            "blk.0.attn_output.weight",
            "blk.0.ffn_down.weight",
        ),
    ),
)


def rill_model_dir() -> Path:
    """rill's model cache: $RILL_HOME/models, else ~/.cache/rill/models."""
    home = os.environ.get("RILL_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "rill"
    return base / "models"


def default_gguf(model: Model) -> Path:
    return rill_model_dir() / model.file


def load_json(path: Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_json(path: Path, obj, ascii_only: bool = False) -> None:
    """The layout of the committed files: one-space indent, no trailing newline. reference.json is
    written with non-ASCII escaped (\\uXXXX), the other files with UTF-8 text as is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(json.dumps(obj, indent=1, ensure_ascii=ascii_only))
    tmp.replace(path)


def write_f32(path: Path, values) -> None:
    """Little-endian f32, no header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    np.ascontiguousarray(values, dtype="<f4").tofile(tmp)
    tmp.replace(path)


def read_f32(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<f4")


def r6(x: float) -> float:
    """Log-probs and margins are stored rounded to 6 decimals."""
    return round(float(x), 6)
