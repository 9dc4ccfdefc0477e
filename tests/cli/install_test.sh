#!/usr/bin/env bash
# `cmake --install` puts the plugins in <prefix>/lib/engine-host/plugins with
# their manifests (sha256 still matching), and the installed engine-host
# finds them with no --plugins. Usage: install_test.sh CMAKE BUILD_DIR TESTDATA_DIR
set -uo pipefail
cmake=$1 build=$2 testdata=$3
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
if ! "$cmake" --install "$build" --prefix "$prefix" >"$prefix.log" 2>&1; then
  echo "FAIL: cmake --install"; cat "$prefix.log"; rm -f "$prefix.log"; exit 1
fi
rm -f "$prefix.log"
fails=0
[[ -f "$prefix/lib/engine-host/plugins/cpu-reference.manifest.json" && -f "$prefix/lib/engine-host/plugins/libeh-cpu-reference.so" ]] ||
  { echo "FAIL: plugins not installed: $(ls -R "$prefix/lib" 2>&1 | head)"; fails=1; }
extra=$(find "$prefix/lib/engine-host/plugins" -mindepth 1 ! -name '*.so' ! -name '*.manifest.json')
[[ -z "$extra" ]] || { echo "FAIL: more than plugins installed: $(head -3 <<<"$extra")"; fails=1; }
out=$(env -u ENGINE_HOST_PLUGINS "$prefix/bin/engine-host" plugins 2>&1)
[[ $? -eq 0 && "$out" == *"searched: $prefix/lib/engine-host/plugins"* && "$out" == *"cpu-reference"*"accepted"* ]] ||
  { echo "FAIL: installed engine-host: $out"; fails=1; }
out=$(env -u ENGINE_HOST_PLUGINS "$prefix/bin/engine-host" chat -m "$testdata/models/stories260K.gguf" --device cpu -p hi -n 4 2>&1)
[[ $? -eq 0 ]] || { echo "FAIL: installed chat: $out"; fails=1; }
[[ $fails -eq 0 ]] && echo "install: ok"
[[ $fails -eq 0 ]]
