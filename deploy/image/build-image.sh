#!/usr/bin/env bash
# Builds an OCI image of engine-host from a build tree, without network: no
# base image, no package manager. The image holds the installed engine-host,
# its plugins, one model, and every shared library they load (found with ldd),
# glibc and its loader included. Only the NVIDIA driver libraries are left
# out: the NVIDIA container toolkit mounts the node's into the container.
#
#   deploy/image/build-image.sh [--build-dir DIR] [--model FILE] [--plugin NAME]... [--tag NAME]
#   deploy/image/build-image.sh --list     # print DEST<TAB>SOURCE for each file; build nothing
#   deploy/image/build-image.sh --rootfs DIR   # write the image's filesystem into DIR; no image
#
# --plugin keeps only the named plugins (default: every plugin the build
# installs), e.g. --plugin cpu-reference for a CPU image from a CUDA build.
# The default builds the image with buildah (run as root, or under
# `buildah unshare`, so the files keep their owners). docs/deploy.md says how
# to run it with podman, docker or Kubernetes.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=$repo/build
model=$repo/models/tinytales.gguf
tag=
mode=image
rootfs_out=
only_plugins=

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "build-image.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) [ $# -ge 2 ] || die "--build-dir needs a directory"; build_dir=$2; shift 2 ;;
    --model) [ $# -ge 2 ] || die "--model needs a file"; model=$2; shift 2 ;;
    --plugin) [ $# -ge 2 ] || die "--plugin needs a name"; only_plugins="$only_plugins $2"; shift 2 ;;
    --tag) [ $# -ge 2 ] || die "--tag needs a name"; tag=$2; shift 2 ;;
    --list) mode=list; shift ;;
    --rootfs) [ $# -ge 2 ] || die "--rootfs needs a directory"; mode=rootfs; rootfs_out=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[ -x "$build_dir/bin/engine-host" ] || die "no $build_dir/bin/engine-host: build first (scripts/build.sh)"
[ -f "$build_dir/cmake_install.cmake" ] || die "$build_dir is not a CMake build tree"
[ -f "$model" ] || die "model file '$model' not found"
command -v ldd >/dev/null || die "ldd not found"

# Where things go inside the image. The binary finds its plugins beside it
# (bin/../lib/engine-host/plugins), so it needs no --plugins.
prefix=/opt/engine-host
uid=10001
model_dest=$prefix/models/$(basename "$model")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. What an install contains: bin/engine-host and lib/engine-host/plugins/
#    (libraries and manifests, byte for byte, so the manifests' sha256 holds).
cmake --install "$build_dir" --prefix "$work/install" >/dev/null
bin=$work/install/bin/engine-host
plugin_dir=$work/install/lib/engine-host/plugins
[ -x "$bin" ] || die "the install has no bin/engine-host"
plugins=$(find "$plugin_dir" -maxdepth 1 -name 'libeh-*.so' 2>/dev/null | sort)
[ -n "$plugins" ] || die "the install has no plugins in lib/engine-host/plugins (build the plugin targets)"
if [ -n "$only_plugins" ]; then
  kept=
  for n in $only_plugins; do
    [ -f "$plugin_dir/libeh-$n.so" ] || die "no plugin '$n' in the install (it has: $(cd "$plugin_dir" && ls libeh-*.so | sed 's/^libeh-//; s/\.so$//' | tr '\n' ' '))"
    kept="$kept $plugin_dir/libeh-$n.so"
  done
  plugins=$kept
fi

# 2. The libraries they load. The loader is the binary's PT_INTERP; the rest
#    land in the loader's own directory, which it searches by default.
interp=$(LC_ALL=C readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
[ -n "$interp" ] || die "cannot read the program interpreter of $bin"
libdir=$(dirname "$(readlink -f "$interp")")
# The node provides these (nvidia-container-toolkit, capability "compute").
is_driver_lib() { case $1 in libcuda.so*|libnvidia-*|libcudadebugger.so*) return 0 ;; esac; return 1; }

: >"$work/list"
add() { printf '%s\t%s\n' "$1" "$2" >>"$work/list"; }
add "$prefix/bin/engine-host" "$bin"
for p in $plugins; do
  n=$(basename "$p" .so); n=${n#libeh-}
  add "$prefix/lib/engine-host/plugins/libeh-$n.so" "$p"
  [ -f "$plugin_dir/$n.manifest.json" ] || die "plugin $n has no manifest $n.manifest.json"
  add "$prefix/lib/engine-host/plugins/$n.manifest.json" "$plugin_dir/$n.manifest.json"
done
add "$interp" "$(readlink -f "$interp")"
missing=
for elf in "$bin" $plugins; do
  while read -r line; do
    case $line in
      *"=> not found"*)
        soname=${line%% *}
        is_driver_lib "$soname" || missing="$missing $soname($(basename "$elf"))" ;;
      *" => /"*)
        soname=${line%% *}; path=${line#* => }; path=${path%% (*}
        is_driver_lib "$soname" || add "$libdir/$soname" "$(readlink -f "$path")" ;;
    esac
  done < <(ldd "$elf")
done
[ -z "$missing" ] || die "ldd cannot resolve:$missing (install the libraries, or build where they are)"
add "$model_dest" "$(readlink -f "$model")"
# Certificates, so `--model ORG/REPO` can fetch from the Hugging Face hub;
# OpenSSL looks in its OPENSSLDIR (Debian: /usr/lib/ssl -> /etc/ssl/certs).
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] && add "$ca" "$ca"
sort -u -o "$work/list" "$work/list"
# One source per destination: two libraries of one soname would be a mistake.
dups=$(cut -f1 "$work/list" | uniq -d)
[ -z "$dups" ] || die "two sources for: $dups"

if [ "$mode" = list ]; then
  # the install is a temporary copy of the build tree's files
  sed "s|\t$work/install/|\t$build_dir (installed) |" "$work/list"
  exit 0
fi

# 3. The filesystem.
root=$work/rootfs
[ "$mode" = rootfs ] && root=$rootfs_out
if [ -e "$root" ] && [ -n "$(ls -A "$root")" ]; then die "--rootfs $root is not empty"; fi
mkdir -p "$root"
while IFS=$'\t' read -r dest src; do
  mkdir -p "$root$(dirname "$dest")"
  cp --preserve=mode "$src" "$root$dest"
done <"$work/list"
# merged-/usr layout, as Debian has it
if [ "${libdir#/usr/}" != "$libdir" ] && [ ! -e "$root/lib" ]; then ln -s usr/lib "$root/lib"; fi
if [ -f "$root$ca" ]; then
  mkdir -p "$root/usr/lib/ssl"
  ln -s /etc/ssl/certs "$root/usr/lib/ssl/certs"
  ln -s "$ca" "$root/usr/lib/ssl/cert.pem"
fi
mkdir -p "$root/etc" "$root/tmp" "$root/home/engine-host"
chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/root:/sbin/nologin\nengine-host:x:%s:%s:engine-host:/home/engine-host:/sbin/nologin\n' \
  "$uid" "$uid" >"$root/etc/passwd"
printf 'root:x:0:\nengine-host:x:%s:\n' "$uid" >"$root/etc/group"
if [ "$(id -u)" = 0 ]; then chown "$uid:$uid" "$root/home/engine-host"; fi

if [ "$mode" = rootfs ]; then
  echo "$root"
  exit 0
fi

# 4. The image.
command -v buildah >/dev/null || die "buildah not found (apt-get install buildah), or use --rootfs DIR"
version=$("$bin" --version | sed -n 's/^engine-host \([^ ]*\).*/\1/p')
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
plugin_names=$(for p in $plugins; do n=$(basename "$p" .so); printf '%s ' "${n#libeh-}"; done)
tag=${tag:-localhost/engine-host:$version}
ctr=$(buildah from scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
buildah copy --quiet "$ctr" "$root" / >/dev/null
buildah copy --quiet --chown "$uid:$uid" "$ctr" "$root/home/engine-host" /home/engine-host >/dev/null
buildah config \
  --entrypoint "[\"$prefix/bin/engine-host\", \"serve\", \"--host\", \"0.0.0.0\"]" \
  --cmd "--model $model_dest --port 8080" \
  --user "$uid:$uid" \
  --workingdir /home/engine-host \
  --env HOME=/home/engine-host \
  --env PATH="$prefix/bin" \
  --env NVIDIA_DRIVER_CAPABILITIES=compute,utility \
  --port 8080/tcp \
  --stop-signal SIGTERM \
  --label org.opencontainers.image.title=engine-host \
  --label org.opencontainers.image.description="engine-host: an LLM server with engine plugins behind a C ABI" \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.revision="$revision" \
  --label org.opencontainers.image.created="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  --label io.engine-host.plugins="${plugin_names% }" \
  --label io.engine-host.model="$model_dest" \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
trap 'rm -rf "$work"' EXIT
echo "$tag"
