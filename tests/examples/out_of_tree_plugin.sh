#!/usr/bin/env bash
# Installs plugin-abi from the build tree into a scratch prefix, builds the
# example plugin as a separate CMake project, checks engine-host accepts it,
# and chats through it: the example runs on the batched step alone (ABI 1.4)
# and answers with the prompt's tokens backwards.
set -euo pipefail
build_dir=$1 example_dir=$2 engine_host=$3 model=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
# Nothing from the source tree may leak in: configure from a copy.
cp -r "$example_dir" "$work/src"
cmake -S "$work/src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >/dev/null
cmake --build "$work/build" >/dev/null
out=$("$engine_host" plugins --plugins "$work/build/plugins" --json)
echo "$out"
echo "$out" | grep -q '"name": "hello-engine"'
echo "$out" | grep -q '"accepted": true'

# The reply replays the context backwards from its end, token by token; at
# the start it wraps to the end again, where its own reversed reply now is,
# so the prompt's words come back in their order.
reply=$("$engine_host" chat --plugins "$work/build/plugins" -m "$model" -p "one two three" -n 40 --temp 0 | tr -d '\000')
echo "reply: '$reply'"
[[ "$reply" == *"one two three"* ]]

# The conformance harness, as installed, passes the example (it offers no
# seq_logits, step halves, adapters, image or park calls, so those checks are
# skipped by name; it grants no draft tokens and refuses EH_STEP_VERIFY).
verdict=$("$work/prefix/bin/eh-plugin-check" "$work/build/plugins/libeh-hello-engine.so" --model "$model")
echo "$verdict"
[[ "$verdict" == *"hello-engine: 18 passed, 0 failed, 7 skipped"* ]]
