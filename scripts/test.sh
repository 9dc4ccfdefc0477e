#!/usr/bin/env bash
# The README's test command: install, build, run every non-GPU test.
# On a GPU machine, `ctest --test-dir build -L gpu` runs the GPU tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh "$@"
ctest --test-dir "${BUILD_DIR:-build}" -LE gpu --output-on-failure -j"$(nproc)"
