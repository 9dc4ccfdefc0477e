#!/usr/bin/env bash
# Installs plugin-abi from the build tree into a scratch prefix, builds the
# example plugin as a separate CMake project, and checks engine-host accepts it.
set -euo pipefail
build_dir=$1 example_dir=$2 engine_host=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
# Nothing from the source tree may leak in: configure from a copy.
cp -r "$example_dir" "$work/src"
cmake -S "$work/src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
out=$("$engine_host" plugins --plugins "$work/build/plugins" --json)
echo "$out"
echo "$out" | grep -q '"name": "hello-engine"'
echo "$out" | grep -q '"accepted": true'
