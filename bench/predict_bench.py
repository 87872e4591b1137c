#!/usr/bin/python3
"""Inference throughput, windows per second: `seqforge predict` against PyTorch running the same
model (its weights read from the run's model.safetensors) on the same windows, side by side.

Trains a short run of a forecasting config, then alternates the two engines for several rounds
and reports medians and their ratio. seqforge's figure is the inference it reports (windows
assembled and normalised, forward passes, outputs un-normalised), excluding reading the CSV and
writing the predictions; its whole command's rate is shown too. PyTorch's covers the same work
on windows prepared in memory: normalised batches, nn.LSTM + nn.Linear under no_grad, outputs
un-normalised. The predictions of the two must agree.

Usage: /usr/bin/python3 bench/predict_bench.py [--config C.yaml] [--data D.csv]
       [--precision fp32|bf16] [--rounds 5] [--batch B] [--threads 2] [key.path=value ...]
"""
import argparse
import csv
import datetime
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

# PyTorch's threads wait passively (WORKLOADS.md's tuning): spinning threads left over from its
# passes would otherwise steal the cores from the seqforge run that follows.
SEQFORGE_ENV = dict(os.environ)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", name
        a, b = e["data_offsets"]
        tensors[name] = torch.from_numpy(np.frombuffer(blob[a:b], dtype=np.float32)
                                         .reshape(e["shape"]).copy())
    return tensors, meta


class Model(torch.nn.Module):
    def __init__(self, m, inputs, outputs):
        super().__init__()
        self.lstm = torch.nn.LSTM(inputs, m["hidden"], m["layers"], batch_first=True,
                                  bidirectional=m["bidirectional"])
        self.head = torch.nn.Linear((2 if m["bidirectional"] else 1) * m["hidden"], outputs)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[:, -1])


def windows_of(config, path):
    """Every complete window of the file, its rows ordered by the date column (one series)."""
    d = config["data"]
    with open(path) as f:
        rows = list(csv.DictReader(f))
    if d["date_column"]:
        rows.sort(key=lambda r: datetime.datetime.fromisoformat(
            r[d["date_column"]].replace("Z", "")))
    x = np.array([[float(r[k]) for k in d["features"]] for r in rows])
    T = d["lookback"]
    return np.stack([x[s:s + T] for s in range(len(rows) - T + 1)])


def pytorch_predict(model, windows, norm_x, norm_y, batch, bf16):
    """Seconds spent and the predictions in the targets' units."""
    shift_x, scale_x = (torch.tensor(norm_x[k], dtype=torch.float32) for k in ("shift", "scale"))
    shift_y, scale_y = (torch.tensor(norm_y[k], dtype=torch.float32) for k in ("shift", "scale"))
    raw = torch.tensor(windows, dtype=torch.float32)
    out = []
    t0 = time.perf_counter()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for i in range(0, len(raw), batch):
            y = model((raw[i:i + batch] - shift_x) / scale_x).float()
            out.append(y * scale_y + shift_y)
    return time.perf_counter() - t0, torch.cat(out).numpy()


def seqforge_predict(binary, run, data, output):
    t0 = time.perf_counter()
    p = subprocess.run([binary, "predict", run, "--input", data, "--output", output],
                       capture_output=True, text=True, env=SEQFORGE_ENV)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit("seqforge predict failed:\n" + p.stderr)
    m = re.search(r"predict: (\d+) windows in ([0-9.]+) s .*batch (\d+)", p.stderr)
    return int(m.group(1)), float(m.group(2)), wall, int(m.group(3))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=os.path.join(ROOT, "examples/configs/weather_forecast.yaml"))
    p.add_argument("--data", default=os.path.join(ROOT, "data/seattle-weather-hourly-normals.csv"))
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=0,
                   help="PyTorch's batch; default: the batch seqforge predict chose")
    p.add_argument("--threads", type=int, default=2, help="PyTorch's threads")
    p.add_argument("--seqforge", default=os.path.join(ROOT, "build", "seqforge"))
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="seqforge_predict_bench_")
    run = os.path.join(work, "run")
    subprocess.run([a.seqforge, "train", a.config, "data.path=" + a.data, "train.epochs=1",
                    "train.max_batches=5", "train.precision=" + a.precision,
                    "train.run_dir=" + run] + a.overrides, check=True, stdout=subprocess.DEVNULL)
    tensors, meta = read_safetensors(os.path.join(run, "model.safetensors"))
    import yaml  # python3-yaml comes with Debian's python3-torch stack
    config = yaml.safe_load(meta["seqforge.config"])
    if config["data"]["task"] != "forecast" or config["data"]["series_column"] or \
            config["data"]["transform"]:
        sys.exit("this benchmark compares single-series forecasting without transforms")
    norm_x = json.loads(meta["seqforge.feature_norm"])
    norm_y = json.loads(meta["seqforge.target_norm"])
    windows = windows_of(config, a.data)
    model = Model(config["model"], windows.shape[2], len(config["data"]["targets"]))
    model.load_state_dict(tensors)
    model.eval()
    torch.set_num_threads(a.threads)
    bf16 = a.precision == "bf16"

    output = os.path.join(work, "predictions.csv")
    ours, whole, theirs = [], [], []
    batch = seqforge_predict(a.seqforge, run, a.data, output)[3]  # warm-up (and autotuning)
    batch = a.batch or batch
    pytorch_predict(model, windows, norm_x, norm_y, batch, bf16)
    for _ in range(a.rounds):  # alternating, so both see the same machine
        n, seconds, wall, _ = seqforge_predict(a.seqforge, run, a.data, output)
        ours.append(n / seconds)
        whole.append(n / wall)
        seconds, predicted = pytorch_predict(model, windows, norm_x, norm_y, batch, bf16)
        theirs.append(len(windows) / seconds)

    with open(output) as f:
        got = np.array([float(r[config["data"]["targets"][0]]) for r in csv.DictReader(f)])
    if len(got) != len(predicted):
        sys.exit("seqforge wrote %d predictions, PyTorch made %d" % (len(got), len(predicted)))
    diff = float(np.max(np.abs(got - predicted[:, 0])))
    spread = float(np.std(predicted[:, 0]))
    limit = 1e-3 * max(1.0, spread) if not bf16 else 0.05 * spread
    ratio = statistics.median(ours) / statistics.median(theirs)
    m = config["model"]
    print("model: LSTM %d layers, hidden %d%s, lookback %d, %d windows in batches of %d; %s; "
          "torch %s, %d threads" % (m["layers"], m["hidden"],
                                    ", bidirectional" if m["bidirectional"] else "",
                                    config["data"]["lookback"], len(windows), batch, a.precision,
                                    torch.__version__, torch.get_num_threads()))
    print("%-28s %12s %12s %12s" % ("engine", "median w/s", "min w/s", "max w/s"))
    for name, v in (("seqforge predict (inference)", ours),
                    ("seqforge predict (command)", whole), ("PyTorch (inference)", theirs)):
        print("%-28s %12.0f %12.0f %12.0f" % (name, statistics.median(v), min(v), max(v)))
    print("ratio of medians, inference: %.2fx (goal: at least 3x)%s" %
          (ratio, "" if ratio >= 3 else "  NOT MET"))
    print("predictions: max |seqforge - PyTorch| = %.3g (%s units; the predictions' spread %.3g)"
          % (diff, config["data"]["targets"][0], spread))
    if not diff <= limit:
        sys.exit("FAIL: the predictions differ by more than %.3g" % limit)


if __name__ == "__main__":
    main()
