#!/usr/bin/env bash
# Installs seqforge from BUILD_DIR into a temporary prefix, builds examples/ against it with
# find_package(seqforge), and runs the program for one epoch.
set -euo pipefail
build="$1" src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/examples" -B "$tmp/example" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/example" >/dev/null
"$tmp/example/minimal_training" "$src/data/co2-concentration.csv" 1
