#!/usr/bin/python3
"""Replays intermediate-value histories through Optuna's pruners and writes every decision.

Usage: optuna_pruner_oracle.py IN.json OUT.json

IN: a list of studies, each {"direction": "minimize"|"maximize", "pruner": {...},
"trials": [{"reports": [[step, value|null(NaN)], ...], "fail": bool}, ...]}. Trials run one
after another: after each report should_prune() is asked; a pruned trial stops there, the others
end COMPLETE (or FAIL). OUT: per study, per trial, the list of decisions (true = prune).
"""
import json
import math
import sys
import warnings

import optuna

optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.filterwarnings("ignore")


def make_pruner(p):
    kind = p["kind"]
    if kind == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=p["n_startup_trials"], n_warmup_steps=p["n_warmup_steps"],
            interval_steps=p["interval_steps"], n_min_trials=p["n_min_trials"])
    if kind == "percentile":
        return optuna.pruners.PercentilePruner(
            p["percentile"], n_startup_trials=p["n_startup_trials"],
            n_warmup_steps=p["n_warmup_steps"], interval_steps=p["interval_steps"],
            n_min_trials=p["n_min_trials"])
    if kind == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=p["min_resource"] if p["min_resource"] > 0 else "auto",
            reduction_factor=p["reduction_factor"],
            min_early_stopping_rate=p["min_early_stopping_rate"],
            bootstrap_count=p["bootstrap_count"])
    if kind == "none":
        return optuna.pruners.NopPruner()
    raise ValueError(kind)


def run(study_spec):
    study = optuna.create_study(direction=study_spec["direction"],
                                pruner=make_pruner(study_spec["pruner"]))
    decisions = []
    for t in study_spec["trials"]:
        trial = study.ask()
        got = []
        pruned = False
        for step, value in t["reports"]:
            trial.report(math.nan if value is None else value, step)
            got.append(bool(trial.should_prune()))
            if got[-1]:
                pruned = True
                break
        decisions.append(got)
        if pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif t.get("fail"):
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, 0.0)
    return decisions


def main():
    with open(sys.argv[1]) as f:
        studies = json.load(f)
    out = [run(s) for s in studies]
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
