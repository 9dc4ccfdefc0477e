#!/usr/bin/env bash
# On the GPU machine: unpacks .device/stage.tar.xz (or DIR/stage.tar.xz; see
# device-stage.sh) to the absolute paths it was packed from.
#   scripts/device-unpack.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
tar -C / -xJf "${1:-.device}/stage.tar.xz"
echo "unpacked build and test data; GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo none)"
# The GPU tests run the Python the build was configured with (an absolute
# path of the development machine, which device-stage.sh writes to
# <build>/PYTHON3): where the GPU machine lacks that path, point it at the
# machine's own python3.
for f in $(tar -tJf "${1:-.device}/stage.tar.xz" | grep '/PYTHON3$' || true); do
  py=$(cat "/$f")
  if [ -n "$py" ] && [ ! -x "$py" ] && command -v python3 > /dev/null; then
    mkdir -p "$(dirname "$py")" && ln -sf "$(command -v python3)" "$py" && echo "python3: $py -> $(command -v python3)"
  fi
done
