#!/usr/bin/python3
"""How much the median pruner saves on the weather forecasting example, and what a trial costs
besides its training.

Runs the same study twice with `seqforge tune`: the random sampler draws a trial's parameters
from the seed and the trial number alone, so both studies train the same trials; one prunes
nothing, the other uses the median pruner. Reports the epochs the pruned study ran against the
unpruned one, the best trial of each, and the per-trial overhead (everything but train()).

Usage: bench/tune_pruning.py [--seqforge build/seqforge] [--trials 12] [--max-batches 40]
                             [--seed 0] [--out DIR]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ap = argparse.ArgumentParser()
ap.add_argument("--seqforge", default=os.path.join(root, "build", "seqforge"))
ap.add_argument("--trials", type=int, default=12)
ap.add_argument("--max-batches", type=int, default=40,
                help="train.max_batches: shorter epochs so that both studies fit in minutes")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--out", default="/tmp/seqforge_tune_pruning")
ap.add_argument("--warmup", type=int, default=1, help="median pruner n_warmup_steps")
ap.add_argument("--startup", type=int, default=4, help="median pruner n_startup_trials")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)

with open(os.path.join(root, "examples/configs/weather_forecast.yaml")) as f:
    example = f.read().replace("path: data/", "path: " + root + "/data/")


# Passive OpenMP waits: on a shared two-core machine spinning teams stall each other for seconds.
env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))


def study(name, pruner):
    cfg = os.path.join(args.out, name + ".yaml")
    with open(cfg, "w") as f:
        f.write(example + f"""
tune:
  name: {name}
  n_trials: {args.trials}
  sampler: {{kind: random, seed: {args.seed}}}
  pruner: {pruner}
  space:
    optim.lr: {{type: float, low: 3.0e-4, high: 3.0e-2, log: true}}
    model.hidden: {{type: int, low: 16, high: 64, step: 16}}
    model.layers: {{type: int, low: 1, high: 2}}
    train.batch_size: {{type: categorical, choices: [64, 128]}}
""")
    db = os.path.join(args.out, name + ".db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    t0 = time.time()
    p = subprocess.run([args.seqforge, "tune", cfg, "--study", db,
                        "train.run_dir=" + os.path.join(args.out, name),
                        f"train.max_batches={args.max_batches}"],
                       capture_output=True, text=True, env=env)
    wall = time.time() - t0
    with open(os.path.join(args.out, name + ".log"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"{name}: seqforge tune failed:\n{p.stderr}")
    exported = subprocess.run([args.seqforge, "tune", "--export", "json", db],
                              capture_output=True, text=True, check=True).stdout
    trials = {}
    for t in json.loads(exported)["trials"]:
        trials[t["number"]] = dict(
            state={"COMPLETE": "complete", "PRUNED": "pruned"}.get(t["state"], t["state"]),
            value=float(t["value"]) if t["value"] is not None else float("nan"),
            params=t["params"], attrs=t["seqforge"], epochs=t["seqforge"]["epochs"],
            steps={int(k): float(v) for k, v in t["intermediate_values"].items()})
    return trials, wall


unpruned, wall_u = study("unpruned", "none")
pruned, wall_p = study("median", f"{{kind: median, n_startup_trials: {args.startup}, "
                                 f"n_warmup_steps: {args.warmup}}}")
assert sorted(unpruned) == sorted(pruned) == list(range(args.trials))
same_values = True
for n in unpruned:
    assert unpruned[n]["params"] == pruned[n]["params"], f"trial {n}: parameters differ"
    for s, v in pruned[n]["steps"].items():
        if abs(unpruned[n]["steps"][s] - v) > 1e-6 * max(1.0, abs(v)):
            same_values = False
epochs_u = sum(t["epochs"] for t in unpruned.values())
epochs_p = sum(t["epochs"] for t in pruned.values())
best = lambda ts: min((t["value"], n) for n, t in ts.items() if t["state"] == "complete")
best_u, best_p = best(unpruned), best(pruned)
overhead = [t["attrs"]["overhead_seconds"] * 1000 for t in list(unpruned.values()) + list(pruned.values())]
seconds = [t["attrs"]["seconds"] for t in unpruned.values()]
result = {
    "trials": args.trials,
    "max_batches": args.max_batches,
    "epochs_unpruned": epochs_u,
    "epochs_pruned": epochs_p,
    "epochs_saved": 1 - epochs_p / epochs_u,
    "pruned_trials": sum(t["state"] == "pruned" for t in pruned.values()),
    "best_unpruned": {"trial": best_u[1], "val_loss": best_u[0]},
    "best_pruned": {"trial": best_p[1], "val_loss": best_p[0]},
    "best_gap": best_p[0] / best_u[0] - 1,
    "same_intermediate_values": same_values,
    "wall_seconds_unpruned": wall_u,
    "wall_seconds_pruned": wall_p,
    "overhead_ms_median": statistics.median(overhead),
    "overhead_ms_max": max(overhead),
    "trial_seconds_median_unpruned": statistics.median(seconds),
}
with open(os.path.join(args.out, "result.json"), "w") as f:
    json.dump(result, f, indent=2)
print(json.dumps(result, indent=2))
print(f"\nmedian pruner: {epochs_p} of {epochs_u} epochs ({100 * result['epochs_saved']:.0f}% saved), "
      f"{result['pruned_trials']} of {args.trials} trials pruned; best trial {best_p[1]} "
      f"val_loss {best_p[0]:.6g} vs unpruned best trial {best_u[1]} {best_u[0]:.6g} "
      f"({100 * result['best_gap']:+.2f}%); wall {wall_p:.0f} s vs {wall_u:.0f} s; per-trial "
      f"overhead median {result['overhead_ms_median']:.1f} ms (max {result['overhead_ms_max']:.1f})")
