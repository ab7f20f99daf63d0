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

version=0.3.36
peers=${RILL_PEERS:-$HOME/.cache/rill-peers}
dest=$peers/llama-vocabs-$version
sdist_dir=$peers/sdist
sdist=$sdist_dir/llama_cpp_python-$version.tar.gz

if [ ! -d "$dest" ]; then
  mkdir -p "$sdist_dir"
  if [ ! -s "$sdist" ]; then
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$sdist_dir" >&2
  fi
  tmp=$(mktemp -d "$peers/.llama-vocabs.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  tar -xzf "$sdist" -C "$tmp" --wildcards '*/vendor/llama.cpp/models/ggml-vocab-*'
  mkdir "$tmp/out"
  mv "$tmp"/*/vendor/llama.cpp/models/ggml-vocab-* "$tmp/out/"
  ls "$tmp"/out/ggml-vocab-*.gguf.out >/dev/null
  # Appears whole or not at all.
  mv -T "$tmp/out" "$dest"
fi
echo "$dest"
