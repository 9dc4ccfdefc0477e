#!/usr/bin/env bash
# The one command for a newcomer: install, build, and serve a model.
#   scripts/run.sh [--model PATH] [--port N] [other engine-host options]
# Default model: models/tinytales.gguf, the small story model this repository
# trains itself (tools/train-default-model/); it needs no network, no GPU and
# nothing outside the clone. Override with --model or $MODEL. The chat page is
# at http://127.0.0.1:8080/ (or the --port given).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
model=${MODEL:-models/tinytales.gguf}
args=("$@")
case " $* " in
  *" --model "* | *" --model="* | *" -m "*) ;;
  *) args=(--model "$model" "${args[@]}") ;;
esac
# Without a usable NVIDIA GPU, ask for the CPU engine: engine-host's default
# (--device auto) refuses to let it stand in for a GPU plugin that claims the
# model but was rejected (a CUDA build's plugins are rejected on such a machine).
gpu_here() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }
case " $* " in
  *" --device "* | *" --device="*) ;;
  *) gpu_here || args=(--device cpu "${args[@]}") ;;
esac
exec build/bin/engine-host --plugins build/plugins "${args[@]}"
