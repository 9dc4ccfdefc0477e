#!/usr/bin/env bash
# Packs what a run on the GPU machine needs into .device/stage.tar.xz, so
# one `run` call (carry [".device"]) has the build and the test data:
#   engine-host and the GPU test binaries ($STAGE_BINS), the plugins and test
#   plugins (libraries and manifests only), the shared libraries in
#   <build>/lib, all stripped of debug info (a stripped plugin's manifest
#   gets the stripped library's sha256, so the loader's pin still holds);
#   the ctest files and the source-tree test files the GPU tests read, so
#   `ctest -L gpu` works there; ../shared/testdata.
# Paths inside the archive are absolute paths of this machine, so binaries'
# baked-in paths (test data, test plugins) hold there too. On the device:
#   bash scripts/device-unpack.sh && <commands>
# STAGE_BINS (default below) and STAGE_DROP (test data left out) trim it;
# STAGE_OUT names another folder than .device (device-unpack.sh takes it too).
#
#   scripts/device-stage.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
testdata=$(cd ../shared/testdata && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

copy() {  # copy PATH into the stage under its absolute path
  mkdir -p "$stage$(dirname "$1")"
  cp -a "$1" "$stage$1"
}
bins=${STAGE_BINS:-engine-host eh_cuda_tests eh_cuda_probe_test eh_gpt_cuda_tests eh_e2e_gpu_tests eh_cuda_stories_tests}
for b in $bins; do
  [ -f "$build/bin/$b" ] && copy "$build/bin/$b"
done
# What the GPU tests read from the source tree by absolute path (their
# scripts, the reference models and logits), so `ctest -L gpu` runs there.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
for p in tests/reference/data tests/cli/testlib.sh tests/e2e tests/plugin_check; do
  [ -n "$src" ] && [ -e "$src/$p" ] && copy "$src/$p"
done
# STAGE_EXTRA: more absolute paths to carry as they are (e.g. another
# build's plugin folder for scripts/device-ab.sh).
for p in ${STAGE_EXTRA:-}; do copy "$p"; done
# Plugins and manifests only (the plugin folder is also CMake's build folder).
# STAGE_SKIP_PLUGINS: plugin names left out (e.g. "llama-cuda" for a gpt-only run).
skip_re="^$"
for n in ${STAGE_SKIP_PLUGINS:-}; do skip_re="$skip_re|/(lib)?eh-$n\.so$|/$n\.manifest\.json$"; done
(cd / && find "$build/plugins" "$build/test-plugins" -maxdepth 2 \( -name '*.so' -o -name '*.manifest.json' \) 2>/dev/null) |
  grep -Ev "$skip_re" | while read -r f; do copy "$f"; done
(cd / && find "$build" -name CTestTestfile.cmake -o -name '*_tests.cmake' -o -name '*_include.cmake' \
   -o -name 'DartConfiguration.tcl' | grep -v '/CMakeFiles/') | while read -r f; do copy "$f"; done
# gtest_discover_tests' ctest files include this CMake module by absolute path;
# the GPU machine's CMake may be another version.
for m in /usr/share/cmake-*/Modules/GoogleTestAddTests.cmake; do [ -f "$m" ] && copy "$m"; done
mkdir -p "$stage$build/lib"
cp -a "$build"/lib/*.so* "$stage$build/lib/" 2>/dev/null || true
# STAGE_LIB_DROP: shared libraries (globs) no staged binary links, e.g.
# "libicu*" for a run without engine-host (ICU is the tokenizers' only).
for g in ${STAGE_LIB_DROP:-}; do rm -f "$stage$build"/lib/$g; done
find "$stage$build/bin" "$stage$build/lib" -type f -exec strip --strip-debug {} + 2>/dev/null || true
# Plugins: strip, then re-pin each manifest to its stripped library (only a
# manifest that pinned the unstripped one: test plugins with a wrong pin keep it).
# (find fails on a folder no plugin was staged into; that is not an error)
{ find "$stage$build/plugins" "$stage$build/test-plugins" -name '*.manifest.json' 2>/dev/null || true; } | while read -r m; do
  lib="$(dirname "$m")/$(sed -n 's/.*"library": *"\([^"]*\)".*/\1/p' "$m")"
  [ -f "$lib" ] || continue
  old=$(sha256sum "$lib" | cut -d' ' -f1)
  grep -q "\"$old\"" "$m" || continue
  strip --strip-debug "$lib"
  sed -i "s/$old/$(sha256sum "$lib" | cut -d' ' -f1)/" "$m"
done
# The Python the GPU tests were configured with (device-unpack.sh links it
# to the GPU machine's python3 where that path is missing).
sed -n 's/^_\{0,1\}Python3_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt" | head -1 > "$stage$build/PYTHON3"
# The commit the build was made from (device-bench.sh reports it).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo '+changes')" > "$stage$build/COMMIT"
copy "$testdata"
# Files no device run reads (the tokenizer.json files carry the same data).
rm -f "$stage$testdata"/tokenizers/*/vocab.json "$stage$testdata"/tokenizers/*/merges.txt "$stage$testdata"/tokenizers/*/o200k_base.tiktoken
# STAGE_DROP: test data paths (relative to testdata) a run does not need,
# to keep the carried stage under the device's 64 MiB.
for d in ${STAGE_DROP:-}; do rm -rf "$stage$testdata/$d"; done
out=${STAGE_OUT:-.device}  # another ignored folder for a second stage
mkdir -p "$out"
rm -f "$out/stage.tar.gz" "$out/stage.tar.xz"
# One xz stream (-T1) with a 192 MiB window: the test binaries and the
# plugins link the same kernels, and one stream stores them once.
tar -C "$stage" -cf - . | xz -T1 --lzma2=preset=9,dict=192MiB > "$out/stage.tar.xz"
echo "staged $(du -h "$out/stage.tar.xz" | cut -f1) in $out (build $build, testdata $testdata)"
