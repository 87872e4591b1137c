#!/usr/bin/env bash
# Installs missing dependencies, then configures and builds seqforge.
#   scripts/build.sh [BUILD_DIR] [extra cmake args...]     (default build dir: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
shift || true
"$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
