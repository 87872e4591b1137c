#!/usr/bin/python3
"""Two seqforge builds side by side on the benchmark workloads: a change's before and after.

Usage: /usr/bin/python3 bench/compare_builds.py BEFORE AFTER [W1 W2 ...] [--precision fp32 bf16]
                                                [--steps N] [--rounds R]
BEFORE and AFTER are seqforge binaries. Each of R rounds runs every workload and precision on
both builds in turn, each run a fresh process with N timed steps, so that the machine's drift
hits both alike. Prints the medians of all timed steps and after / before.
"""
import argparse
import json
import statistics
import subprocess
import tempfile


def steps_ms(binary, workload, precision, steps):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([binary, "bench", workload, "--precision", precision, "--steps",
                        str(steps), "--json", f.name], check=True, stdout=subprocess.DEVNULL)
        return json.load(open(f.name))[0]["step_ms"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("workloads", nargs="*", default=["W1", "W2", "W3", "W4"])
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    print("%-4s %-5s %12s %12s %8s" % ("", "", "before ms", "after ms", "after/before"))
    for wid in a.workloads:
        for precision in a.precision:
            times = {"before": [], "after": []}
            steps = a.steps * (20 if wid == "W3" else 1)  # W3's steps take about a millisecond
            for _ in range(a.rounds):
                for build in ("before", "after"):
                    times[build] += steps_ms(getattr(a, build), wid, precision, steps)
            before, after = (statistics.median(times[b]) for b in ("before", "after"))
            print("%-4s %-5s %12.2f %12.2f %8.3f" % (wid, precision, before, after, after / before),
                  flush=True)


if __name__ == "__main__":
    main()
