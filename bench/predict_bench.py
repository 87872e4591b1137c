#!/usr/bin/python3
"""Inference throughput, windows per second: `seqforge predict` against PyTorch running the same
model (its weights read from the run's model.safetensors) on the same windows, side by side.

Trains a short run of a forecasting config with seqforge, then alternates the two engines for
several rounds (which engine goes first rotates from round to round) and reports medians, p10-p90
and the ratio of medians; the goal is seqforge at least 3x PyTorch.

- seqforge: the inference rate `seqforge predict` reports (windows assembled and normalised,
  forward passes, outputs un-normalised; reading the CSV and writing predictions excluded), and
  the rate of the whole command (process start to exit).
- PyTorch: nn.LSTM + nn.Linear on the last step under no_grad, torch.set_num_threads(--threads),
  OMP_WAIT_POLICY=PASSIVE (WORKLOADS.md's tuning; seqforge runs with the caller's environment),
  on every complete window of the file prepared in memory: normalisation, forward passes in
  batches of --batch windows and un-normalisation are timed, reading the CSV is not. bf16 is
  torch.autocast("cpu", dtype=torch.bfloat16); bf16 runs time PyTorch in fp32 as well, for
  reference (on CPUs without bf16 instructions autocast's GEMMs are many times slower).

The predictions of the two must agree (fp32: max |difference| <= 1e-3 in the target's units;
bf16: <= 0.05 x the target's standard deviation), else the script exits 1.

Usage: /usr/bin/python3 bench/predict_bench.py [--config C.yaml] [--data D.csv]
       [--precision fp32|bf16] [--rounds 5] [--batch B] [--threads 2] [--seqforge PATH]
       [--tolerance X] [--json FILE] [--keep] [key.path=value ...]
Paths in the config and in overrides are relative to the repository root, as in the examples.
"""
import argparse
import csv
import datetime
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

# PyTorch's OpenMP threads wait passively, as WORKLOADS.md tunes it (spinning, they would also
# steal the cores from the seqforge process that follows); seqforge keeps the caller's setting.
SEQFORGE_ENV = dict(os.environ)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402  (python3-yaml comes with Debian's python3-torch stack)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def read_safetensors(path):
    """{name: float32 tensor} and the string metadata of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail("%s: too short for a safetensors header" % path)
    n = struct.unpack("<Q", data[:8])[0]
    if n > min(100_000_000, len(data) - 8):
        fail("%s: header length %d does not fit the file" % (path, n))
    header = json.loads(data[8:8 + n])
    blob = data[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        width = {"F32": 4, "BF16": 2}.get(e["dtype"])
        if width is None:
            fail("%s: %s has dtype %s (F32 or BF16 expected)" % (path, name, e["dtype"]))
        if not 0 <= a <= b <= len(blob) or b - a != count * width:
            fail("%s: %s's data_offsets [%d, %d) do not match its shape" % (path, name, a, b))
        raw = np.frombuffer(blob[a:b], dtype="<f4" if width == 4 else "<u2")
        if width == 2:  # bf16: the high half of a float32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = torch.from_numpy(raw.astype(np.float32).reshape(e["shape"]))
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


def read_series(d, path):
    """The features (rows, F) and each target column present (NaN where a cell is no number),
    rows ordered by the date column."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if d["date_column"]:
        rows.sort(key=lambda r: datetime.datetime.fromisoformat(
            r[d["date_column"]].strip().replace("Z", "")))
    try:
        x = np.array([[float(r[k]) for k in d["features"]] for r in rows], dtype=np.float64)
    except (KeyError, ValueError) as e:
        fail("%s: this benchmark needs every feature cell to be a number (%s)" % (path, e))

    def number(cell):
        try:
            return float(cell)
        except ValueError:
            return float("nan")
    targets = {k: np.array([number(r[k]) for r in rows]) for k in d["targets"]
               if rows and k in rows[0]}
    return x, targets


def pytorch_predict(model, windows, norm_x, norm_y, batch, bf16):
    """Seconds spent and the predictions (windows, targets) in the targets' units."""
    shift_x, scale_x, shift_y, scale_y = (torch.tensor(n[k], dtype=torch.float32)
                                          for n in (norm_x, norm_y) for k in ("shift", "scale"))
    out = []
    t0 = time.perf_counter()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for i in range(0, len(windows), batch):
            y = model((windows[i:i + batch] - shift_x) / scale_x).float()
            out.append(y * scale_y + shift_y)
    return time.perf_counter() - t0, torch.cat(out).numpy()


def seqforge_predict(binary, run, data, output):
    """Windows, inference windows/s (as predict reports it), whole-command windows/s, batch."""
    t0 = time.perf_counter()
    p = subprocess.run([binary, "predict", run, "--input", data, "--output", output],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env=SEQFORGE_ENV, cwd=ROOT)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        fail("seqforge predict exited with %d:\n%s" % (p.returncode, p.stderr))
    rate = re.search(r"([0-9.]+) windows/s", p.stderr)
    count = re.search(r"(\d+) windows? in", p.stderr)
    if not rate or not count:
        fail("no 'N windows in S s (R windows/s ...)' line in seqforge predict's stderr:\n"
             + p.stderr)
    batch = re.search(r"batch (\d+)", p.stderr)
    n = int(count.group(1))
    return n, float(rate.group(1)), n / wall, int(batch.group(1)) if batch else None


def read_predictions(path, targets):
    """seqforge's predictions (rows in time order, one per window), columns named by target."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [t for t in targets if not rows or t not in rows[0]]
    if missing:
        fail("%s has no prediction column %s" % (path, ", ".join(missing)))
    try:
        return np.array([[float(r[t]) for t in targets] for r in rows]).reshape(-1, len(targets))
    except ValueError as e:
        fail("%s: a prediction is not a number (%s)" % (path, e))


def spread(v):
    """Median, p10 and p90."""
    p10, p90 = np.percentile(v, [10, 90])
    return statistics.median(v), float(p10), float(p90)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=os.path.join(ROOT, "examples/configs/weather_forecast.yaml"))
    p.add_argument("--data", help="the CSV to train on and predict; default: the config's")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=0,
                   help="PyTorch's windows per forward pass; default: the batch seqforge predict "
                        "reports (256 if it reports none)")
    p.add_argument("--threads", type=int, default=2, help="PyTorch's threads")
    p.add_argument("--seqforge", default=os.path.join(ROOT, "build", "seqforge"))
    p.add_argument("--tolerance", type=float,
                   help="max |difference| of the predictions allowed, in the target's units")
    p.add_argument("--json", help="write the results to this file")
    p.add_argument("--keep", action="store_true", help="keep the run and the predictions")
    p.add_argument("overrides", nargs="*", help="key.path=value, passed to seqforge train")
    a = p.parse_args()
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    seqforge, config_path = os.path.abspath(a.seqforge), os.path.abspath(a.config)
    if not os.access(seqforge, os.X_OK):
        fail("%s is not an executable (build seqforge first, or pass --seqforge)" % seqforge)
    work = tempfile.mkdtemp(prefix="seqforge_predict_bench_")
    try:
        code = bench(a, seqforge, config_path, work)
    finally:
        if a.keep:
            print("run and predictions kept in " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(code)


def bench(a, seqforge, config_path, work):
    # 1. A short training run: the model to predict with.
    run = os.path.join(work, "run")
    train = [seqforge, "train", config_path] + a.overrides + [
        "train.epochs=1", "train.max_batches=5", "train.precision=" + a.precision,
        "train.run_dir=" + run]
    if a.data:
        train.append("data.path=" + os.path.abspath(a.data))
    t = subprocess.run(train + ["--overwrite"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, cwd=ROOT)
    if t.returncode != 0:
        fail("seqforge train exited with %d:\n%s" % (t.returncode, t.stderr))

    tensors, meta = read_safetensors(os.path.join(run, "model.safetensors"))
    config = yaml.safe_load(meta["seqforge.config"])
    d = config["data"]
    if d["task"] != "forecast" or d.get("series_column") or d.get("transform"):
        fail("this benchmark compares single-series forecasting without data.transform")
    data = d["path"] if os.path.isabs(d["path"]) else os.path.join(ROOT, d["path"])
    norm_x = json.loads(meta["seqforge.feature_norm"])
    norm_y = json.loads(meta["seqforge.target_norm"])
    x, actual = read_series(d, data)
    T, targets = d["lookback"], d["targets"]
    if len(x) < T:
        fail("%s has %d rows, fewer than data.lookback = %d" % (data, len(x), T))
    # Every complete window, as predict makes them: starts 0 .. rows - lookback.
    windows = torch.from_numpy(np.lib.stride_tricks.sliding_window_view(x, T, axis=0)
                               .transpose(0, 2, 1).astype(np.float32))
    model = Model(config["model"], x.shape[1], len(targets))
    try:
        model.load_state_dict(tensors)
    except RuntimeError as e:
        fail("model.safetensors does not fit nn.LSTM + nn.Linear: %s" % e)
    model.eval()
    torch.set_num_threads(a.threads)
    bf16 = a.precision == "bf16"

    # 2. Warm-up of both (seqforge may autotune its kernels on its first run), then R rounds,
    # the engines taking turns, which one goes first rotating from round to round.
    output = os.path.join(work, "predictions.csv")
    n, _, _, sf_batch = seqforge_predict(seqforge, run, data, output)
    if n != len(windows):
        fail("seqforge predicted %d windows, the file has %d complete windows" % (n, len(windows)))
    batch = a.batch or sf_batch or 256
    predicted = pytorch_predict(model, windows, norm_x, norm_y, batch, bf16)[1]
    if bf16:
        pytorch_predict(model, windows, norm_x, norm_y, batch, False)
    ours, whole, theirs, theirs_fp32 = [], [], [], []

    def run_seqforge():
        _, rate, rate_wall, _ = seqforge_predict(seqforge, run, data, output)
        ours.append(rate)
        whole.append(rate_wall)

    def run_pytorch():
        nonlocal predicted
        seconds, predicted = pytorch_predict(model, windows, norm_x, norm_y, batch, bf16)
        theirs.append(len(windows) / seconds)

    def run_pytorch_fp32():  # bf16 runs only: PyTorch's other precision, for reference
        theirs_fp32.append(len(windows) / pytorch_predict(model, windows, norm_x, norm_y, batch,
                                                          False)[0])

    engines = [run_seqforge, run_pytorch] + ([run_pytorch_fp32] if bf16 else [])
    for r in range(a.rounds):
        for engine in engines[r % len(engines):] + engines[:r % len(engines)]:
            engine()

    # 3. The predictions must agree.
    got = read_predictions(output, targets)
    if got.shape != predicted.shape:
        fail("seqforge wrote %d predictions, PyTorch made %d" % (len(got), len(predicted)))
    diffs = np.max(np.abs(got - predicted), axis=0)
    stds = [float(np.nanstd(actual[k])) if k in actual else float(norm_y["scale"][j])
            for j, k in enumerate(targets)]
    limits = [a.tolerance if a.tolerance is not None else 0.05 * s if bf16 else 1e-3
              for s in stds]

    # 4. The table.
    m = config["model"]
    print("model: LSTM %d layers, hidden %d%s, %d features -> %s; lookback %d; %d windows; "
          "%s, %d rounds" % (m["layers"], m["hidden"], ", bidirectional" if m["bidirectional"]
                             else "", x.shape[1], ", ".join(targets), T, len(windows),
                             a.precision, a.rounds))
    print("PyTorch %s: %d threads (torch.get_num_threads()), OMP_WAIT_POLICY=%s, batches of %d"
          % (torch.__version__, torch.get_num_threads(), os.environ["OMP_WAIT_POLICY"], batch))
    print("seqforge predict: batches of %s" % (sf_batch or "? (not reported)"))
    base = statistics.median(theirs)
    rows = [("seqforge predict (inference)", ours), ("seqforge predict (command)", whole),
            ("PyTorch (inference)", theirs)] + (
                [("PyTorch fp32 (inference)", theirs_fp32)] if bf16 else [])
    print("%-30s %12s %12s %12s %9s" % ("engine", "median w/s", "p10 w/s", "p90 w/s", "vs torch"))
    for name, v in rows:
        med, p10, p90 = spread(v)
        print("%-30s %12.0f %12.0f %12.0f %8.2fx" % (name, med, p10, p90, med / base))
    ratio = statistics.median(ours) / base
    met = ratio >= 3
    print("seqforge / PyTorch, inference, ratio of medians: %.2fx (goal: at least 3x): %s"
          % (ratio, "met" if met else "NOT MET"))
    if bf16:
        print("seqforge bf16 / PyTorch's faster precision, inference: %.2fx"
              % (statistics.median(ours) / max(base, statistics.median(theirs_fp32))))
    ok = True
    for k, diff, limit in zip(targets, diffs, limits):
        good = diff <= limit
        ok &= bool(good)
        print("predictions %s: max |seqforge - PyTorch| = %.3g (limit %.3g)%s"
              % (k, diff, limit, "" if good else "  FAIL"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(precision=a.precision, rounds=a.rounds, windows=len(windows),
                           lookback=T, model=m, batch=batch, seqforge_batch=sf_batch,
                           torch_threads=torch.get_num_threads(),
                           seqforge_windows_per_s=ours, seqforge_command_windows_per_s=whole,
                           pytorch_windows_per_s=theirs,
                           pytorch_fp32_windows_per_s=theirs_fp32 or None, ratio=ratio,
                           goal_met=met,
                           max_abs_diff=dict(zip(targets, map(float, diffs))),
                           limit=dict(zip(targets, limits)), predictions_agree=ok), f, indent=2)
    if not ok:
        print("FAIL: seqforge's and PyTorch's predictions differ beyond the limit",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    main()
