"""Token ids from llama.cpp's own tokenizer (its `llama-tokenize` tool, built by
build-llama-tokenize.sh; only the binary is called) and from HF transformers' tokenizer loaded from the
same GGUF, for `tokenization.json` and for the prompts of `reference.json`."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from common import HERE, Model, load_json, write_json

TEXTS_FILE = HERE / "tokenization_texts.json"
TOKENIZER_NOTE = "llama.cpp llama-tokenize --no-bos (llama.cpp as vendored in llama-cpp-python 0.3.36)"


class LlamaTokenize:
    """Runs `llama-tokenize` on one GGUF: the text goes in on stdin as UTF-8 bytes (so a NUL byte or
    trailing whitespace reaches the tokenizer unchanged), escapes are not processed."""

    def __init__(self, binary: Path, gguf: Path):
        self.binary = Path(binary)
        self.gguf = Path(gguf)

    def __call__(self, text: str, bos: bool, parse_special: bool) -> list[int]:
        args = [str(self.binary), "-m", str(self.gguf), "--stdin", "--ids", "--no-escape", "--log-disable"]
        if not bos:
            args.append("--no-bos")
        if not parse_special:
            args.append("--no-parse-special")
        proc = subprocess.run(args, input=text.encode("utf-8"), capture_output=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"llama-tokenize failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-2000:]}")
        lines = [l for l in proc.stdout.decode().splitlines() if l.startswith("[")]
        if len(lines) != 1:
            raise RuntimeError(f"unexpected llama-tokenize output: {proc.stdout!r}")
        return [int(x) for x in ast.literal_eval(lines[0])]

    def adds_bos(self) -> bool:
        """Whether llama.cpp adds BOS to this model's prompts by default (tokenizer.ggml.add_bos_token
        and the vocab type's default, as llama.cpp resolves them)."""
        return len(self("Hello", bos=True, parse_special=False)) == len(self("Hello", bos=False, parse_special=False)) + 1


def hf_tokenizer(gguf: Path):
    from transformers import AutoTokenizer

    gguf = Path(gguf).resolve()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def hf_ids(tok, text: str) -> list[int]:
    """HF ids, no BOS/EOS added; HF always parses special-token text into its token."""
    return list(tok.encode(text, add_special_tokens=False))


def texts() -> list[str]:
    return load_json(TEXTS_FILE)


def write_tokenization(model: Model, llama: LlamaTokenize, tok, out: Path) -> list[str]:
    """Writes `<model>/tokenization.json`; returns the cases where llama.cpp and HF disagree."""
    cases, disagreements = [], []
    for text in texts():
        ids = llama(text, bos=False, parse_special=False)
        ids_special = llama(text, bos=False, parse_special=True)
        hf = hf_ids(tok, text)
        if hf != ids_special:
            disagreements.append(f"{model.folder}: {text!r}: llama.cpp {ids_special} HF {hf}")
        cases.append({"text": text, "ids": ids, "ids_parse_special": ids_special, "hf_ids_parse_special": hf})
    doc = {
        "model": model.file,
        "tokenizer": TOKENIZER_NOTE,
        "add_bos_token": llama.adds_bos(),
        "cases": cases,
    }
    write_json(out / model.folder / "tokenization.json", doc)
    return disagreements


def prompt_ids(model: Model, llama: LlamaTokenize, tok, text: str) -> tuple[list[int], str | None]:
    """The prompt's ids as the forward pass gets them (Gemma: BOS first; SmolLM2: no BOS), from
    llama.cpp; and a note if HF's tokenizer gives other ids."""
    ids = llama(text, bos=model.add_bos, parse_special=True)
    if model.add_bos and (not ids or ids[0] != tok.bos_token_id):
        raise RuntimeError(f"{model.folder}: llama.cpp did not add BOS ({tok.bos_token_id}) to {text[:40]!r}")
    hf = ([tok.bos_token_id] if model.add_bos else []) + hf_ids(tok, text)
    note = None if hf == ids else f"{model.folder}: prompt {text[:40]!r}: llama.cpp {len(ids)} ids, HF {len(hf)} ids, differ"
    return ids, note
