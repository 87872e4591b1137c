#!/usr/bin/env bash
# Builds seqforge with the CUDA backend and packs what a bare GPU machine needs to run its CUDA
# checks (scripts/device_check.sh): the command-line tool, the test binary and the shared
# libraries they load beyond glibc, into device-pack.tar.xz at the repository root (at most
# 60 MiB). The GPU machine needs CUDA 13's libraries (cuBLASLt) and, for the PyTorch side of the
# checks, a CUDA PyTorch; none of this project's Debian libraries.
#   scripts/device_pack.sh [CUDA_ARCHITECTURES]     default 90 (H100, H200); 86 for an RTX 3090,
#                                                  89 for the RTX 40 series
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
arch="${1:-90}"
build="$root/build-device"
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSEQFORGE_CUDA=ON \
  -DSEQFORGE_CUDA_ARCHITECTURES="$arch" -DCMAKE_DISABLE_FIND_PACKAGE_PostgreSQL=ON >/dev/null
cmake --build "$build" -j "$(nproc)" --target seqforge_cli seqforge_tests

stage="$(mktemp -d "${TMPDIR:-/tmp}/seqforge-pack.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
pack="$stage/seqforge-device"
mkdir -p "$pack/bin" "$pack/libexec" "$pack/lib"
cp "$build/seqforge" "$build/tests/seqforge_tests" "$pack/libexec/"
strip "$pack/libexec/"*
# Each binary behind a wrapper that puts the packed libraries (and SEQFORGE_CUDA_LIBS, where
# cuBLASLt is) on its library path alone: other programs (PyTorch) keep the machine's own.
for name in seqforge seqforge_tests; do
  cat > "$pack/bin/$name" <<'WRAPPER'
#!/bin/sh
here="$(dirname "$(readlink -f "$0")")/.."
LD_LIBRARY_PATH="$here/lib${SEQFORGE_CUDA_LIBS:+:$SEQFORGE_CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  exec "$here/libexec/$(basename "$0")" "$@"
WRAPPER
  chmod +x "$pack/bin/$name"
done
# Every library the binaries load but glibc's own (the GPU machine's glibc is as new or newer).
for binary in "$pack/libexec/"*; do
  ldd "$binary" | awk '$3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libresolv.so.*) ;;
    *) cp -L "$lib" "$pack/lib/" ;;
  esac
done
strip --strip-unneeded "$pack/lib/"* 2>/dev/null || true
echo "$arch" > "$pack/ARCHITECTURES"
git -C "$root" rev-parse HEAD > "$pack/COMMIT" 2>/dev/null || true
tar -cJf "$root/device-pack.tar.xz" -C "$stage" seqforge-device
size=$(stat -c %s "$root/device-pack.tar.xz")
echo "device_pack.sh: $root/device-pack.tar.xz, $((size >> 20)) MiB ($(ls "$pack/lib" | wc -l) libraries, sm $arch)"
if [ "$size" -gt $((60 << 20)) ]; then
  echo "device_pack.sh: over 60 MiB" >&2
  exit 1
fi
