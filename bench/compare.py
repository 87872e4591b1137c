#!/usr/bin/python3
"""seqforge against PyTorch on the benchmark workloads, side by side in one run.

Usage: /usr/bin/python3 bench/compare.py [W1 ... W6 W1g W4g W1p W4p W9 A5 A5k]
                                         [--precision fp32 bf16]
                                         [--steps N]
                                         [--rounds R] [--seqforge build/seqforge] [--json FILE]
                                         [--max-isa avx2|avx512|avx512_bf16]
                                         [--device cuda] [--python python3]
For every workload, each of R rounds runs every precision on both engines in turn, N timed
steps each, every run in a fresh process (so peak memory is per workload), so that both the
engines and the precisions are compared side by side. The table shows medians of
all timed steps and the ratio PyTorch / seqforge, plus seqforge's step time over its GEMM floor
and each engine's peak resident memory. Without workloads it runs all eleven: W1..W6 (W5:
nanoGPT's Shakespeare-character transformer, W6: the same with DoRA adapters, base frozen), the
GRU workloads W1g and W4g (W1 and W4 with a GRU in place of the LSTM), the LSTM-projection
workloads W1p and W4p (W1 and W4 with proj_size H/2) and W9 (a small Llama with grouped-query
attention and DoRA on all seven Linears of each block, base frozen). A5 and A5k, named only,
time attention alone (forward and backward, W5's heads at T 256 and 1024; PyTorch's
scaled_dot_product_attention where it has it). With --device cuda both
engines train on the GPU (seqforge bench --device cuda; PyTorch with cuDNN, TF32, autocast and
the fused Adam, bench/pytorch_bench.py), the recurrent workloads only by default, and --python
names the interpreter that has a CUDA PyTorch. fp32 there is TF32 on both sides (seqforge bench
--matmul-precision high), and the table adds each engine's achieved TFLOP/s and the GPU's GEMM
peak in that precision, measured in the same run (an 8192^3 matmul through PyTorch's cuBLAS).
On a CPU whose model PyTorch's OpenBLAS does not know (it then runs generic SSE kernels), the
peer runs with OPENBLAS_CORETYPE set to the best kernels the CPU supports, and says so.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = ["W1", "W2", "W3", "W4", "W5", "W6", "W1g", "W4g", "W1p", "W4p", "W9"]
ATTENTION = ["A5", "A5k"]  # attention alone: run when named


def run(cmd, env=None):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(cmd + ["--json", f.name], check=True, stdout=subprocess.DEVNULL, env=env)
        return json.load(open(f.name))[0]


GEMM_PEAK = r'''
import json, sys, torch
torch.backends.cuda.matmul.allow_tf32 = True
n = 8192
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[sys.argv[1]]
a = torch.randn(n, n, device="cuda", dtype=dtype)
b = torch.randn(n, n, device="cuda", dtype=dtype)
for _ in range(3):
    a @ b
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ms = []
for _ in range(10):
    start.record()
    a @ b
    end.record()
    end.synchronize()
    ms.append(start.elapsed_time(end))
print(json.dumps(2 * n ** 3 / (sorted(ms)[len(ms) // 2] / 1e3) / 1e12))
'''


def gpu_gemm_peak(python, precision):
    """The GPU's GEMM rate in TFLOP/s for the precision (fp32: TF32), the median of ten."""
    out = subprocess.run([python, "-c", GEMM_PEAK, precision], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def capped_environments(tier):
    """Environments for seqforge and PyTorch with every library held to an instruction-set tier:
    seqforge's SEQFORGE_MAX_ISA; PyTorch's ATen kernels, its oneDNN and its OpenBLAS likewise."""
    if not tier:
        return None, None
    aten = {"avx2": "avx2", "avx512": "avx512", "avx512_bf16": "avx512"}[tier]
    dnnl = {"avx2": "AVX2", "avx512": "AVX512_CORE", "avx512_bf16": "AVX512_CORE_BF16"}[tier]
    blas = {"avx2": "Haswell", "avx512": "SkylakeX", "avx512_bf16": "Cooperlake"}[tier]
    sf = dict(os.environ, SEQFORGE_MAX_ISA=tier)
    pt = dict(os.environ, ATEN_CPU_CAPABILITY=aten, DNNL_MAX_CPU_ISA=dnnl,
              ONEDNN_MAX_CPU_ISA=dnnl, OPENBLAS_CORETYPE=blas)
    return sf, pt


# OpenBLAS picks its kernels by CPU model; a model newer than it knows (a Xeon of 2023 for 0.3.21)
# falls back to these generic SSE kernels, several times slower than its AVX2/AVX-512 ones.
GENERIC_OPENBLAS_CORES = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Katmai",
                          "Coppermine", "Northwood", "Banias", "Atom", "Generic"}

OPENBLAS_CORE = '''
import ctypes
lib = ctypes.CDLL("libopenblas.so.0")
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())
'''


def peer_blas_environment(python):
    """PyTorch's environment with OpenBLAS on the best kernels the CPU runs, where OpenBLAS does not
    know the CPU's model and would fall back to generic ones: the peer as a user would tune it."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return None
    try:
        core = subprocess.run([python, "-c", OPENBLAS_CORE], capture_output=True, text=True,
                              check=True).stdout.strip()
        flags = open("/proc/cpuinfo").read().split()
    except (OSError, subprocess.CalledProcessError):
        return None
    if core not in GENERIC_OPENBLAS_CORES:
        return None
    best = ("Cooperlake" if "avx512_bf16" in flags else "SkylakeX" if "avx512f" in flags else
            "Haswell" if "avx2" in flags and "fma" in flags else None)
    if best is None:
        return None
    print("PyTorch's OpenBLAS would run its generic %s kernels on this CPU: OPENBLAS_CORETYPE=%s"
          % (core, best), flush=True)
    return dict(os.environ, OPENBLAS_CORETYPE=best)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workloads", nargs="*", default=WORKLOADS)
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seqforge", default=os.path.join(HERE, "..", "build", "seqforge"))
    p.add_argument("--json")
    p.add_argument("--max-isa", choices=["avx2", "avx512", "avx512_bf16"],
                   help="hold both engines to this instruction-set tier (an AVX2-only machine, "
                        "say, on an AVX-512 one)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--python", default="/usr/bin/python3", help="the interpreter with PyTorch")
    a = p.parse_args()
    sf_env, pt_env = capped_environments(a.max_isa)
    if pt_env is None and a.device == "cpu":
        pt_env = peer_blas_environment(a.python)
    for wid in a.workloads:
        if wid not in WORKLOADS + ATTENTION:
            sys.exit("unknown workload %s (expected %s)" % (wid, ", ".join(WORKLOADS + ATTENTION)))
    rows = []
    cuda = a.device == "cuda"
    peaks = {}
    if cuda:
        for prec in a.precision:
            peaks[prec] = gpu_gemm_peak(a.python, prec)
            print("GPU GEMM peak, %s%s: %.1f TFLOP/s" % (prec, " (TF32)" if prec == "fp32" else "",
                                                        peaks[prec]), flush=True)
    print("%-3s %-5s %12s %12s %8s %10s %10s %10s%s" % (
        "id", "prec", "seqforge ms", "PyTorch ms", "speedup", "sf/floor", "sf MB", "torch MB",
        "   sf TFLOP/s (peak)  torch TFLOP/s" if cuda else ""))
    for wid in a.workloads:
        # W3 steps are short: more of them for the same confidence.
        steps = a.steps * (20 if wid == "W3" else 1)
        runs = {prec: dict(sf=[], pt=[], floor=[], sf_mb=[], pt_mb=[], sf_tf=[], pt_tf=[])
                for prec in a.precision}
        # Every round runs every precision, so precisions are compared side by side as well.
        for _ in range(a.rounds):
            for prec in a.precision:
                s = run([a.seqforge, "bench", wid, "--precision", prec, "--steps", str(steps),
                         "--device", a.device] +
                        (["--matmul-precision", "high"] if cuda else []), sf_env)
                t = run([a.python, os.path.join(HERE, "pytorch_bench.py"), wid,
                         "--precision", prec, "--steps", str(steps), "--device", a.device],
                        pt_env)
                r = runs[prec]
                r["sf"] += s["step_ms"]
                r["pt"] += t["step_ms"]
                r["floor"].append(s["floor_ratio"])
                r["sf_mb"].append(s["peak_mb"])
                r["pt_mb"].append(t["peak_mb"])
                r["sf_tf"].append(s["gflops"] / 1e3)
                r["pt_tf"].append(t["gflops"] / 1e3)
        for prec in a.precision:
            sf_steps, pt_steps, floors, sf_mb, pt_mb = (runs[prec][k] for k in (
                "sf", "pt", "floor", "sf_mb", "pt_mb"))
            sf, pt = statistics.median(sf_steps), statistics.median(pt_steps)
            floors = [f for f in floors if f is not None]  # None: a step without GEMMs
            row = dict(id=wid, precision=prec, seqforge_ms=sf, pytorch_ms=pt, speedup=pt / sf,
                       floor_ratio=statistics.median(floors) if floors else None,
                       seqforge_mb=max(sf_mb),
                       pytorch_mb=max(pt_mb))
            extra = ""
            if cuda:
                row.update(seqforge_tflops=statistics.median(runs[prec]["sf_tf"]),
                           pytorch_tflops=statistics.median(runs[prec]["pt_tf"]),
                           gemm_peak_tflops=peaks[prec])
                extra = "   %8.2f (%4.1f%%)  %13.2f" % (
                    row["seqforge_tflops"], 100 * row["seqforge_tflops"] / peaks[prec],
                    row["pytorch_tflops"])
            rows.append(row)
            floor = "-" if row["floor_ratio"] is None else "%.2f" % row["floor_ratio"]
            print("%-3s %-5s %12.2f %12.2f %7.2fx %10s %10.0f %10.0f%s" % (
                wid, prec, sf, pt, pt / sf, floor, row["seqforge_mb"],
                row["pytorch_mb"], extra), flush=True)
    by = {(r["id"], r["precision"]): r for r in rows}
    for wid in a.workloads:
        if (wid, "fp32") in by and (wid, "bf16") in by:
            print("%s seqforge bf16 vs fp32: %.2fx" % (
                wid, by[(wid, "fp32")]["seqforge_ms"] / by[(wid, "bf16")]["seqforge_ms"]))
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=2)


if __name__ == "__main__":
    main()
