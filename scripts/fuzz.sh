#!/usr/bin/env bash
# Builds the libFuzzer targets (safetensors with a checkpoint's metadata, config, csv, npy,
# tokenizer.json with a text) with clang (ASan + UBSan) in build-fuzz/ and fuzzes each for its
# share of the given time, on a temporary copy of its seed corpus in fuzz/corpus/<name>/, so the
# repository's corpora are never modified.
#   scripts/fuzz.sh [seconds]     default 60 (12 s per fuzzer)
# Exits non-zero if any fuzzer finds a crash, sanitizer report, leak, timeout or other failure;
# every fuzzer still runs, and the reproducers are kept in build-fuzz/artifacts/<name>/.
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
fuzzers=(safetensors config csv npy tokenizer)
per_fuzzer=$((seconds / ${#fuzzers[@]}))
if [ "$per_fuzzer" -lt 1 ]; then per_fuzzer=1; fi

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DSEQFORGE_FUZZ=ON \
  -DSEQFORGE_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "${SEQFORGE_FUZZ_JOBS:-2}" \
  --target "${fuzzers[@]/%/_fuzz}"

work="$(mktemp -d "${TMPDIR:-/tmp}/seqforge-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT

failed=()
for name in "${fuzzers[@]}"; do
  cp -R "$root/fuzz/corpus/$name" "$work/$name"
  artifacts="$build/artifacts/$name"
  mkdir -p "$artifacts"
  dict=()
  if [ -f "$root/fuzz/$name.dict" ]; then dict=(-dict="$root/fuzz/$name.dict"); fi
  echo "fuzz.sh: ${name}_fuzz for ${per_fuzzer}s"
  status=0
  (cd "$work" && "$build/fuzz/${name}_fuzz" -max_total_time="$per_fuzzer" -timeout=10 \
    -rss_limit_mb=2048 "${dict[@]}" -artifact_prefix="$artifacts/" -print_final_stats=1 \
    "$work/$name") || status=$?
  if [ "$status" -ne 0 ]; then
    echo "fuzz.sh: ${name}_fuzz failed (exit $status); reproducers in $artifacts/" >&2
    failed+=("${name}_fuzz")
  fi
done
if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz.sh: failures in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: no failures in ${seconds}s (${per_fuzzer}s each for ${fuzzers[*]})"
