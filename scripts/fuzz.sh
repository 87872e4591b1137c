#!/usr/bin/env bash
# Builds the libFuzzer targets (safetensors with a checkpoint's metadata, config, csv, npy,
# tokenizer.json with a text) with clang (ASan + UBSan) in build-fuzz/ and fuzzes each for its
# share of the given time (one fuzzer a core at a time, SEQFORGE_FUZZ_JOBS), on a temporary copy
# of its seed corpus in fuzz/corpus/<name>/, so the repository's corpora are never modified.
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
jobs="${SEQFORGE_FUZZ_JOBS:-$(nproc)}"

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DSEQFORGE_FUZZ=ON \
  -DSEQFORGE_BUILD_TESTS=OFF -DSEQFORGE_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j "$jobs" \
  --target "${fuzzers[@]/%/_fuzz}"

work="$(mktemp -d "${TMPDIR:-/tmp}/seqforge-fuzz.XXXXXX")"
trap 'rm -rf "$work"' EXIT

fuzz_one() {  # name: fuzzes it for its share of the time; its output goes to $work/$name.log
  local name="$1" artifacts="$build/artifacts/$1" dict=()
  cp -R "$root/fuzz/corpus/$name" "$work/$name"
  mkdir -p "$artifacts" "$work/$name.cwd"
  if [ -f "$root/fuzz/$name.dict" ]; then dict=(-dict="$root/fuzz/$name.dict"); fi
  (cd "$work/$name.cwd" && "$build/fuzz/${name}_fuzz" -max_total_time="$per_fuzzer" -timeout=10 \
    -rss_limit_mb=2048 "${dict[@]}" -artifact_prefix="$artifacts/" -print_final_stats=1 \
    "$work/$name") >"$work/$name.log" 2>&1
}

# Each fuzzer's output is printed whole when it ends.
declare -A pid_of
failed=()
finish() {  # name: waits for it and prints its output
  local status=0
  wait "${pid_of[$1]}" || status=$?
  echo "fuzz.sh: ${1}_fuzz for ${per_fuzzer}s"
  cat "$work/$1.log"
  if [ "$status" -ne 0 ]; then
    echo "fuzz.sh: ${1}_fuzz failed (exit $status); reproducers in $build/artifacts/$1/" >&2
    failed+=("${1}_fuzz")
  fi
}
running=()
for name in "${fuzzers[@]}"; do
  if [ "${#running[@]}" -ge "$jobs" ]; then
    finish "${running[0]}"
    running=("${running[@]:1}")
  fi
  fuzz_one "$name" &
  pid_of[$name]=$!
  running+=("$name")
done
for name in "${running[@]}"; do finish "$name"; done
if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz.sh: failures in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: no failures in ${seconds}s (${per_fuzzer}s each for ${fuzzers[*]})"
