#!/usr/bin/python3
"""One process owns a run directory. While `seqforge train` runs, a second train on the same
train.run_dir (plain, --overwrite, --resume) fails with one line naming the directory and the
holder's pid, and leaves the first run's files alone; eval reads the run beside it. After the
first is SIGKILLed its lock is stale and `train --resume` continues the run.

Usage: run_dir_lock_test.py SEQFORGE CONFIG DATA
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def fail(message):
    raise SystemExit("FAIL: " + message)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def epochs(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line)["epoch"] for line in f if '"epoch"' in line]


def main():
    seqforge, config, data = sys.argv[1:4]
    tmp = tempfile.mkdtemp(prefix="seqforge_lock_")
    run = os.path.join(tmp, "run")
    common = ["data.path=" + data, "train.schedule=constant", "train.max_batches=4",
              "train.early_stopping.patience=0", "train.save=every_n", "train.test_after=false"]
    first = subprocess.Popen(
        [seqforge, "train", config, "train.run_dir=" + run, "train.epochs=100000"] + common,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 240
        while not (os.path.exists(os.path.join(run, "training_state.safetensors")) and
                   os.path.exists(os.path.join(run, "model.safetensors")) and epochs(run)):
            if first.poll() is not None:
                fail("the first run ended: " + first.stderr.read().decode())
            if time.time() > deadline:
                fail("the first run saved nothing in 240 s")
            time.sleep(0.2)
        config_before = read(os.path.join(run, "config.resolved.yaml"))
        seconds = [
            [seqforge, "train", config, "train.run_dir=" + run, "train.epochs=1"] + common,
            [seqforge, "train", config, "train.run_dir=" + run, "train.epochs=1", "--overwrite"] +
            common,
            [seqforge, "train", "--resume", run]]
        for cmd in seconds:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
            err = p.stderr.decode()
            what = "--overwrite" if "--overwrite" in cmd else " ".join(cmd[2:4])
            if p.returncode == 0:
                fail("a second train (%s) on a held directory exited 0" % what)
            lines = [line for line in err.splitlines() if line.strip()]
            expected = "%s: in use: another seqforge process is training in it (pid %d" % (
                run, first.pid)
            if len(lines) != 1 or expected not in lines[0]:
                fail("a second train (%s): expected one line with %r, got %r" % (what, expected, err))
            if first.poll() is not None:
                fail("the first run ended after the second train (%s)" % what)
            for name in ("model.safetensors", "training_state.safetensors", "metrics.jsonl"):
                if not os.path.exists(os.path.join(run, name)):
                    fail("%s is gone after the second train (%s)" % (name, what))
            if read(os.path.join(run, "config.resolved.yaml")) != config_before:
                fail("config.resolved.yaml changed after the second train (%s)" % what)
        lock = os.path.join(run, ".lock")
        if read(lock).decode().strip() != str(first.pid):
            fail("%s holds %r, not the first run's pid %d" % (lock, read(lock), first.pid))
        # Commands that only read a run take no lock.
        p = subprocess.run([seqforge, "eval", run, "--split", "val"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
        if p.returncode != 0 or b"val_loss" not in p.stdout:
            fail("eval beside the training: " + p.stderr.decode())
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
        first.wait()
    # The killed run's lock file stays; its lock went with the process.
    if not os.path.exists(os.path.join(run, ".lock")):
        fail("the lock file is gone")
    done = epochs(run)[-1]
    p = subprocess.run([seqforge, "train", "--resume", run, "train.epochs=%d" % (done + 1)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=240)
    if p.returncode != 0:
        fail("train --resume after SIGKILL: " + p.stderr.decode())
    if epochs(run)[-1] != done + 1:
        fail("the resumed run logged epochs %s, expected it to end at %d" % (epochs(run), done + 1))
    shutil.rmtree(tmp)
    print("a held run directory refused three ways (plain, --overwrite, --resume) naming pid %d; "
          "its files intact; eval beside it; resumed after SIGKILL to epoch %d"
          % (first.pid, done + 1))


if __name__ == "__main__":
    main()
