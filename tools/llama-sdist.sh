#!/usr/bin/env bash
# Extracts one part of llama.cpp, as vendored in the source distribution of PyPI's
# llama-cpp-python, and prints the directory that holds it:
#
#   tools/llama-sdist.sh NAME PATTERN CHECK
#
# NAME: the directory under $RILL_PEERS (default ~/.cache/rill-peers) that receives it, suffixed
# with the version; PATTERN: what to extract, below vendor/llama.cpp/; CHECK: a glob (relative to
# the extracted files) that must match, or the extraction is refused. The sdist is downloaded by
# package name with pip (so your pip configuration applies) into $RILL_PEERS/sdist and shared by
# every part; both are reused on later runs. tools/llama-vocabs.sh and tools/llama-templates.sh
# call this.
set -euo pipefail
name=$1 pattern=$2 check=$3

version=0.3.36
peers=${RILL_PEERS:-$HOME/.cache/rill-peers}
dest=$peers/$name-$version
sdist_dir=$peers/sdist
sdist=$sdist_dir/llama_cpp_python-$version.tar.gz

if [ ! -d "$dest" ]; then
  mkdir -p "$sdist_dir"
  if [ ! -s "$sdist" ]; then
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
      --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$sdist_dir" >&2
  fi
  tmp=$(mktemp -d "$peers/.$name.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  tar -xzf "$sdist" -C "$tmp" --wildcards "*/vendor/llama.cpp/$pattern"
  mkdir "$tmp/out"
  # shellcheck disable=SC2086 # the pattern is a glob
  mv "$tmp"/*/vendor/llama.cpp/$pattern "$tmp/out/"
  # shellcheck disable=SC2086
  ls "$tmp"/out/$check >/dev/null
  # Appears whole or not at all.
  mv -T "$tmp/out" "$dest"
fi
echo "$dest"
