#!/usr/bin/python3
"""SIGINT and SIGTERM sent to `seqforge train` part-way through an epoch: the run stops after its
current step with exit code 130 or 143, names the command that continues it, leaves whole
safetensors files, and the continued run's metrics equal an uninterrupted run's. A second SIGINT
ends the process at once. Without a terminal, progress lines come every train.progress_seconds;
first-use autotuning says so once, and a second run on the same shape is quiet.

Usage: interrupt_test.py SEQFORGE CONFIG DATA
"""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

TIMINGS = {"epoch_seconds", "train_seconds", "samples_per_second", "data_wait_seconds",
           "data_wait_share", "cpu_percent", "rss_mb", "peak_rss_mb"}


def fail(message):
    raise SystemExit("FAIL: " + message)


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in f]


def check_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    if max(ends, default=0) != len(data) - 8 - n:
        fail("%s: data size does not match its header" % path)


def start(seqforge, args, env=None):
    return subprocess.Popen([seqforge] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def wait_for_progress(p, epoch):
    """Reads stdout until a progress line of `epoch` (mid-epoch); returns what was read."""
    seen = ""
    deadline = time.time() + 240
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen += line
        if re.match(r"epoch %d/\d+  \d+/\d+ batches" % epoch, line):
            return seen
    p.kill()
    fail("no progress line of epoch %d in:\n%s\n%s" % (epoch, seen, p.stderr.read()))


def main():
    seqforge, config, data = sys.argv[1:4]
    work = tempfile.mkdtemp(prefix="seqforge_interrupt_")
    common = [config, "data.path=" + data, "train.epochs=2", "train.schedule=constant",
              "train.max_batches=300", "train.batch_size=16", "train.early_stopping.patience=0",
              "model.dropout=0.1", "train.progress_seconds=0.02"]
    whole = os.path.join(work, "whole")
    # (choices kept even where other tests share the CPUs: the runs compared must agree on them)
    env = dict(os.environ, SEQFORGE_CACHE_DIR=os.path.join(work, "cache"),
               SEQFORGE_AUTOTUNE="always_cache")
    r = subprocess.run([seqforge, "train"] + common + ["train.run_dir=" + whole],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        fail("the uninterrupted run exited %d:\n%s" % (r.returncode, r.stderr))
    announce = "seqforge: autotune: timing "
    if r.stderr.count(announce) != 1 or os.path.join(work, "cache") not in r.stderr:
        fail("first use: no single autotune line naming the cache:\n" + r.stderr)
    # (a few batches: the shapes, not the length, pick the cached schedules)
    short = ["train.run_dir=" + os.path.join(work, "again"), "train.epochs=1",
             "train.max_batches=3"]
    again = subprocess.run([seqforge, "train"] + common + short, capture_output=True, text=True,
                           env=env)
    if again.returncode != 0 or announce in again.stderr:
        fail("second run: exit %d, stderr:\n%s" % (again.returncode, again.stderr))
    if not re.search(r"^epoch 1/2  \d+/300 batches  loss \S+  \d+ samples/s  ETA \d+ s$", r.stdout,
                     re.M):
        fail("no progress line without a terminal:\n" + r.stdout)

    # The interrupted and resumed runs read the whole run's autotune cache: the same schedules and
    # layouts, so the same rounding, which exact equality of the metrics needs.
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        run = os.path.join(work, sig.name)
        p = start(seqforge, ["train"] + common + ["train.run_dir=" + run], env)
        wait_for_progress(p, 2)
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
        if p.returncode != code:
            fail("%s: exit code %d, expected %d\n%s" % (sig.name, p.returncode, code, err))
        m = re.search(r"interrupted \(%s\) in epoch 2 after batch (\d+) of 300: the training state "
                      r"is saved in \S+; continue with: seqforge train --resume (\S+)" % sig.name,
                      err)
        if not m or m.group(2) != run:
            fail("%s: no resume instruction naming %s in stderr:\n%s" % (sig.name, run, err))
        for name in ("model.safetensors", "training_state.safetensors"):
            check_safetensors(os.path.join(run, name))
        if len(metrics(run)) != 1:
            fail("%s: metrics.jsonl should hold epoch 1 alone" % sig.name)
        if sig == signal.SIGTERM:  # a run moved before it is resumed goes on where it is now
            os.rename(run, run + "-moved")
            run += "-moved"
        r = subprocess.run([seqforge, "train", "--resume", run], capture_output=True, text=True,
                           env=env)
        if r.returncode != 0:
            fail("%s: resume exited %d:\n%s" % (sig.name, r.returncode, r.stderr))
        with open(os.path.join(run, "config.resolved.yaml")) as f:
            if "  run_dir: %s\n" % run not in f.read():
                fail("%s: config.resolved.yaml does not name the run's directory %s"
                     % (sig.name, run))
        if "resuming %s in epoch 2 after batch %s" % (run, m.group(1)) not in r.stdout:
            fail("%s: resume did not start at the saved batch:\n%s" % (sig.name, r.stdout))
        if metrics(run) != metrics(whole):
            fail("%s: the resumed run's metrics differ from the uninterrupted run's:\n%s\n%s"
                 % (sig.name, metrics(run), metrics(whole)))
        print("%s after batch %s of epoch 2: exit %d, resumed, metrics equal" %
              (sig.name, m.group(1), code))

    # A second SIGINT: out at once, whatever the step is doing.
    run = os.path.join(work, "twice")
    p = start(seqforge, ["train"] + common + ["train.run_dir=" + run, "train.max_batches=0"])
    wait_for_progress(p, 1)
    p.send_signal(signal.SIGINT)
    p.send_signal(signal.SIGINT)
    t0 = time.time()
    p.communicate(timeout=60)
    if p.returncode != 130:
        fail("two SIGINTs: exit code %d, expected 130" % p.returncode)
    for name in ("model.safetensors", "training_state.safetensors"):
        if os.path.exists(os.path.join(run, name)):
            check_safetensors(os.path.join(run, name))
    print("two SIGINTs: exit 130 after %.2f s" % (time.time() - t0))

    # A profiled run stopped by a signal keeps the profile of the steps it took.
    run = os.path.join(work, "profiled")
    p = start(seqforge, ["train"] + common + ["train.run_dir=" + run, "--profile"], env)
    wait_for_progress(p, 1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    trace = os.path.join(run, "trace.json")
    if p.returncode != 130 or not os.path.exists(trace) or "profile (%s" % trace not in out:
        fail("a profiled run after SIGINT: exit %d, no %s or no profile table:\n%s\n%s"
             % (p.returncode, trace, out[-2000:], err))
    with open(trace) as f:
        events = json.load(f)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    if not any(e.get("name") == "train step" for e in events):
        fail("the interrupted run's trace holds no training step")
    print("profiled run: SIGINT -> exit 130, trace of %d events" % len(events))

    # seqforge tune: the trial under way is recorded as failed and its parameters wait to run
    # again; no new trial starts.
    tune_config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(config))),
                               "configs", "weather_tune.yaml")
    study_dir = os.path.join(work, "study")
    p = subprocess.Popen([seqforge, "tune", tune_config, "data.path=" + data,
                          "train.run_dir=" + study_dir, "train.max_batches=400",
                          "train.progress_seconds=0", "--n-trials", "4"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not os.path.exists(
            os.path.join(study_dir, "trial-0", "metrics.jsonl")):
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    if p.returncode != 130 or "recorded as failed" not in err and "no new trial" not in err:
        fail("tune after SIGINT: exit %d\n%s\n%s" % (p.returncode, out, err))
    export = subprocess.run([seqforge, "tune", "--export", "json",
                             os.path.join(study_dir, "study.db")], capture_output=True, text=True)
    trials = json.loads(export.stdout)
    trials = trials.get("trials", trials) if isinstance(trials, dict) else trials
    states = [t["state"] for t in trials]
    if "RUNNING" in states or ("recorded as failed" in err and states[-2:] != ["FAIL", "WAITING"]):
        fail("tune after SIGINT: trial states %s\n%s" % (states, err))
    print("tune: SIGINT -> exit 130, trials %s" % states)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
