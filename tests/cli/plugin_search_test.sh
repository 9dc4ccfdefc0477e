#!/usr/bin/env bash
# Plugins found without --plugins: beside the executable, then
# $ENGINE_HOST_PLUGINS; --plugins replaces the search. The executable is
# copied into a scratch tree so the build tree's own plugins/ is not beside it.
# Usage: plugin_search_test.sh ENGINE_HOST TEST_PLUGIN_DIR TESTDATA_DIR
source "$(dirname "$0")/testlib.sh"
eh=$1 plugins=$2 testdata=$3
model=$testdata/models/stories260K.gguf
t=$scratch

# The build tree itself: build/bin/engine-host finds build/plugins.
out=$("$eh" plugins 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"searched: "*"/plugins"* && "$out" == *"cpu-reference"*"accepted"* ]]
check build-tree $? "exit $rc: $out"

mkdir -p "$t/bin" "$t/env1"
cp "$eh" "$t/bin/engine-host"
x=$t/bin/engine-host
out=$(env -u ENGINE_HOST_PLUGINS "$x" plugins 2>&1); rc=$?
[[ $rc -eq 3 && "$out" == *"no plugin directory found: looked in $t/bin/plugins"* && "$out" == *"ENGINE_HOST_PLUGINS"* ]] ||
  [[ $rc -eq 0 && "$out" == *"/lib/engine-host/plugins"* ]]  # a machine with an installed engine-host
check nothing-found $? "exit $rc: $out"

out=$(ENGINE_HOST_PLUGINS="$plugins/good" "$x" plugins --json 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"\"plugin_dirs\": ["*"$plugins/good"* && "$out" == *'"accepted": true'* ]]
check env-var $? "exit $rc: $out"

# Beside the executable comes first; the environment's copy of the same plugin is not loaded.
mkdir -p "$t/lib/engine-host/plugins"
cp "$plugins"/good/* "$t/lib/engine-host/plugins/"
cp "$plugins"/good/* "$t/env1/"
out=$(ENGINE_HOST_PLUGINS="$t/env1" "$x" plugins 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *"searched: $t/lib/engine-host/plugins, $t/env1"* && "$out" == *"already found in $t/lib/engine-host/plugins"* ]]
check order-and-shadowing $? "exit $rc: $out"

# --plugins (repeatable) replaces the search.
out=$(ENGINE_HOST_PLUGINS="$t/env1" "$x" plugins --plugins "$plugins/crash" 2>&1); rc=$?
[[ $rc -eq 3 && "$out" != *"test-engine"*"accepted"* ]]
check flag-replaces $? "exit $rc: $out"
out=$("$x" plugins --plugins "$plugins/crash" --plugins "$plugins/good" --json 2>&1); rc=$?
[[ $rc -eq 0 && "$out" == *'"accepted": true'* && "$out" == *"crashed with signal"* ]]
check flag-repeats $? "exit $rc: $out"

# A command that loads a model uses the search too (--device cpu: a CUDA
# build's GPU plugins are found as well, and rejected without a GPU).
out=$("$x" chat -m "$model" --device cpu -p "hi" -n 4 2>&1); rc=$?
[[ $rc -eq 0 ]]; check chat-uses-search $? "exit $rc: $out"

finish
