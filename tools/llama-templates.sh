#!/usr/bin/env bash
# Fetches llama.cpp's collection of real chat templates (models/templates/*.jinja) for
# rill-tokenizer's tests/chat_templates.rs and tools/templates/render.py, and prints the directory
# that holds them.
#
# They ship in the source distribution of PyPI's llama-cpp-python (its vendor/llama.cpp), which
# is downloaded by package name with pip (so your pip configuration applies) into
# $RILL_PEERS/sdist, and only models/templates/* is extracted, into
# $RILL_PEERS/llama-templates-$VERSION (RILL_PEERS defaults to ~/.cache/rill-peers). Both are
# reused on later runs; the sdist is shared with tools/llama-vocabs.sh. The test finds that
# directory by itself; RILL_LLAMA_TEMPLATES overrides it:
#
#   tools/llama-templates.sh && cargo test --release -p rill-tokenizer --test chat_templates
#   export RILL_LLAMA_TEMPLATES=$(tools/llama-templates.sh)     # what .ci/run does
set -euo pipefail

version=0.3.36
peers=${RILL_PEERS:-$HOME/.cache/rill-peers}
dest=$peers/llama-templates-$version
sdist_dir=$peers/sdist
sdist=$sdist_dir/llama_cpp_python-$version.tar.gz

if [ ! -d "$dest" ]; then
  mkdir -p "$sdist_dir"
  if [ ! -s "$sdist" ]; then
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$sdist_dir" >&2
  fi
  tmp=$(mktemp -d "$peers/.llama-templates.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  tar -xzf "$sdist" -C "$tmp" --wildcards '*/vendor/llama.cpp/models/templates/*'
  mkdir "$tmp/out"
  mv "$tmp"/*/vendor/llama.cpp/models/templates/* "$tmp/out/"
  ls "$tmp"/out/*.jinja >/dev/null
  # Appears whole or not at all.
  mv -T "$tmp/out" "$dest"
fi
echo "$dest"
