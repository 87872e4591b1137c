#!/usr/bin/python3
"""Kills `seqforge train` with SIGKILL at random moments, many times. After every kill the
checkpoint and the training state must be whole safetensors files (never half-written), and
`seqforge train --resume` must carry the run on; at the end the run completes with every epoch
in metrics.jsonl exactly once.

Usage: kill_test.py SEQFORGE CONFIG DATA [KILLS]
"""
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time


def check_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if max(ends, default=0) != len(data) - 8 - n:
        raise SystemExit("%s: data size does not match its header" % path)


def main():
    seqforge, config, data = sys.argv[1:4]
    kills = int(sys.argv[4]) if len(sys.argv) > 4 else 12
    run = tempfile.mkdtemp(prefix="seqforge_kill_")
    epochs = 30
    common = ["train.epochs=%d" % epochs, "train.schedule=constant", "train.max_batches=15",
              "train.early_stopping.patience=0", "train.save=every_n", "data.path=" + data]
    random.seed(7)
    state = os.path.join(run, "training_state.safetensors")
    model = os.path.join(run, "model.safetensors")
    killed = 0
    for _ in range(kills):
        # A run killed before its first training state cannot be resumed: it starts again.
        cmd = ([seqforge, "train", "--resume", run] if os.path.exists(state) else
               [seqforge, "train", config, "train.run_dir=" + run, "--overwrite"])
        p = subprocess.Popen(cmd + common, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(random.uniform(0.05, 0.8))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.wait()
        if p.returncode not in (0, -signal.SIGKILL):
            raise SystemExit("seqforge failed: " + p.stderr.read().decode())
        for path in (model, state):
            if os.path.exists(path):
                check_safetensors(path)
    cmd = [seqforge, "train", "--resume", run] if os.path.exists(state) else \
        [seqforge, "train", config, "train.run_dir=" + run, "--overwrite"]
    subprocess.run(cmd + common, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        seen = [j["epoch"] for j in map(json.loads, filter(str.strip, f)) if "epoch" in j]
    if seen != list(range(1, epochs + 1)):
        raise SystemExit("metrics.jsonl epochs %s, expected 1..%d" % (seen, epochs))
    check_safetensors(model)
    print("killed %d runs at random moments; checkpoints always whole; resumed to epoch %d"
          % (killed, epochs))


if __name__ == "__main__":
    main()
