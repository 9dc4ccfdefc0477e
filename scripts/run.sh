#!/usr/bin/env bash
# The one command for a newcomer: install, build, and serve a default model.
#   scripts/run.sh [--model PATH] [--port N] [other engine-host options]
# Default model: the TinyStories 260K model in ../shared/testdata (override
# with --model or $MODEL).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
model=${MODEL:-../shared/testdata/models/stories260K.gguf}
args=("$@")
[[ " $* " == *" --model "* ]] || args=(--model "$model" "${args[@]}")
exec build/bin/engine-host --plugins build/plugins "${args[@]}"
