#!/usr/bin/env bash
# On the GPU machine: unpacks .device/stage.tar.xz (see device-stage.sh) to
# the absolute paths it was packed from.
set -euo pipefail
cd "$(dirname "$0")/.."
tar -C / -xJf .device/stage.tar.xz
echo "unpacked build and test data; GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo none)"
