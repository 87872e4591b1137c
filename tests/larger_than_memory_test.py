#!/usr/bin/env python3
"""Trains on a .npy file larger than the memory the run may use.

The run is put in a memory cgroup (v1 or v2) limited to LIMIT_MB, and the array is several
times that size. A reader that loaded the array whole would be killed by the kernel's OOM
killer; seqforge maps it and reads windows on demand, so the page cache is reclaimed as it goes.
Every value is read at least once (the finiteness and normalisation passes), and a short epoch
of training and validation runs. Exit code 77 (skipped) where no memory cgroup can be made.

usage: larger_than_memory_test.py SEQFORGE_BINARY WORK_DIR
"""
import json
import os
import subprocess
import sys

import numpy as np

LIMIT_MB = 192
ARRAY_MB = 768
COLS = 64


def make_cgroup(name):
    """A memory cgroup limited to LIMIT_MB: (path of its procs file, how to read its peak)."""
    v1 = "/sys/fs/cgroup/memory"
    v2 = "/sys/fs/cgroup"
    limit = str(LIMIT_MB << 20)
    if os.path.isdir(v1):
        path = os.path.join(v1, name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
            f.write(limit)
        return path, os.path.join(path, "cgroup.procs"), os.path.join(path, "memory.max_usage_in_bytes")
    if os.path.exists(os.path.join(v2, "cgroup.controllers")):
        path = os.path.join(v2, name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "memory.max"), "w") as f:
            f.write(limit)
        with open(os.path.join(path, "memory.swap.max"), "w") as f:
            f.write("0")
        return path, os.path.join(path, "cgroup.procs"), os.path.join(path, "memory.peak")
    raise OSError("no memory cgroup hierarchy")


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    try:
        group, procs, peak_file = make_cgroup("seqforge_ltm_%d" % os.getpid())
    except OSError as e:
        print("SKIP: cannot create a memory cgroup here (%s)" % e)
        return 77
    array = os.path.join(work, "big.npy")
    rows = (ARRAY_MB << 20) // (COLS * 4)
    try:
        a = np.lib.format.open_memmap(array, mode="w+", dtype=np.float32, shape=(rows, COLS))
        chunk = 1 << 16
        t = np.arange(chunk, dtype=np.float32)
        for r in range(0, rows, chunk):
            n = min(chunk, rows - r)
            base = np.sin((r + t[:n, None]) * 0.001 * (1 + np.arange(COLS, dtype=np.float32)))
            a[r:r + n] = base
        a.flush()
        del a
        config = os.path.join(work, "big.yaml")
        with open(config, "w") as f:
            f.write("data:\n  path: %s\n  task: forecast\n  targets: ['%d']\n" % (array, COLS - 1))
            f.write("  features: [%s]\n" % ", ".join("'%d'" % c for c in range(COLS - 1)))
            f.write("  lookback: 32\n  stride: 997\nmodel:\n  hidden: 32\n")
            f.write("train:\n  epochs: 1\n  batch_size: 64\n  max_batches: 20\n  precision: fp32\n")
            f.write("  run_dir: %s\n" % os.path.join(work, "run"))
        # Drop the array's pages from the page cache, so the run must read them itself.
        subprocess.run(["sync"])
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")

        def enter_group():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        result = subprocess.run([binary, "train", "--overwrite", config], preexec_fn=enter_group,
                                capture_output=True, text=True, timeout=600)
        with open(peak_file) as f:
            peak_mb = int(f.read()) / (1 << 20)
        size_mb = os.path.getsize(array) / (1 << 20)
        print(result.stdout[-2000:])
        print(result.stderr[-2000:])
        print("array %.0f MB, memory limit %d MB, the group's peak use %.0f MB, exit %d"
              % (size_mb, LIMIT_MB, peak_mb, result.returncode))
        if result.returncode != 0:
            print("FAIL: training under the memory limit failed")
            return 1
        lines = open(os.path.join(work, "run", "metrics.jsonl")).read().splitlines()
        metrics = [j for j in map(json.loads, lines) if "epoch" in j][-1]
        if not (metrics["epoch"] == 1 and metrics["val_loss"] == metrics["val_loss"]):
            print("FAIL: no finite validation loss")
            return 1
        if size_mb < 3 * LIMIT_MB:
            print("FAIL: the array is not larger than the limit")
            return 1
        print("PASS")
        return 0
    finally:
        if os.path.exists(array):
            os.remove(array)
        try:
            os.rmdir(group)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
