#!/usr/bin/env bash
# On the GPU machine: unpacks .device/stage.tar.xz (or DIR/stage.tar.xz; see
# device-stage.sh) to the absolute paths it was packed from.
#   scripts/device-unpack.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
tar -C / -xJf "${1:-.device}/stage.tar.xz"
echo "unpacked build and test data; GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo none)"
