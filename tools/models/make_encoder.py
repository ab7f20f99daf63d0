"""Tiny random encoders (`tests/data/tiny/bert-tiny/`, `tests/data/tiny/nomic-bert-tiny/`), made the way
real embedding GGUFs are:

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

Writes tests/data/tiny/bert-tiny/{model.gguf,reference.json}. `--family nomic-bert` makes instead a
random `NomicBertModel` (nomic-embed-text's architecture: RoPE with base 1000 instead of learned
positions, fused q/k/v, SwiGLU, no biases, post-LayerNorms; mean pooling) into
tests/data/tiny/nomic-bert-tiny/: transformers has the model natively, but llama.cpp's converter
reads only the original remote-code checkpoint layout, so the checkpoint is written in that layout
(config keys `n_embd`, `n_inner`, `rotary_emb_base`...; tensors `encoder.layers.N.attn.Wqkv`,
`mlp.fc11` (up), `mlp.fc12` (gate), `mlp.fc2`, `norm1`, `norm2`, `emb_ln`: the inverse of
transformers' own `conversion_mapping.py` rules for `nomic_bert`). `--bge-small-shape OUT.gguf` writes
instead a random model of bge-small's shape (12 layers, d 384, 12 heads, FFN 1536, 512 positions,
the vocabulary padded with `[unusedN]` tokens to 30,522), without references: for timing against
other engines (`tools/bench/embeddings.py`)."""

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


def build(config, family: str = "bert"):
    from transformers import BertModel, NomicBertModel

    torch.manual_seed(SEED)
    cls = NomicBertModel if family == "nomic-bert" else BertModel
    model = cls(config, add_pooling_layer=False)
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("LayerNorm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


def save_nomic_original(model, config, hf: Path) -> None:
    """The checkpoint in nomic's original (remote-code) layout, which llama.cpp's converter reads."""
    from safetensors.torch import save_file

    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    out = {}
    for name, t in state.items():
        if ".self_attn.k_proj." in name or ".self_attn.v_proj." in name:
            continue
        if ".self_attn.q_proj." in name:
            qkv = [state[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            t, name = torch.cat(qkv, 0), name.replace("self_attn.q_proj", "attn.Wqkv")
        for a, b in (("embeddings.LayerNorm", "emb_ln"), ("self_attn.o_proj", "attn.out_proj"),
                     ("mlp.up_proj", "mlp.fc11"), ("mlp.gate_proj", "mlp.fc12"),
                     ("mlp.down_proj", "mlp.fc2"), ("post_attention_layernorm", "norm1"),
                     ("post_mlp_layernorm", "norm2")):
            name = name.replace(a, b)
        if name.startswith("layers."):
            name = "encoder." + name
        out[name] = t.contiguous()
    save_file(out, str(hf / "model.safetensors"), metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps({
        "architectures": ["NomicBertModel"],
        "model_type": "nomic_bert",
        "vocab_size": config.vocab_size, "pad_token_id": 0, "type_vocab_size": 2,
        # the original keys, read by the converter's NomicBertModel
        "n_embd": config.hidden_size, "n_head": config.num_attention_heads,
        "n_inner": config.intermediate_size, "n_layer": config.num_hidden_layers,
        "n_positions": 8192, "max_trained_positions": 2048, "activation_function": "swiglu",
        "causal": False, "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False,
        "prenorm": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_emb_base": 1000, "layer_norm_epsilon": 1e-12,
        # transformers' names for the same, so that either way of reading the config agrees
        "hidden_size": config.hidden_size, "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers, "layer_norm_eps": 1e-12,
        "hidden_act": "silu", "max_position_embeddings": 2048,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000.0},
    }, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-cpp", default=os.environ.get(
        "LLAMA_CPP_DIR", str(Path.home() / ".cache/rill-peers/llamacpp-0.3.36/src/vendor/llama.cpp")))
    parser.add_argument("--keep-hf", default=None)
    parser.add_argument("--bge-small-shape", default=None, metavar="OUT.gguf")
    parser.add_argument("--family", choices=("bert", "nomic-bert"), default="bert")
    args = parser.parse_args()
    from transformers import BertConfig, BertTokenizerFast, NomicBertConfig

    torch.set_num_threads(1)
    vocab = VOCAB
    config = BertConfig(
        vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, hidden_act="gelu", max_position_embeddings=128, type_vocab_size=2,
        initializer_range=0.2, layer_norm_eps=1e-12, pad_token_id=0, attn_implementation="eager")
    if args.bge_small_shape:
        vocab = VOCAB + [f"[unused{i}]" for i in range(30522 - len(VOCAB))]
        config = BertConfig(
            vocab_size=len(vocab), hidden_size=384, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=1536, hidden_act="gelu", max_position_embeddings=512,
            type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=0,
            attn_implementation="eager")
    nomic = args.family == "nomic-bert"
    if nomic:
        config = NomicBertConfig(
            vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, hidden_act="silu", max_position_embeddings=2048,
            type_vocab_size=2, initializer_range=0.2, layer_norm_eps=1e-12, pad_token_id=0,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
            attn_implementation="eager")
    out = REPO / "tests/data/tiny" / ("nomic-bert-tiny" if nomic else "bert-tiny")
    model = build(config, args.family)
    work = Path(args.keep_hf or tempfile.mkdtemp(prefix="rill-bert-"))
    hf = work / out.name
    hf.mkdir(parents=True, exist_ok=True)
    (hf / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(hf / "vocab.txt"), do_lower_case=True,
                                  strip_accents=None, tokenize_chinese_chars=True)
    tokenizer.save_pretrained(hf)
    if nomic:
        save_nomic_original(model, config, hf)
    else:
        model.save_pretrained(hf)
    (hf / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (hf / "1_Pooling").mkdir(exist_ok=True)
    (hf / "1_Pooling/config.json").write_text(json.dumps(
        {"word_embedding_dimension": config.hidden_size, "pooling_mode_cls_token": not nomic,
         "pooling_mode_mean_tokens": nomic}))

    out.mkdir(parents=True, exist_ok=True)
    gguf = Path(args.bge_small_shape) if args.bge_small_shape else out / "model.gguf"
    subprocess.run([sys.executable, str(HERE / "convert.py"), args.llama_cpp, "bert-bge", "--",
                    str(hf), "--outfile", str(gguf), "--outtype", "f32"], check=True,
                   stdout=subprocess.DEVNULL)
    if args.bge_small_shape:
        print(f"wrote {gguf}")
        return

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
    (out / "reference.json").write_text(json.dumps({
        "model": out.name,
        "made_by": "tools/models/make_encoder.py",
        "seed": SEED,
        "config": {k: getattr(config, k) for k in (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
            "layer_norm_eps")} | ({"rope_theta": 1000.0} if nomic else {}),
        "pooling": "mean" if nomic else "cls",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "cases": cases,
    }, indent=1) + "\n")
    print(f"wrote {gguf} and {out / 'reference.json'}")


if __name__ == "__main__":
    main()
