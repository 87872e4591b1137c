#!/usr/bin/env bash
# Builds the safetensors libFuzzer target with clang (ASan + UBSan) in build-fuzz/ and fuzzes a
# temporary copy of fuzz/corpus/safetensors, so the repository's seed corpus is never modified.
#   scripts/fuzz.sh [seconds]     default 60
# Exits non-zero if the fuzzer finds a crash, sanitizer report, leak, timeout or other failure;
# the reproducer is kept in build-fuzz/artifacts/.
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DSEQFORGE_FUZZ=ON \
  -DSEQFORGE_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" --target safetensors_fuzz -j "${SEQFORGE_FUZZ_JOBS:-2}"

work="$(mktemp -d "${TMPDIR:-/tmp}/seqforge-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp -R "$root/fuzz/corpus/safetensors" "$work/corpus"
artifacts="$build/artifacts"
mkdir -p "$artifacts"

status=0
(cd "$work" && "$build/fuzz/safetensors_fuzz" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -dict="$root/fuzz/safetensors.dict" -artifact_prefix="$artifacts/" \
  -print_final_stats=1 "$work/corpus") || status=$?
if [ "$status" -ne 0 ]; then
  echo "fuzz.sh: safetensors_fuzz failed (exit $status); reproducers in $artifacts/" >&2
  exit "$status"
fi
echo "fuzz.sh: no failures in ${seconds}s"
