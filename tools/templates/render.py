#!/usr/bin/env python3
"""Renders llama.cpp's chat templates with HF transformers' own Jinja setup and writes the
expectations rill's `crates/rill-tokenizer/tests/chat_templates.rs` compares against.

The reference is transformers itself: `transformers.utils.chat_template_utils.render_jinja_template`
(which compiles with `_compile_jinja_template`: an ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks, the loopcontrols extension, its own `tojson`, `raise_exception`, `strftime_now`,
`dict` and `namespace`), called the way `PreTrainedTokenizerBase.apply_chat_template` calls it:
`messages`, `tools` (None, or the TOOLS below for the tool cases), `documents=None`,
`add_generation_prompt`, and the tokenizer's special tokens as keyword arguments (here `bos_token` and `eos_token`, the two rill passes). The only change
is the clock: `strftime_now` sees 2026-01-15 00:00:00 (rill's test fixes the same date).

Usage (from the repository root):

    ~/refvenv/bin/python tools/templates/render.py                 # writes tests/data/templates/expected.json
    ~/refvenv/bin/python tools/templates/render.py --check         # compares with the committed file

The templates are found in $RILL_LLAMA_TEMPLATES, else fetched by tools/llama-templates.sh.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import transformers
from transformers.utils import chat_template_utils

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "data" / "templates" / "expected.json"
PROBES = REPO / "tests" / "data" / "templates" / "probes"
SOURCE = "llama-cpp-python==0.3.36 (sdist), vendor/llama.cpp/models/templates"

FIXED_NOW = _dt.datetime(2026, 1, 15, 0, 0, 0)

# bos_token / eos_token per template: the first entry whose prefix starts the file name wins, else
# DEFAULT_TOKENS. Values are those of the models' own tokenizers where known; "" stands for "the
# tokenizer has none" (rill passes "" then; printing it renders nothing either way).
DEFAULT_TOKENS = ("<s>", "</s>")
TOKENS = [
    ("meta-llama-", ("<|begin_of_text|>", "<|eot_id|>")),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")),
    ("deepseek-ai-", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")),
    ("llama-cpp-deepseek-r1", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")),
    ("fireworks-ai-llama-3", ("<|begin_of_text|>", "<|eot_id|>")),
    ("meetkai-functionary", ("<|begin_of_text|>", "<|eot_id|>")),
    ("NousResearch-Hermes-2-Pro-Llama-3", ("<|begin_of_text|>", "<|im_end|>")),
    ("NousResearch-Hermes-3-Llama-3.1", ("<|begin_of_text|>", "<|im_end|>")),
    ("Qwen", ("", "<|im_end|>")),
    ("HuggingFaceTB-SmolLM3", ("", "<|im_end|>")),
    ("google-gemma", ("<bos>", "<eos>")),
    ("CohereForAI-", ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>")),
    ("Cohere2MoE", ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>")),
    ("ibm-granite-", ("<|end_of_text|>", "<|end_of_text|>")),
    ("openai-gpt-oss", ("<|startoftext|>", "<|return|>")),
    ("microsoft-Phi-3.5", ("<s>", "<|endoftext|>")),
    ("LFM2", ("<|startoftext|>", "<|im_end|>")),
    ("MiniMax-", ("]~!b[", "[e~[")),
    ("Kimi-", ("[BOS]", "[EOS]")),
    ("moonshotai-Kimi", ("[BOS]", "[EOS]")),
    ("GLM-", ("", "<|endoftext|>")),
    ("ByteDance-Seed-OSS", ("<seed:bos>", "<seed:eos>")),
    ("NVIDIA-Nemotron", ("<s>", "<|im_end|>")),
    ("Apertus", ("<s>", "<|assistant_end|>")),
]

# Conversations: messages with `role` and `content` (and, below, tool calls and results).
CONVERSATIONS = {
    "user": [
        {"role": "user", "content": "Hello!"},
    ],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2 + 2?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi there."},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one?"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi!"},
    ],
    "unicode": [
        {"role": "user", "content": "Grüße aus Köln — 日本語, русский, العربية 🙂"},
        {"role": "assistant", "content": "Ça va? 你好! ½ × ∞"},
        {"role": "user", "content": "Encore « une » fois…"},
    ],
    "quotes_newlines": [
        {"role": "system", "content": 'Line one\nLine "two"\n'},
        {
            "role": "user",
            "content": "He said \"hi\" and 'bye'\nthen left.\n\n\tTabbed {{ not jinja }} {% raw %} "
            "back\\slash <b>&amp;</b> \\n  ",
        },
    ],
}

# Tools, as OpenAI's API and transformers' `apply_chat_template(tools=...)` take them.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city"}},
                "required": ["city"],
            },
        },
    }
]

# Conversations with tool calls (arguments as a dict, content "" beside calls: the form the most
# templates accept) and tool results.
CONVERSATIONS["tools_user"] = [{"role": "user", "content": "What is the weather in Paris?"}]
CONVERSATIONS["tool_round_trip"] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21}'},
]

# (conversation, add_generation_prompt[, "tools"]) for llama.cpp's templates
CASES = [
    ("tools_user", True, "tools"),
    ("tool_round_trip", True, "tools"),
    ("user", True),
    ("user", False),
    ("system_user", True),
    ("system_user", False),
    ("multi_turn", True),
    ("multi_turn", False),
    ("ends_with_assistant", False),
    ("unicode", True),
    ("quotes_newlines", True),
]


# ... and for the probes: small templates of this repository, one Jinja feature each
PROBE_CASES = [("multi_turn", True)]


class _FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW if tz is None else FIXED_NOW.replace(tzinfo=tz)


def tokens_for(name: str) -> tuple[str, str]:
    for prefix, tokens in TOKENS:
        if name.startswith(prefix):
            return tokens
    return DEFAULT_TOKENS


def render(source: str, messages, add_generation_prompt: bool, bos: str, eos: str, tools=None) -> dict:
    # What apply_chat_template does before rendering: drop keys whose value is None.
    messages = [{k: v for k, v in m.items() if v is not None} for m in messages]
    try:
        rendered, _ = chat_template_utils.render_jinja_template(
            conversations=[messages],
            tools=tools,
            chat_template=source,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
        )
    except Exception as e:  # noqa: BLE001 - any failure is an expected outcome to record
        return {"error": f"{type(e).__name__}: {e}"}
    return {"output": rendered[0]}


def templates_dir() -> Path:
    env = os.environ.get("RILL_LLAMA_TEMPLATES")
    if env:
        return Path(env)
    out = subprocess.run(
        ["bash", str(REPO / "tools" / "llama-templates.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def render_dir(tdir: Path, cases, tokens) -> dict:
    out = {}
    for path in sorted(tdir.glob("*.jinja")):
        data = path.read_bytes()
        source = data.decode("utf-8")
        bos, eos = tokens(path.name)
        results = []
        for conv, agp, *flags in cases:
            r = {"conversation": conv, "add_generation_prompt": agp}
            tools = TOOLS if "tools" in flags else None
            if tools:
                r["tools"] = True
            r.update(render(source, CONVERSATIONS[conv], agp, bos, eos, tools))
            results.append(r)
        out[path.name] = {
            "sha256": hashlib.sha256(data).hexdigest(),
            "bos_token": bos,
            "eos_token": eos,
            "results": results,
        }
    return out


def generate(tdir: Path) -> dict:
    chat_template_utils.datetime = _FixedDatetime
    return {
        "generator": "tools/templates/render.py",
        "reference": f"transformers {transformers.__version__} render_jinja_template, jinja2 {jinja2.__version__}",
        "templates_from": SOURCE,
        "date": FIXED_NOW.strftime("%Y-%m-%d"),
        "conversations": CONVERSATIONS,
        "tools": TOOLS,
        "templates": render_dir(tdir, CASES, tokens_for),
        "probes": render_dir(PROBES, PROBE_CASES, lambda _name: DEFAULT_TOKENS),
    }


def dump(doc: dict) -> str:
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--templates", type=Path, help="directory of *.jinja (default: $RILL_LLAMA_TEMPLATES or fetch)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args()

    tdir = args.templates or templates_dir()
    doc = generate(tdir)
    text = dump(doc)
    n_err = sum("error" in r for t in doc["templates"].values() for r in t["results"])
    n_all = sum(len(t["results"]) for t in doc["templates"].values())
    p_err = sum("error" in r for t in doc["probes"].values() for r in t["results"])
    summary = (
        f"{len(doc['templates'])} templates, {n_all} renderings ({n_err} raise); "
        f"{len(doc['probes'])} probes ({p_err} raise)"
    )
    if args.check:
        old = args.out.read_text(encoding="utf-8")
        if old != text:
            print(f"{args.out} differs from a fresh rendering ({summary})", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date ({summary})")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {summary}, {len(text.encode())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
