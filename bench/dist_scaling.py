#!/usr/bin/env python3
"""Data-parallel scaling of W1 and W4 on this machine: 1 process x 2 threads against
mpirun -np 2 x 1 thread each, at the same global batch; samples/s from metrics.jsonl (training
time only), the median over epochs after the first. Also the all-reduce volume per step and an
estimate of its cost across machines.

  bench/dist_scaling.py [--seqforge build/seqforge] [--epochs 6] [--work /tmp/seqforge-dist]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

import numpy as np

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--seqforge", default=os.path.join(root, "build", "seqforge"))
ap.add_argument("--epochs", type=int, default=6)
ap.add_argument("--work", default="/tmp/seqforge-dist-scaling")
args = ap.parse_args()
shutil.rmtree(args.work, ignore_errors=True)
os.makedirs(args.work)

# W1's data: 8 features, 1 target, long enough for 24 global batches of 256 windows.
rng = np.random.default_rng(0)
rows = 8000
t = np.arange(rows)[:, None]
x = np.sin(t * rng.uniform(0.01, 0.2, 8)) + 0.1 * rng.standard_normal((rows, 8))
w1_csv = os.path.join(args.work, "w1.csv")
np.savetxt(w1_csv, x, delimiter=",", header=",".join(f"f{i}" for i in range(8)), comments="")

workloads = {
    # name: (yaml, global batch, steps per epoch)
    "W1": (f"""data: {{path: {w1_csv}, targets: [f0], lookback: 150, split: {{train: 0.9, val: 0.01}}}}
model: {{hidden: 128, layers: 2}}
train: {{save: last}}
""", 256, 12),
    "W4": (f"""data: {{path: {root}/data/tinyshakespeare.txt, task: charlm, seq_len: 128,
       split: {{train: 0.9, val: 0.002}}}}
model: {{embedding: 64, hidden: 512, layers: 2}}
train: {{save: last}}
""", 64, 6),
}
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_WAIT_POLICY="passive")
env.pop("OMP_NUM_THREADS", None)
mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2"]


def train(name, yaml, cmd_prefix, batch, threads, label):
    cfg = os.path.join(args.work, f"{name}.yaml")
    with open(cfg, "w") as f:
        f.write(yaml)
    run = os.path.join(args.work, f"{name}-{label}")
    p = subprocess.run(cmd_prefix + [args.seqforge, "train", cfg, f"train.batch_size={batch}",
                                     f"train.threads={threads}", f"train.epochs={args.epochs}",
                                     f"train.max_batches={workloads[name][2]}",
                                     f"train.run_dir={run}"],
                       env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{name} {label} failed:\n{p.stdout}\n{p.stderr}")
    params = int(re.search(r"(\d+) parameters", p.stdout).group(1))
    lines = [j for j in map(json.loads, open(os.path.join(run, "metrics.jsonl")))
             if "epoch" in j][1:]
    return statistics.median(l["samples_per_second"] for l in lines), params


print(f"{'workload':9}{'1 proc x 2 thr':>16}{'2 procs x 1 thr':>17}{'ratio':>8}"
      f"{'all-reduce/step':>17}{'step (2 procs)':>16}{'10 Gbit/s':>11}{'100 Gbit/s':>12}")
for name, (yaml, global_batch, _) in workloads.items():
    one, params = train(name, yaml, [], global_batch, 2, "1x2")
    two, _ = train(name, yaml, mpirun, global_batch // 2, 1, "2x1")
    mb = params * 4 / 1e6
    step_ms = 1e3 * global_batch / two
    # Ring all-reduce: each rank sends and receives 2 (N-1)/N of the buffer; N = 2 here, about
    # the full buffer for large N. Bandwidth only; latency per bucket adds ~10-50 us.
    ring = lambda gbit: 2 * params * 4 * 8 / (gbit * 1e9) * 1e3  # ms, large N
    print(f"{name:9}{one:>12.0f} s/s{two:>13.0f} s/s{two / one:>8.2f}{mb:>14.2f} MB"
          f"{step_ms:>13.1f} ms{ring(10):>8.2f} ms{ring(100):>9.3f} ms", flush=True)
