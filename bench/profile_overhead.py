"""What profiling costs: the same short training run with --profile off and on (and, given
--baseline, with another seqforge binary, e.g. one built before the profiler existed), run
alternately so that machine noise hits every variant alike. Prints medians of the training
seconds (the epochs' train_seconds from metrics.jsonl: training steps only), the wall time and the
CPU time (user + system) of the whole command, and their ratios to the first variant. On a busy
machine the CPU time is the steadier measure; --threads 1 avoids OpenMP spin-waiting on cores that
other processes hold.

usage: /usr/bin/python3 bench/profile_overhead.py [--seqforge build/seqforge] [--baseline BIN]
           [--rounds 7] [--threads N] [--config examples/configs/weather_forecast.yaml]
           [override ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

parser = argparse.ArgumentParser()
parser.add_argument("--seqforge", default="build/seqforge")
parser.add_argument("--baseline", help="another seqforge binary to compare with (profiling off)")
parser.add_argument("--rounds", type=int, default=7)
parser.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS (0: unset)")
parser.add_argument("--config", default="examples/configs/weather_forecast.yaml")
parser.add_argument("overrides", nargs="*", default=["train.epochs=3"])
args = parser.parse_args()

variants = []
if args.baseline:
    variants.append(("baseline", args.baseline, []))
variants += [("profile off", args.seqforge, []), ("profile on", args.seqforge, ["--profile"])]
results = {name: {"train": [], "wall": [], "cpu": []} for name, _, _ in variants}
env = dict(os.environ)
if args.threads > 0:
    env["OMP_NUM_THREADS"] = str(args.threads)

with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, binary, extra in order:
            run = os.path.join(tmp, name.replace(" ", "_"))
            cmd = [binary, "train", args.config, *args.overrides, "train.run_dir=" + run, *extra]
            t0 = time.perf_counter()
            child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
            _, status, usage = os.wait4(child.pid, 0)
            wall = time.perf_counter() - t0
            if status != 0:
                raise SystemExit("%s failed (status %d)" % (" ".join(cmd), status))
            results[name]["cpu"].append(usage.ru_utime + usage.ru_stime)
            with open(os.path.join(run, "metrics.jsonl")) as f:
                train = sum(json.loads(line)["train_seconds"] for line in f if line.strip())
            results[name]["train"].append(train)
            results[name]["wall"].append(wall)

first = variants[0][0]
base = {k: statistics.median(v) for k, v in results[first].items()}
print("medians of %d runs: %s %s%s" % (args.rounds, args.config, " ".join(args.overrides),
                                       ", OMP_NUM_THREADS=%d" % args.threads if args.threads else ""))
print("%-12s %9s %7s %9s %7s %9s %7s" % ("variant", "train s", "ratio", "wall s", "ratio",
                                          "cpu s", "ratio"))
for name, _, _ in variants:
    m = {k: statistics.median(v) for k, v in results[name].items()}
    print("%-12s %9.3f %7.3f %9.3f %7.3f %9.3f %7.3f" % (
        name, m["train"], m["train"] / base["train"], m["wall"], m["wall"] / base["wall"],
        m["cpu"], m["cpu"] / base["cpu"]))
