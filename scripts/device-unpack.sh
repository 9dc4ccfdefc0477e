#!/usr/bin/env bash
# On the GPU machine: unpacks .device/stage.tar.gz (see device-stage.sh) to
# the absolute paths it was packed from.
set -euo pipefail
cd "$(dirname "$0")/.."
tar -C / -xzf .device/stage.tar.gz
echo "unpacked build and test data; GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo none)"
