#!/usr/bin/env bash
# The whole test suite: builds (installing what is missing) and runs
#   1. the release build's tests (unit, finite differences, op driver, PyTorch parity on freshly
#      generated fixtures, safetensors, CLI, install + find_package),
#   2. the same tests built with AddressSanitizer + UndefinedBehaviorSanitizer,
#   3. the fuzzers (safetensors and checkpoint metadata, config, CSV, .npy) for a fixed time
#      (FUZZ_SECONDS, default 120, shared among them).
# Exits non-zero when anything fails.
#   scripts/test.sh            everything
#   scripts/test.sh --quick    release tests only
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
quick=0
[ "${1:-}" = "--quick" ] && quick=1
jobs="$(nproc)"

# The suite runs its tests side by side, so every autotune choice is timed on shared CPUs; its
# processes keep them anyway, as runs that must agree on their schedules read one another's.
export SEQFORGE_AUTOTUNE=always_cache

start=$SECONDS
timings="$(mktemp)"
trap 'rm -f "$timings" "$timings.phases" "$timings.parity"' EXIT
: >"$timings.phases"

run_suite() {  # build dir, then ctest options (-E excludes go to the first pass)
  local dir="$1"
  shift
  # The PyTorch parity tests print a table of every configuration and its max error.
  ctest --test-dir "$dir" -j "$jobs" --output-on-failure -E 'PyTorchParity' "$@" | tee -a "$timings"
  # Side by side too: their lines, numbered by test, are put back in order before printing.
  local status=0
  ctest --test-dir "$dir" -j "$jobs" -R 'PyTorchParity' -V >"$timings.parity" || status=$?
  cat "$timings.parity" >>"$timings"
  if [ "$status" -eq 0 ]; then
    sort -s -n -k1,1 "$timings.parity" | sed -n -E 's/^[0-9]+: ( |PyTorch)/\1/p'
  else
    sort -s -n -k1,1 "$timings.parity" | sed -E 's/^[0-9]+: //'
  fi
  grep -E "tests passed|tests failed" "$timings.parity"
  return "$status"
}

phase_name="" phase_start=$SECONDS
phase() {  # starts the pass named $1 (none: the end), noting how long the one before it took
  if [ -n "$phase_name" ]; then
    echo "== $phase_name took $((SECONDS - phase_start)) s" | tee -a "$timings.phases"
  fi
  phase_name="$1" phase_start=$SECONDS
  if [ -n "$1" ]; then echo "== $1"; fi
}

slowest() {  # the ten slowest tests of every pass so far, and the time since the start
  echo "== slowest tests"
  sed -n -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 \1/p' "$timings" |
    sort -rn | awk 'NR <= 10 {printf "  %8.1f s  %s\n", $1, $2}'
  phase ""
  echo "== time by pass"
  sed 's/^== /  /' "$timings.phases"
  echo "== total $((SECONDS - start)) s"
}

phase "release build"
# The CUDA kernels are compiled for one architecture here, a type check (a plain build makes
# sm_80, sm_86, sm_89 and sm_90 with PTX).
"$root/scripts/build.sh" "$root/build" -DSEQFORGE_CUDA_ARCHITECTURES="${SEQFORGE_CUDA_ARCHITECTURES:-80-real}"
phase "release tests"
run_suite "$root/build"
[ "$quick" = 1 ] && { slowest; exit 0; }

phase "AddressSanitizer + UndefinedBehaviorSanitizer build"
BUILD_TYPE=RelWithDebInfo "$root/scripts/build.sh" "$root/build-asan" -DSEQFORGE_SANITIZE=ON \
  -DSEQFORGE_CUDA=OFF
phase "AddressSanitizer + UndefinedBehaviorSanitizer tests"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  LSAN_OPTIONS=suppressions="$root/tests/lsan.supp" run_suite "$root/build-asan"

phase "fuzzers"
"$root/scripts/fuzz.sh" "${FUZZ_SECONDS:-120}"
slowest
echo "all tests passed"
