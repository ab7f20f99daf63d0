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
exec "$(dirname "$0")/llama-sdist.sh" llama-templates 'models/templates/*' '*.jinja'
