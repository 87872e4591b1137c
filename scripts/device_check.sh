#!/usr/bin/env bash
# Run on a GPU machine from the repository root, with device-pack.tar.xz (scripts/device_pack.sh)
# beside it: finds the CUDA libraries, runs the CUDA tests (op driver, PyTorch parity, whole runs
# on the GPU against the CPU) and the side-by-side benchmark against PyTorch on the GPU, and
# writes logs and JSON into OUT (default ./device-out). Exits non-zero when a test fails or
# compute-sanitizer finds a bad access in the op driver's kernels.
#   OUT=/tmp/out scripts/device_check.sh [--no-bench | --bench-rounds R | --profile W | --racecheck]
# (R default 2; --profile: Nsight Compute on workload W's whole-chain kernels, nothing else;
# --racecheck: compute-sanitizer's racecheck and synccheck on the kernels that share memory
# between a block's threads, nothing else)
# SEQFORGE_BENCH_PRECISIONS picks the benchmark's precisions (default fp32 bf16 fp16).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
work="$(mktemp -d "${TMPDIR:-/tmp}/seqforge-device.XXXXXX")"
tar -xJf "$root/device-pack.tar.xz" -C "$work" || { echo "no device-pack.tar.xz" >&2; exit 2; }
pack="$work/seqforge-device"
# The Python with PyTorch: PYTHON, else the first python3 that imports torch.
python="${PYTHON:-}"
for candidate in python3 /usr/bin/python3; do
  [ -n "$python" ] && break
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch' 2>/dev/null; then
    python="$(command -v "$candidate")"
  fi
done
[ -n "$python" ] || { echo "no python3 with PyTorch (set PYTHON)" >&2; python=python3; }

# cuBLASLt: the CUDA toolkit's, else the one PyTorch's wheels bring.
cuda_libs=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$dir/libcublasLt.so.13" ] && cuda_libs="$dir" && break
done
if [ -z "$cuda_libs" ]; then
  cuda_libs="$("$python" - <<'PY' 2>/dev/null
import glob, os, site
for base in site.getsitepackages():
    for path in glob.glob(os.path.join(base, "nvidia", "**", "libcublasLt.so*"), recursive=True):
        print(os.path.dirname(path)); raise SystemExit
PY
)"
fi
# NCCL (data-parallel sums on GPUs): beside cuBLASLt, else the one PyTorch's wheels bring.
if [ ! -e "$cuda_libs/libnccl.so.2" ]; then
  nccl_libs="$("$python" - <<'PY' 2>/dev/null
import glob, os, site
for base in site.getsitepackages():
    for path in glob.glob(os.path.join(base, "nvidia", "**", "libnccl.so.2"), recursive=True):
        print(os.path.dirname(path)); raise SystemExit
PY
)"
  [ -n "$nccl_libs" ] && cuda_libs="$cuda_libs${cuda_libs:+:}$nccl_libs"
fi
export SEQFORGE_CUDA_LIBS="$cuda_libs"  # read by the packed binaries' wrappers
export SEQFORGE_CACHE_DIR="$work/cache" SEQFORGE_FIXTURE_DIR="$work/fixtures"
seqforge="$pack/bin/seqforge"
{
  echo "commit $(cat "$pack/COMMIT" 2>/dev/null), sm $(cat "$pack/ARCHITECTURES"), cuBLASLt from ${cuda_libs:-nowhere}"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 ||
    echo "no nvidia-smi"
} | tee "$out/machine.txt"
"$seqforge" diagnose > "$out/diagnose.txt" 2>&1
grep -E "^  (cpu|cuda|gpu|backend) " "$out/diagnose.txt"

# --profile W: Nsight Compute's view of the whole-chain recurrence kernels (and the step kernels
# beside them) on workload W, forced to whole chains, instead of the tests and the benchmark.
if [ "${1:-}" = "--profile" ]; then
  workload="${2:-W1}"
  ncu="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
  SEQFORGE_RECURRENT_SCHEDULE=whole_chains timeout 300 "$ncu" --target-processes all --clock-control none \
    --kernel-name regex:recurrence --launch-skip 8 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis "$seqforge" bench "$workload" --device cuda --steps 2 \
    --matmul-precision high > "$out/ncu.txt" 2>&1
  echo "device_check.sh --profile: exit $?; Nsight Compute's report in $out/ncu.txt"
  rm -rf "$work"
  exit 0
fi

# --racecheck: shared-memory hazards (racecheck) and barriers not every thread reaches (synccheck)
# in the op driver's CUDA cases (attention, norms, cells), the tensor-core attention and the whole
# chains, each tool at most 280 s.
if [ "${1:-}" = "--racecheck" ]; then
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  status=0
  for tool in racecheck synccheck; do
    timeout 280 "$sanitizer" --tool "$tool" --error-exitcode 3 --print-limit 20 \
      "$pack/bin/seqforge_tests" --gtest_filter='Ops/OpMatchesReference.*:Attention.GpuTensorCores*:*WholeChains*' \
      > "$out/$tool.log" 2>&1
    rc=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  (PASSED|FAILED) " "$out/$tool.log" | tail -3
    if [ "$rc" -eq 124 ]; then
      echo "$tool: stopped after 280 s (see $tool.log)"
    elif [ "$rc" -ne 0 ]; then
      echo "$tool: exit $rc (see $tool.log)"
      status=1
    fi
  done
  rm -rf "$work"
  echo "device_check.sh --racecheck: exit $status; logs in $out"
  exit $status
fi

status=0
echo "== PyTorch fixtures"
for maker in make_parity_fixtures.py make_transformer_fixtures.py make_decoder_fixtures.py; do
  "$python" "$root/tests/python/$maker" "$SEQFORGE_FIXTURE_DIR" >> "$out/fixtures.log" 2>&1 ||
    { echo "$maker failed (see fixtures.log)"; status=1; }
done
echo "== CUDA tests"
"$pack/bin/seqforge_tests" \
  --gtest_filter='Backends.*:Ops/OpMatchesReference.*:Device.*:PyTorchParity.Cuda*:CudaGemm*:*LstmConcurrency.*:Attention.Gpu*' \
  --gtest_output="json:$out/tests.json" > "$out/tests.log" 2>&1 || status=1
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]" "$out/tests.log" | tail -20

echo "== compute-sanitizer memcheck, op driver"
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
if [ -x "$sanitizer" ]; then
  timeout 180 "$sanitizer" --tool memcheck --error-exitcode 3 --print-limit 20 \
    "$pack/bin/seqforge_tests" --gtest_filter='Ops/OpMatchesReference.*:PyTorchParity.CudaF32:PyTorchParity.CudaTransformerF32:*WholeChains*:Attention.GpuTensorCores*' \
    > "$out/memcheck.log" 2>&1 || { echo "memcheck failed (see memcheck.log)"; status=1; }
  grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) " "$out/memcheck.log" | tail -5
else
  echo "no compute-sanitizer"
fi

rounds=2
[ "${1:-}" = "--bench-rounds" ] && rounds="${2:?--bench-rounds needs a number}"
if [ "${1:-}" != "--no-bench" ]; then
  echo "== benchmark, GPU, seqforge against PyTorch $("$python" -c 'import torch; print(torch.__version__)')"
  # The issue's goal workloads; fp32 is TF32 on both sides. SEQFORGE_VERBOSE: the autotuner's
  # timings of the recurrence schedules (whole chains against steps) in the log.
  # shellcheck disable=SC2086
  SEQFORGE_VERBOSE=1 "$python" "$root/bench/compare.py" W1 W3 W4 W1g W4g W5 W6 A5 A5k --device cuda \
    --python "$python" --seqforge "$seqforge" --precision ${SEQFORGE_BENCH_PRECISIONS:-fp32 bf16 fp16} \
    --steps 10 --rounds "$rounds" \
    --json "$out/bench.json" 2>&1 |
    tee "$out/bench.log" || status=1
  # The recurrent stacks again with the whole-chain kernels' steps waiting on their row groups'
  # progress counters instead of grid syncs (SEQFORGE_CUDA_CHAIN_SYNC, recurrence.cuh).
  SEQFORGE_CUDA_CHAIN_SYNC=row_groups SEQFORGE_RECURRENT_SCHEDULE=whole_chains \
    "$python" "$root/bench/compare.py" W1 W1g --device cuda \
    --python "$python" --seqforge "$seqforge" --precision fp32 bf16 --steps 10 --rounds 1 \
    --json "$out/bench_row_group_waits.json" 2>&1 |
    tee "$out/bench_row_group_waits.log" || status=1
  # The same held to whole chains with grid syncs, to set them side by side.
  SEQFORGE_RECURRENT_SCHEDULE=whole_chains \
    "$python" "$root/bench/compare.py" W1 W1g --device cuda \
    --python "$python" --seqforge "$seqforge" --precision fp32 bf16 --steps 10 --rounds 1 \
    --json "$out/bench_grid_syncs.json" 2>&1 |
    tee "$out/bench_grid_syncs.log" || status=1
  # The transformers' bf16 steps again with attention on tensor cores (attention_tc.cuh).
  SEQFORGE_CUDA_ATTENTION=tensor_cores "$python" "$root/bench/compare.py" W5 W6 A5 A5k --device cuda \
    --python "$python" --seqforge "$seqforge" --precision bf16 --steps 10 --rounds 1 \
    --json "$out/bench_tensor_core_attention.json" 2>&1 |
    tee "$out/bench_tensor_core_attention.log" || status=1
fi
rm -rf "$work"
echo "device_check.sh: exit $status; logs and JSON in $out"
exit $status
