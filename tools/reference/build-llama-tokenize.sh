#!/usr/bin/env bash
# Builds llama.cpp's `llama-tokenize` tool (and nothing else) from the source distribution of the PyPI
# package llama-cpp-python==0.3.36, which vendors llama.cpp. cmake and ninja come from PyPI too.
# Prints the path of the binary on stdout; everything else goes to stderr.
#
# Cache layout (shared with the project's bench setup, so either script reuses the other's work):
#   $root/tools                                  venv holding cmake + ninja
#   $root/src                                    the sdist, unpacked
#   $root/src/vendor/llama.cpp/build/bin         the binaries
# root defaults to ~/.cache/rill-peers/llamacpp-0.3.36 (override with LLAMACPP_HOME).
#
# The compile runs under `nice -n 10` with one job (-j1, override with JOBS=N): ~10-15 minutes on a
# small machine the first time, instant afterwards.
set -euo pipefail
version=0.3.36
root=${LLAMACPP_HOME:-$HOME/.cache/rill-peers/llamacpp-$version}
bin=$root/src/vendor/llama.cpp/build/bin
if [ -x "$bin/llama-tokenize" ]; then echo "$bin/llama-tokenize"; exit 0; fi
py=${PYTHON:-python3}
mkdir -p "$root"

if [ ! -x "$root/tools/bin/cmake" ] || [ ! -x "$root/tools/bin/ninja" ]; then
  "$py" -m venv "$root/tools"
  "$root/tools/bin/pip" install -q cmake==4.4.5 ninja==1.13.2 >&2
fi

if [ ! -d "$root/src/vendor/llama.cpp" ]; then
  dl=$(mktemp -d)
  # Only the sdist is wanted (no build, no dependencies). `--no-binary :all:` would also apply to the
  # sdist's build requirements, which pip installs to read its metadata, and so compile cmake from
  # source: name the one package instead.
  "$py" -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$dl" >&2
  sdist=$(ls "$dl"/llama_cpp_python-$version.tar.gz)
  rm -rf "$root/src.tmp" && mkdir -p "$root/src.tmp"
  tar xzf "$sdist" -C "$root/src.tmp" --strip-components=1
  rm -rf "$root/src" && mv "$root/src.tmp" "$root/src"
  rm -rf "$dl"
fi

export PATH=$root/tools/bin:$PATH
cd "$root/src/vendor/llama.cpp"
# The same configuration as the bench setup (GGML_NATIVE, no curl, no OpenSSL, no tests), so a later
# bench build reuses these objects rather than reconfiguring.
nice -n 10 cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF >&2
nice -n 10 cmake --build build -j"${JOBS:-1}" --target llama-tokenize >&2
echo "$bin/llama-tokenize"
