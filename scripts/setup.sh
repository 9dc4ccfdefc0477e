#!/usr/bin/env bash
# Installs the build dependencies from Debian 12 packages. Idempotent: does
# nothing (and needs no network) when everything is already installed.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libboost-dev libboost-filesystem-dev libboost-program-options-dev
  libspdlog-dev libfmt-dev libsimdjson-dev libcpp-httplib-dev nlohmann-json3-dev
  libssl-dev zlib1g-dev libgtest-dev libgmock-dev libicu-dev
  libzmq3-dev libmsgpack-cxx-dev
  clang libclang-rt-14-dev
  chromium chromium-driver
  python3-yaml  # tests/deploy: the Kubernetes manifests are parsed and checked
  xz-utils  # tests/constrain: llama.cpp's grammars are unpacked from the peer's src.tar.xz
  libpng-dev libjpeg62-turbo-dev  # host/image: images in requests are PNG (libpng) or JPEG (libjpeg-turbo)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found at /usr/local/cuda (CUDA plugins will be built)"
else
  echo "setup: no CUDA toolkit at /usr/local/cuda (CUDA plugins will be skipped)"
fi
