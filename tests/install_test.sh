#!/usr/bin/env bash
# Installs seqforge from BUILD_DIR into a temporary prefix, builds examples/ against it with
# find_package(seqforge), and runs the program for one epoch; where the build has the Python
# module, the installed package imports from the prefix.
set -euo pipefail
build="$1" src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$src/examples" -B "$tmp/example" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/example" >/dev/null
"$tmp/example/minimal_training" "$src/data/co2-concentration.csv" 1
# The Python package, where the build has it: importable from the prefix's dist-packages.
if ls "$build"/python/seqforge/_native*.so >/dev/null 2>&1; then
  site="$(find "$tmp/prefix" -type d -name dist-packages | head -1)"
  [ -n "$site" ] || { echo "install_test: no dist-packages under the prefix" >&2; exit 1; }
  (cd "$tmp" && PYTHONPATH="$site" /usr/bin/python3 -c \
    'import seqforge, os, sys; assert seqforge.__file__.startswith(sys.argv[1]); print("python package", seqforge.__version__)' "$site")
fi
