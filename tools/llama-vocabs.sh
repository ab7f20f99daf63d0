#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test vectors (models/ggml-vocab-*.gguf with their .inp/.out files)
# for rill-tokenizer's tests/llama_vocabs.rs, and prints the directory that holds them.
#
# They ship in the source distribution of PyPI's llama-cpp-python (its vendor/llama.cpp), which
# is downloaded by package name with pip (so your pip configuration applies) into
# $RILL_PEERS/sdist, and only ggml-vocab-* is extracted, into $RILL_PEERS/llama-vocabs-$VERSION
# (RILL_PEERS defaults to ~/.cache/rill-peers). Both are reused on later runs. The test finds that
# directory by itself; RILL_LLAMA_VOCABS overrides it:
#
#   tools/llama-vocabs.sh && cargo test --release -p rill-tokenizer --test llama_vocabs
#   export RILL_LLAMA_VOCABS=$(tools/llama-vocabs.sh)          # what .ci/run does
set -euo pipefail
exec "$(dirname "$0")/llama-sdist.sh" llama-vocabs 'models/ggml-vocab-*' 'ggml-vocab-*.gguf.out'
