"""Runs llama.cpp's own `convert_hf_to_gguf.py` (imported from a llama.cpp source tree, with that
tree's `gguf-py`) on an HF checkpoint, in a process of its own:

    python convert.py LLAMA_CPP_DIR PRE [--gpt2-vocab HF_ARCH] -- HF_DIR --outfile OUT.gguf --outtype f32 ...

The one change: the converter names a BPE pre-tokenizer by hashing the token ids of a test string,
and cannot know the tiny models' own tokenizer, so `TextModel.get_vocab_base_pre` is replaced by one
that answers PRE (e.g. `qwen2`, the pre-tokenizer regex the tiny tokenizer uses). Nothing of the
converter is copied here.

`--gpt2-vocab HF_ARCH` (e.g. Gemma2ForCausalLM, Phi3ForCausalLM): that architecture's converter class
writes its vocabulary with the converter's own GPT-2 BPE writer (`TextModel._set_vocab_gpt2`, what
qwen2 / llama-3 use) instead of its own `set_vocab`, which wants a SentencePiece `tokenizer.model` the
tiny byte-level BPE tokenizer does not have. Only the `tokenizer.*` metadata depends on it."""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    if "--" not in sys.argv[3:]:
        sys.exit(__doc__)
    sep = sys.argv.index("--", 3)
    llama_cpp = Path(sys.argv[1]).resolve()
    pre = sys.argv[2]
    options = sys.argv[3:sep]
    converter_args = sys.argv[sep + 1:]
    gpt2_vocab_arch = None
    if options:
        if len(options) != 2 or options[0] != "--gpt2-vocab":
            sys.exit(__doc__)
        gpt2_vocab_arch = options[1]

    if "gguf" in sys.modules:
        sys.exit("gguf is already imported: the converter must use its own gguf-py")
    sys.path.insert(0, str(llama_cpp))
    import convert_hf_to_gguf  # puts llama_cpp/gguf-py on sys.path before importing gguf
    import gguf
    from conversion import base

    gguf_file = Path(gguf.__file__).resolve()
    if llama_cpp not in gguf_file.parents:
        sys.exit(f"the converter imported gguf from {gguf_file}, not from {llama_cpp}/gguf-py")

    def get_vocab_base_pre(self, tokenizer) -> str:
        del self, tokenizer
        return pre

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    if gpt2_vocab_arch is not None:
        from conversion import get_model_class

        def set_vocab(self) -> None:
            self._set_vocab_gpt2()

        get_model_class(gpt2_vocab_arch).set_vocab = set_vocab
    sys.argv = [str(llama_cpp / "convert_hf_to_gguf.py"), *converter_args]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
