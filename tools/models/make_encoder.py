"""A tiny random BERT encoder (`tests/data/tiny/bert-tiny/`), made the way real embedding GGUFs are:

1. transformers' own `BertModel` from a seeded config, HF's init, then every LayerNorm weight and
   bias and every projection bias made random (HF starts them at 1 and 0, which would hide a loader
   that drops one or applies it in the wrong place);
2. `save_pretrained` with a small WordPiece tokenizer (`BertTokenizerFast` on the vocabulary below:
   lower case, accents stripped, as `bert-base-uncased` and the bge models) and sentence-transformers'
   `modules.json` + `1_Pooling/config.json` saying CLS pooling, as bge's checkpoints do;
3. llama.cpp's own `convert_hf_to_gguf.py --outtype f32` (through `convert.py`) converts it;
4. transformers (float32, eager attention) computes the references: per case, the token ids the HF
   tokenizer gives (text cases, with [CLS] and [SEP]) or random ids, the last hidden state of every
   position, and the CLS and mean poolings normalised to unit length.

    nice -n 10 /root/refvenv/bin/python tools/models/make_encoder.py [--llama-cpp DIR]

Writes tests/data/tiny/bert-tiny/{model.gguf,reference.json}."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OUT = REPO / "tests/data/tiny/bert-tiny"
SEED = 4040

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the quick brown fox jumps over lazy dog hello world embed embedding search query "
         "passage model token rill river water stone apple pie under and or not is a an of to in "
         "it this that what where when how why who cat dogs run running runs jump").split()
PIECES = ["##s", "##ing", "##ed", "##er", "##ly", "##est", "##ness", "##able", "##y"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789") + list(".,!?;:'\"()-+=$%&*/@#")
CHAR_PIECES = ["##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
VOCAB = SPECIALS + CHARS + CHAR_PIECES + WORDS + PIECES

TEXTS = {
    "hello": "Hello, world!",
    "fox": "The quick brown fox jumps over the lazy dog.",
    "pieces": "Jumping dogs: the quickest runners (and embeddings) ran 42 times!",
    "accents": "Äpfel und Café, naïve résumé; 北京 is 2 chars",
}
ID_LENGTHS = {"len7": 7, "len33": 33, "len70": 70}


def build(config):
    from transformers import BertModel

    torch.manual_seed(SEED)
    model = BertModel(config, add_pooling_layer=False)
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-cpp", default=os.environ.get(
        "LLAMA_CPP_DIR", str(Path.home() / ".cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp")))
    parser.add_argument("--keep-hf", default=None)
    args = parser.parse_args()
    from transformers import BertConfig, BertTokenizerFast

    torch.set_num_threads(1)
    config = BertConfig(
        vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, hidden_act="gelu", max_position_embeddings=128, type_vocab_size=2,
        initializer_range=0.2, layer_norm_eps=1e-12, pad_token_id=0, attn_implementation="eager")
    model = build(config)
    work = Path(args.keep_hf or tempfile.mkdtemp(prefix="rill-bert-"))
    hf = work / "bert-tiny"
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(hf / "vocab.txt"), do_lower_case=True,
                                  strip_accents=None, tokenize_chinese_chars=True)
    tokenizer.save_pretrained(hf)
    model.save_pretrained(hf)
    (hf / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (hf / "1_Pooling").mkdir(exist_ok=True)
    (hf / "1_Pooling/config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_cls_token": True,
         "pooling_mode_mean_tokens": False}))

    OUT.mkdir(parents=True, exist_ok=True)
    gguf = OUT / "model.gguf"
    subprocess.run([sys.executable, str(HERE / "convert.py"), args.llama_cpp, "bert-bge", "--",
                    str(hf), "--outfile", str(gguf), "--outtype", "f32"], check=True,
                   stdout=subprocess.DEVNULL)

    gen = torch.Generator().manual_seed(SEED + 2)
    cases = []
    for case_id, text in TEXTS.items():
        cases.append({"id": case_id, "text": text, "token_ids": tokenizer(text)["input_ids"]})
    for case_id, n in ID_LENGTHS.items():
        ids = torch.randint(len(SPECIALS), len(VOCAB), (n,), generator=gen).tolist()
        cases.append({"id": case_id, "text": None, "token_ids": ids})
    for case in cases:
        with torch.no_grad():
            h = model(torch.tensor([case["token_ids"]])).last_hidden_state[0].double()
        case["hidden"] = [[round(float(x), 7) for x in row] for row in h]
        for key, v in (("cls", h[0]), ("mean", h.mean(0))):
            case[key] = [round(float(x), 8) for x in v / v.norm()]
    import transformers
    (OUT / "reference.json").write_text(json.dumps({
        "model": "bert-tiny",
        "made_by": "tools/models/make_encoder.py",
        "seed": SEED,
        "config": {k: getattr(config, k) for k in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
            "layer_norm_eps")},
        "pooling": "cls",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {gguf} and {OUT / 'reference.json'}")


if __name__ == "__main__":
    main()
