#!/usr/bin/python3
"""Trains an example config with seqforge and the same architecture in PyTorch, and compares the
final validation loss.

Both start from the same initial weights (PyTorch's, handed to seqforge through model.init_from),
use the same data split, normalisation, windows, batches (seqforge's shuffle, replayed), optimizer
(AdamW), learning-rate schedule (linear warm-up, then constant or cosine) and gradient clipping,
in fp32, without dropout: the two final losses agree to float32 rounding.

The model is PyTorch's nn.LSTM (with proj_size) or nn.GRU under a Linear head, or for
model.family transformer a nanoGPT-style GPT (tests/python/make_transformer_fixtures.py), with
weight decay on the parameters optim.decay_params names.

Usage: /usr/bin/python3 bench/compare_training.py CONFIG.yaml [key.path=value ...]
       [--seqforge build/seqforge] [--tolerance 0.001]
Supports data.task forecast and charlm. Exits 1 when the validation losses of any epoch differ
by more than the tolerance (relative).
"""
import argparse
import csv
import datetime
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ISA_TIERS = ["baseline", "avx2", "avx512", "avx512_bf16", "amx"]


def machine_isa_tier():
    """This CPU's instruction-set tier, as seqforge names it (core/cpu.hpp)."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if "avx512f" in flags and {"amx_bf16", "amx_tile"} <= flags:
        return "amx"
    if "avx512f" in flags and "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "baseline"


def skip_when_the_uncapped_run_covers_the_tier():
    """Under SEQFORGE_MAX_ISA at or above this CPU's tier the run repeats the uncapped one: skip
    (exit 77, ctest's skip code) before PyTorch is even imported."""
    cap = os.environ.get("SEQFORGE_MAX_ISA")
    if cap in ISA_TIERS and ISA_TIERS.index(cap) >= ISA_TIERS.index(machine_isa_tier()):
        print(f"skipped: SEQFORGE_MAX_ISA={cap}, and this CPU reaches {machine_isa_tier()}: "
              "the uncapped run covers it")
        sys.exit(77)


if __name__ == "__main__":
    skip_when_the_uncapped_run_covers_the_tier()
    # OpenMP threads that spin long hold the cores another process needs (ctest runs two tests
    # at once); seqforge's runs inherit the same short spin.
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def resolved_config(seqforge, config, overrides, run_dir):
    """The resolved config of a one-step seqforge run (for the model's and the data's shape)."""
    subprocess.run([seqforge, "train", config] + overrides +
                   ["train.run_dir=" + run_dir, "train.epochs=1", "train.max_batches=1"],
                   check=True, stdout=subprocess.DEVNULL)
    import yaml  # python3-yaml comes with Debian's python3-torch stack
    with open(os.path.join(run_dir, "config.resolved.yaml")) as f:
        return yaml.safe_load(f)


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        raw = t.detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class Model(torch.nn.Module):
    def __init__(self, c, inputs, outputs, vocab=0):
        super().__init__()
        m = c["model"]
        self.vocab = vocab
        if vocab:
            self.embedding = torch.nn.Embedding(vocab, m["embedding"])
            inputs = m["embedding"]
        shape = dict(batch_first=True, dropout=m["dropout"], bidirectional=m["bidirectional"])
        if m["cell"] == "gru":
            self.gru = torch.nn.GRU(inputs, m["hidden"], m["layers"], **shape)
        elif m["cell"] == "lstm":
            self.lstm = torch.nn.LSTM(inputs, m["hidden"], m["layers"], proj_size=m["proj_size"],
                                      **shape)
        else:
            raise SystemExit("model.cell %s: PyTorch has no such module" % m["cell"])
        d = 2 if m["bidirectional"] else 1
        self.head = torch.nn.Linear(d * (m["proj_size"] or m["hidden"]), outputs)
        self.every_step = m.get("output", "last") == "every_step"

    def forward(self, x):
        if self.vocab:
            x = self.embedding(x)
        y, _ = (self.gru if hasattr(self, "gru") else self.lstm)(x)
        if self.vocab or self.every_step:
            return self.head(y.reshape(-1, y.shape[-1]))
        return self.head(y[:, -1])


class Gpt(torch.nn.Module):
    """nanoGPT's character model: the logits of every position, (B * T, vocabulary)."""

    def __init__(self, c, vocab):
        super().__init__()
        from make_transformer_fixtures import Gpt as Reference
        m = c["model"]
        if m["bidirectional"]:
            raise SystemExit("this script compares causal (charlm) transformers only")
        self.gpt = Reference(dict(v=vocab, c=m["embedding"], l=m["layers"], h=m["heads"],
                                  bs=m["block_size"] or c["data"]["seq_len"]))

    def forward(self, ids):
        logits = self.gpt(ids)
        return logits.reshape(-1, logits.shape[-1])


def make_model(c, inputs, outputs, vocab=0):
    if c["model"]["family"] == "transformer":
        if not vocab:
            raise SystemExit("this script compares transformers on charlm only")
        return Gpt(c, vocab)
    return Model(c, inputs, outputs, vocab)


def state_dict(model):
    """PyTorch's names as seqforge writes them (a GPT's without its wrapper's prefix)."""
    if isinstance(model, Gpt):
        return model.gpt.state_dict()
    return model.state_dict()


def boundaries(c, n):
    train, val = c["data"]["split"]["train"], c["data"]["split"]["val"]
    # As seqforge's: a share of n that is whole in decimal stays whole.
    return (int(math.floor(train * n * (1 + 1e-12))),
            min(n, int(math.floor((train + val) * n * (1 + 1e-12)))))


def forecast_data(c):
    d = c["data"]
    with open(d["path"]) as f:
        rows = list(csv.DictReader(f))
    if d["date_column"]:
        rows.sort(key=lambda r: datetime.datetime.fromisoformat(r[d["date_column"]].replace("Z", "")))
    x = np.array([[float(r[k]) for k in d["features"]] for r in rows])
    y = np.array([[float(r[k]) for k in d["targets"]] for r in rows])
    a, b = boundaries(c, len(rows))
    if d["normalize"] == "zscore":
        mx, sx = x[:a].mean(0), x[:a].std(0)
        my, sy = y[:a].mean(0), y[:a].std(0)
    else:
        raise SystemExit("this script compares zscore normalisation only")
    T, h, stride = d["lookback"], d["horizon"], d["stride"]
    # direct: a target at every step ahead, 1 to h; last: only h ahead.
    steps = h if d.get("horizon_mode", "direct") == "direct" else 1

    # Windows whose target rows lie in [lo, hi), starting at `first` or later: a validation
    # window takes its lookback from the rows before its split (data.split.context: history).
    def windows(lo, hi, first):
        return [s for s in range(first, hi, stride) if s + T - 1 + h < hi]
    history = d["split"].get("context", "history") == "history"
    first_target = T - 1 + h - steps + 1
    train, val = windows(0, a, 0), windows(a, b, max(0, a - first_target) if history else a)
    # (rows, steps * targets): the targets that follow each row, step-major (those of the window
    # ending there); several steps ahead are scaled per step over the training windows.
    ahead = h - steps + 1
    y = np.stack([y[r + ahead:r + ahead + steps].reshape(-1) if r + ahead + steps <= len(y)
                  else np.zeros(steps * y.shape[1]) for r in range(len(y))])
    if steps > 1:
        my, sy = y[[s + T - 1 for s in train]].mean(0), y[[s + T - 1 for s in train]].std(0)
    x, y = (x - mx) / sx, (y - my) / sy
    return (torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32),
            train, val, T, steps)


def lr_at(c, step, total):
    peak, warmup = c["optim"]["lr"], c["train"]["warmup_steps"]
    if step < warmup:
        return peak * (step + 1) / warmup
    if c["train"]["schedule"] == "cosine":
        p = (step - warmup) / max(1, total - warmup)
        return 0.5 * peak * (1 + math.cos(math.pi * min(1.0, p)))
    if c["train"]["schedule"] != "constant":
        raise SystemExit("this script compares constant and cosine schedules only")
    return peak


class SeqforgeShuffle:
    """seqforge's shuffle of the training windows: xoshiro256** seeded through splitmix64 with
    train.seed ^ 0x5eed5eed, a Fisher-Yates pass over the previous epoch's order every epoch (no
    other draws when dropout is 0), so both engines see the same batches."""
    MASK = (1 << 64) - 1

    def __init__(self, seed):
        x, self.s = (seed ^ 0x5eed5eed) & self.MASK, []
        for _ in range(4):
            x = (x + 0x9e3779b97f4a7c15) & self.MASK
            z = ((x ^ (x >> 30)) * 0xbf58476d1ce4e5b9) & self.MASK
            z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & self.MASK
            self.s.append(z ^ (z >> 31))

    @classmethod
    def rotl(cls, x, k):
        return ((x << k) | (x >> (64 - k))) & cls.MASK

    def next(self):
        s = self.s
        result = (self.rotl((s[1] * 5) & self.MASK, 7) * 9) & self.MASK
        t = (s[1] << 17) & self.MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self.rotl(s[3], 45)
        return result

    def shuffle(self, order):
        for i in range(len(order) - 1, 0, -1):
            j = self.next() % (i + 1)
            order[i], order[j] = order[j], order[i]


def train_pytorch(c, model, batches_per_epoch, make_batch, train_starts, val_eval):
    o = c["optim"]
    decay = [p for p in model.parameters() if o["decay_params"] == "all" or p.dim() >= 2]
    no_decay = [p for p in model.parameters() if o["decay_params"] != "all" and p.dim() < 2]
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=float(o["lr"]),
                            betas=(float(o["beta1"]), float(o["beta2"])),
                            eps=float(o["eps"]), weight_decay=float(o["weight_decay"]))
    epochs, bs = c["train"]["epochs"], c["train"]["batch_size"]
    total, step = batches_per_epoch * epochs, 0
    shuffle, order = SeqforgeShuffle(c["train"]["seed"]), list(train_starts)
    losses = []
    for _ in range(epochs):
        model.train()
        shuffle.shuffle(order)
        for bi in range(batches_per_epoch):
            for group in opt.param_groups:
                group["lr"] = lr_at(c, step, total)
            out, loss_fn = make_batch(order[bi * bs:(bi + 1) * bs])
            loss = loss_fn(model(out))
            opt.zero_grad()
            loss.backward()
            if c["train"]["clip_grad_norm"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), c["train"]["clip_grad_norm"])
            opt.step()
            step += 1
        model.eval()
        with torch.no_grad():
            losses.append(val_eval(model))
    return losses


def main():
    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--seqforge", default=os.path.join(HERE, "..", "build", "seqforge"))
    p.add_argument("--tolerance", type=float, default=1e-3)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    work = tempfile.mkdtemp(prefix="seqforge_compare_")
    overrides = a.overrides + ["train.precision=fp32", "train.early_stopping.patience=0",
                               "train.save=last", "model.dropout=0"]
    c = resolved_config(a.seqforge, a.config, overrides, os.path.join(work, "probe"))
    task, bs = c["data"]["task"], c["train"]["batch_size"]
    if c["optim"]["kind"] != "adamw":
        raise SystemExit("this script compares adamw only")
    if task == "forecast":
        x, y, train_starts, val_starts, T, steps = forecast_data(c)
        kind = c["train"]["loss"]
        if kind not in ("mse", "quantile"):
            raise SystemExit("this script compares the mse and quantile losses only")
        levels = [float(q) for q in c["train"]["quantiles"]] if kind == "quantile" else [None]
        model = make_model(c, x.shape[1], y.shape[1] * len(levels))

        def make_batch(starts):
            xb = torch.stack([x[s:s + T] for s in starts])
            # (B, steps * targets * quantiles): step-major, each target repeated per quantile
            every_step = c["model"].get("output", "last") == "every_step"
            # every_step: (B * T, ...), the targets after each step of each window
            yb = torch.cat([y[s:s + T] for s in starts]) if every_step else \
                y[[s + T - 1 for s in starts]]
            if kind == "mse":
                return xb, lambda out: torch.nn.functional.mse_loss(out, yb)
            yq = yb.repeat_interleave(len(levels), dim=1)
            q = torch.tensor(levels, dtype=torch.float32).repeat(yb.shape[1])

            def pinball(out):
                u = yq - out
                return torch.maximum(q * u, (q - 1) * u).mean()
            return xb, pinball

        def val_eval(m):
            total, n = 0.0, 0
            for i in range(0, len(val_starts), bs):
                xb, loss_fn = make_batch(val_starts[i:i + bs])
                total += loss_fn(m(xb)).item() * len(xb)
                n += len(xb)
            return total / n
    elif task == "charlm":
        text = open(c["data"]["path"], encoding="latin-1").read()
        vocab = sorted(set(text))
        ids = torch.tensor([vocab.index(ch) for ch in text])
        a_, b_ = boundaries(c, len(ids))
        T = c["data"]["seq_len"]
        train_starts = list(range(0, a_ - T, T))
        val_starts = list(range(a_, b_ - T, T))
        model = make_model(c, 0, len(vocab), vocab=len(vocab))

        def make_batch(starts):
            xb = torch.stack([ids[s:s + T] for s in starts])
            yb = torch.stack([ids[s + 1:s + T + 1] for s in starts]).reshape(-1)
            return xb, lambda out: torch.nn.functional.cross_entropy(out, yb)

        def val_eval(m):
            total, n = 0.0, 0
            for i in range(0, len(val_starts), bs):
                xb, loss_fn = make_batch(val_starts[i:i + bs])
                total += loss_fn(m(xb)).item() * xb.numel()
                n += xb.numel()
            return total / n
    else:
        raise SystemExit("this script compares forecast and charlm tasks")
    init = os.path.join(work, "init.safetensors")
    write_safetensors(init, state_dict(model))
    batches = math.ceil(len(train_starts) / bs)
    if c["train"]["max_batches"] > 0:
        batches = min(batches, c["train"]["max_batches"])

    run = os.path.join(work, "seqforge")
    subprocess.run([a.seqforge, "train", a.config] + overrides +
                   ["model.init_from=" + init, "train.run_dir=" + run], check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        sf = [j["val_loss"] for j in map(json.loads, filter(str.strip, f)) if "epoch" in j]
    import yaml
    with open(os.path.join(run, "config.resolved.yaml")) as f:
        c = yaml.safe_load(f)  # the real run's settings (the probe ran one step)
    batches = math.ceil(len(train_starts) / bs)
    if c["train"]["max_batches"] > 0:
        batches = min(batches, c["train"]["max_batches"])
    pt = train_pytorch(c, model, batches, make_batch, train_starts, val_eval)
    print("epoch  seqforge val_loss  PyTorch val_loss")
    for e, (s, t) in enumerate(zip(sf, pt), 1):
        print("%5d  %17.7f  %16.7f" % (e, s, t))
    shutil.rmtree(work)
    if len(sf) != len(pt):
        raise SystemExit("seqforge ran %d epochs, PyTorch %d" % (len(sf), len(pt)))
    worst = max(abs(s - t) / t for s, t in zip(sf, pt))
    diff = abs(sf[-1] - pt[-1]) / pt[-1]
    print("final validation loss: seqforge %.7f, PyTorch %.7f, difference %.2g%% (tolerance %.2g%%)"
          % (sf[-1], pt[-1], 100 * diff, 100 * a.tolerance))
    print("largest difference over the epochs: %.2g%%" % (100 * worst))
    sys.exit(0 if worst <= a.tolerance else 1)


if __name__ == "__main__":
    main()
