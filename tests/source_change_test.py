#!/usr/bin/env python3
"""A data file that disappears, changes or is truncated while a run trains on it.

Each case starts `seqforge train` on a private copy of the data, waits for the first epoch's
line in metrics.jsonl, then deletes, appends to, or truncates the file. The run must stop with
a non-zero exit and a one-line error naming the file, and the checkpoint written before must
still load (`seqforge eval` on the restored data).

usage: source_change_test.py SEQFORGE_BINARY CONFIG CSV WORK_DIR
"""
import os
import shutil
import subprocess
import sys
import time

import numpy as np


def run_case(binary, config, data, work, name, action):
    run_dir = os.path.join(work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    ext = os.path.splitext(data)[1]
    copy = os.path.join(work, name + ext)
    shutil.copyfile(data, copy)
    args = [binary, "train", config, "data.path=" + copy, "train.epochs=200",
            "train.early_stopping.patience=0", "train.max_batches=30", "train.save=every_n",
            "train.save_every=1", "train.run_dir=" + run_dir, "train.precision=fp32"]
    if ext == ".npy":
        args += ["data.date_column=", "data.features=['0', '1', '2']", "data.targets=['1']"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(metrics) and open(metrics).read().count("\n") >= 1:
            break
        time.sleep(0.05)
    action(copy)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        print("FAIL %s: the run went on after the data file changed" % name)
        return False
    ok = True
    if proc.returncode == 0:
        print("FAIL %s: exit code 0" % name)
        ok = False
    lines = [l for l in err.strip().splitlines() if l]
    if not lines or os.path.basename(copy) not in lines[-1] or "data file" not in lines[-1]:
        print("FAIL %s: expected an error naming %s, got %r" % (name, copy, err[-500:]))
        ok = False
    # The checkpoint written before stays whole: evaluate it on the original data.
    shutil.copyfile(data, copy)
    ev = subprocess.run([binary, "eval", run_dir], capture_output=True, text=True)
    if ev.returncode != 0 or "test_loss" not in ev.stdout:
        print("FAIL %s: the last checkpoint does not evaluate: %s" % (name, ev.stderr[-500:]))
        ok = False
    if ok:
        print("ok %s: %s" % (name, lines[-1]))
    return ok


def main():
    binary, config, csv, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    # The same data as a .npy array (memory-mapped by the run).
    values = np.genfromtxt(csv, delimiter=",", skip_header=1, usecols=(1, 2, 3), dtype=np.float32)
    npy = os.path.join(work, "data.npy")
    np.save(npy, values)

    def append(path):
        with open(path, "a") as f:
            f.write("2030-01-01T00:00:00,1000,1,1\n")

    def truncate(path):
        os.truncate(path, os.path.getsize(path) // 2)

    results = [
        run_case(binary, config, csv, work, "deleted", os.remove),
        run_case(binary, config, csv, work, "appended", append),
        run_case(binary, config, npy, work, "npy_truncated", truncate),
        run_case(binary, config, npy, work, "npy_deleted", os.remove),
    ]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
