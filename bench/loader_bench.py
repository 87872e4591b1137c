#!/usr/bin/env python3
"""The data pipeline under training load: data wait with augmentation on, and a warm
augmentation cache against no augmentation, on the W1 and W2 shapes.

For each workload it trains on a generated .npy series with the workload's shape (W1: 8 features,
lookback 150, 2x128 LSTM, batch 256; W2: 4 features, lookback 105, bidirectional 2x128 masked
autoencoder, batch 512) in four settings, a few epochs each:
  plain      no augmentation
  augmented  all five augmentations (p 0.5 each) on the fly in the loader's workers
  cold cache augment.cache: true, first run (builds the cache)
  warm cache the same again (reuses it)
and prints, per setting, the median over epochs 2.. of the data-wait share of the training time
and of samples/s, read from metrics.jsonl.

usage: bench/loader_bench.py [--seqforge build/seqforge] [--epochs 3] [--batches 6] [--workers auto]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

WORKLOADS = {
    "W1": dict(features=8, lookback=150, hidden=128, layers=2, bidirectional=False, batch=256,
               task="forecast"),
    "W2": dict(features=4, lookback=105, hidden=128, layers=2, bidirectional=True, batch=512,
               task="mae"),
}
AUGMENT = ["augment.jitter.p=0.5", "augment.scaling.p=0.5", "augment.magnitude_warp.p=0.5",
           "augment.time_warp.p=0.5", "augment.window_slice.p=0.5"]


def write_data(path, features, rows):
    t = np.arange(rows, dtype=np.float64)[:, None]
    cols = features + 1
    x = np.sin(t * 0.01 * (1 + np.arange(cols))) + 0.1 * np.random.default_rng(0).standard_normal((rows, cols))
    np.save(path, x.astype(np.float32))


def run(binary, work, name, w, data, extra, epochs, batches, workers):
    cfg = os.path.join(work, name + ".yaml")
    feats = ", ".join("'%d'" % i for i in range(w["features"]))
    with open(cfg, "w") as f:
        f.write("data:\n  path: %s\n  task: %s\n  features: [%s]\n" % (data, w["task"], feats))
        if w["task"] == "forecast":
            f.write("  targets: ['%d']\n" % w["features"])
        f.write("  lookback: %d\n  split: {train: 0.9, val: 0.02}\n" % w["lookback"])
        f.write("model:\n  hidden: %d\n  layers: %d\n  bidirectional: %s\n"
                % (w["hidden"], w["layers"], str(w["bidirectional"]).lower()))
        f.write("train:\n  epochs: %d\n  batch_size: %d\n  max_batches: %d\n  precision: fp32\n"
                % (epochs, w["batch"], batches))
        f.write("  early_stopping: {patience: 0}\n  save: last\n")
    run_dir = os.path.join(work, "run_" + name)
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [binary, "train", cfg, "train.run_dir=" + run_dir, "data.num_workers=" + workers] + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("%s failed: %s" % (name, out.stderr))
    epochs_m = [j for j in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))
                if "epoch" in j]
    later = epochs_m[1:] or epochs_m
    return (statistics.median(e["data_wait_share"] for e in later),
            statistics.median(e["samples_per_second"] for e in later),
            [l for l in out.stdout.splitlines()
             if l.startswith("loader:") or l.startswith("augmentation cache:")])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqforge", default="build/seqforge")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--workers", default="auto")
    p.add_argument("--only", default="W1,W2")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="seqforge_loader_bench_")
    cache_dir = os.path.join(work, "augment-cache")
    print("| workload | setting | data wait (median share of training time) | samples/s (median) |")
    print("|---|---|---|---|")
    for wid in a.only.split(","):
        w = WORKLOADS[wid]
        data = os.path.join(work, wid + ".npy")
        write_data(data, w["features"], w["batch"] * a.batches + w["lookback"] + 400)
        settings = [("plain", []), ("augmented", AUGMENT),
                    ("cold cache", AUGMENT + ["augment.cache=true", "augment.cache_dir=" + cache_dir]),
                    ("warm cache", AUGMENT + ["augment.cache=true", "augment.cache_dir=" + cache_dir])]
        for name, extra in settings:
            wait, rate, notes = run(a.seqforge, work, wid + "_" + name.replace(" ", "_"), w, data,
                                    extra, a.epochs, a.batches, a.workers)
            print("| %s | %s | %.2f%% | %.0f |" % (wid, name, 100 * wait, rate))
            for n in notes:
                print("  <!-- %s -->" % n, file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
