#!/usr/bin/env bash
# Packs what a run on the GPU machine needs into .device/stage.tar.gz, so
# one `run` call (carry [".device"]) has the build and the test data:
#   <build>/{bin,plugins,test-plugins} and the shared libraries in <build>/lib,
#   stripped of debug info; ../shared/testdata.
# Paths inside the archive are absolute paths of this machine, so binaries'
# baked-in paths (test data, test plugins) hold there too. On the device:
#   bash scripts/device-unpack.sh && <commands>
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
for d in bin plugins test-plugins; do
  [ -d "$build/$d" ] && copy "$build/$d"
done
mkdir -p "$stage$build/lib"
cp -a "$build"/lib/*.so* "$stage$build/lib/" 2>/dev/null || true
find "$stage$build" -type f \( -perm -u+x -o -name '*.so*' \) -exec strip --strip-debug {} + 2>/dev/null || true
copy "$testdata"
mkdir -p .device
tar -C "$stage" -czf .device/stage.tar.gz .
echo "staged $(du -h .device/stage.tar.gz | cut -f1) (build $build, testdata $testdata)"
