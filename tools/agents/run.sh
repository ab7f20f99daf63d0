#!/usr/bin/env bash
# Claude Code and Codex CLI against a running `rill serve`, offline (nothing but the server is
# contacted): installs @anthropic-ai/claude-code and @openai/codex from npm into
# ~/.cache/rill/agents on first use, then runs `claude -p` (its default request, then --bare)
# and `codex exec` with a custom model provider speaking the Responses API, each in a scratch
# directory, and prints what each answered. The answers are only as good as the served model;
# what this shows is that the agents' real requests (20-30k-token prompts, dozens of tools,
# thinking, tool calls and results over many turns) go through rill.
#
# usage: tools/agents/run.sh URL MODEL_NAME ["PROMPT"]
#   e.g. rill serve -m gemma3-270m --port 8080 & tools/agents/run.sh http://127.0.0.1:8080 gemma3-270m
set -euo pipefail
url=${1:?usage: run.sh URL MODEL_NAME [PROMPT]}
model=${2:?usage: run.sh URL MODEL_NAME [PROMPT]}
prompt=${3:-"Reply with the word hello."}
cache=${RILL_AGENTS_DIR:-$HOME/.cache/rill/agents}
mkdir -p "$cache"
if [ ! -x "$cache/node_modules/.bin/claude" ] || [ ! -x "$cache/node_modules/.bin/codex" ]; then
  (cd "$cache" && npm install --no-audit --no-fund @anthropic-ai/claude-code@2.1.328 @openai/codex@0.169.0)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "=== claude -p (default request)"
mkdir -p "$work/claude-home" "$work/claude"
(cd "$work/claude" && HOME="$work/claude-home" ANTHROPIC_BASE_URL="$url" ANTHROPIC_API_KEY=unused \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 \
  "$cache/node_modules/.bin/claude" -p "$prompt" --model "$model" --output-format json) \
  | python3 -c 'import json,sys; r=json.load(sys.stdin); print({k: r.get(k) for k in ("is_error","num_turns","result","terminal_reason")})' || true

echo "=== claude -p --bare"
(cd "$work/claude" && HOME="$work/claude-home" ANTHROPIC_BASE_URL="$url" ANTHROPIC_API_KEY=unused \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 \
  "$cache/node_modules/.bin/claude" -p "$prompt" --bare --model "$model" --output-format json) \
  | python3 -c 'import json,sys; r=json.load(sys.stdin); print({k: r.get(k) for k in ("is_error","num_turns","result","terminal_reason")})' || true

echo "=== codex exec"
mkdir -p "$work/codex-home" "$work/codex"
cat > "$work/codex-home/config.toml" <<TOML
model = "$model"
model_provider = "rill"

[model_providers.rill]
name = "rill"
base_url = "$url/v1"
wire_api = "responses"
env_key = "RILL_API_KEY"
TOML
(cd "$work/codex" && HOME="$work/codex-home" CODEX_HOME="$work/codex-home" RILL_API_KEY=unused \
  "$cache/node_modules/.bin/codex" exec --skip-git-repo-check "$prompt" </dev/null) || true
