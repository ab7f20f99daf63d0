#!/usr/bin/env bash
# Coverage-guided fuzzing of what rill reads from outside: GGUF files, text and ids through real
# tokenizers, chat templates, request bodies (fuzz/fuzz_targets/*). Builds with cargo-fuzz
# (libFuzzer, AddressSanitizer) on the stable toolchain through RUSTC_BOOTSTRAP=1, seeds each
# target from files of the repository and llama.cpp's vocabularies, and runs each for RUNS
# executions or SECONDS seconds, whichever comes first. A crash, a hang (over 10 s for one input)
# or an input that needs more than 2 GiB stops that target and is kept under fuzz/artifacts/.
#
#   tools/fuzz.sh                      # every target, 10^7 runs or an hour each
#   RUNS=100000 SECONDS_EACH=60 tools/fuzz.sh request gguf
#
# Needs: cargo install cargo-fuzz; a C++ compiler (libFuzzer is built from source); the vocab
# files (bash tools/llama-vocabs.sh) for the tokenizer target.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-10000000}
seconds=${SECONDS_EACH:-3600}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(gguf request chat_template tokenizer)
vocabs=$(bash tools/llama-vocabs.sh)
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O --fuzz-dir fuzz

corpus=fuzz/corpus
mkdir -p "$corpus"/{gguf,request,chat_template,tokenizer}
# GGUF seeds: the tiny test models' headers and metadata (the first 64 KiB; the fuzzer grows or
# shrinks them), and small vocabulary files whole.
for f in tests/data/tiny/*/model.gguf; do
  head -c 65536 "$f" > "$corpus/gguf/$(basename "$(dirname "$f")").bin"
done
python3 tools/fuzz_seed_gguf.py "$corpus/gguf/minimal.bin"
# Requests: the bodies the server tests send.
python3 - "$corpus/request" <<'PY'
import json, sys, os
out = sys.argv[1]
bodies = [
  {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0.7, "top_p": 0.9, "stop": ["\n"], "logprobs": True, "top_logprobs": 3, "seed": 1, "n": 2, "stream": True, "stream_options": {"include_usage": True}},
  {"messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}, {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "1"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}], "tool_choice": "auto"},
  {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}, "logit_bias": {"5": -100}, "min_p": 0.1, "top_k": 4, "repeat_penalty": 1.1},
  {"prompt": [[1, 2, 3], [4]], "max_tokens": 1, "echo": False, "best_of": 1, "suffix": ""},
  {"prompt": ["a", "b"], "guided_regex": "[a-z]+", "stop_token_ids": [1, 2]},
]
for i, b in enumerate(bodies):
    for mode in (0, 1):
        with open(os.path.join(out, f"{i}-{mode}.bin"), "wb") as f:
            f.write(bytes([mode]) + json.dumps(b).encode())
PY
# Templates: llama.cpp's real chat templates (mode byte 0: the template is the input).
templates=$(bash tools/llama-templates.sh)
for f in "$templates"/*.jinja; do
  { printf '\0'; cat "$f"; } > "$corpus/chat_template/$(basename "$f").bin"
done
# Tokenizer: llama.cpp's tokenizer test inputs.
for f in "$vocabs"/*.inp; do
  { printf '\0'; head -c 4096 "$f"; } > "$corpus/tokenizer/$(basename "$f").bin"
done

status=0
for t in "${targets[@]}"; do
  max_len=4096
  [ "$t" = gguf ] && max_len=70000
  [ "$t" = chat_template ] && max_len=16384
  run() {
    echo "== $t $*"
    cargo fuzz run -O --fuzz-dir fuzz "$t" "$corpus/$t" -- -runs="$runs" -max_total_time="$seconds" \
      -max_len=$max_len -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 2>&1 \
      | grep -E "^(#[0-9]+ *DONE|stat::|==[0-9]+==|SUMMARY|Done|artifact_prefix|Test unit written)" || true
    return "${PIPESTATUS[0]}"
  }
  if [ "$t" = tokenizer ]; then
    for v in llama-bpe qwen2 llama-spm gemma-4 phi-3; do
      RILL_FUZZ_VOCAB="$vocabs/ggml-vocab-$v.gguf" run "($v)" || status=1
    done
  else
    run || status=1
  fi
done
exit $status
