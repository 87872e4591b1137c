"""Optuna studies driving seqforge trials.

    import optuna, seqforge.optuna
    objective = seqforge.optuna.objective(
        "examples/configs/weather_forecast.yaml",
        {"model.hidden": optuna.distributions.IntDistribution(16, 128, log=True),
         "optim.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
         "model.cell": ["lstm", "gru"]})
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner())
    study.optimize(objective, n_trials=20)

Each trial trains a run in runs/<study>/trial-<number> and reports the monitored metric after
every epoch (trial.report); a pruned trial stops after that epoch and raises optuna.TrialPruned.
"""
import hashlib
import json
import math
import os

import optuna
from optuna.distributions import (CategoricalDistribution, FloatDistribution,
                                  IntDistribution)

from . import _api, _native


def suggest(trial, name, spec):
    """A value for config key `name` from `spec`: an optuna distribution, a list (categorical) or
    a tuple (low, high) of ints or floats, with "log" as an optional third element."""
    if isinstance(spec, list):
        spec = CategoricalDistribution(spec)
    elif isinstance(spec, tuple):
        if len(spec) not in (2, 3) or (len(spec) == 3 and spec[2] != "log"):
            raise ValueError(f"seqforge.optuna: {name}: expected (low, high) or (low, high, "
                             f"\"log\"), got {spec!r}")
        low, high = spec[0], spec[1]
        log = len(spec) == 3
        integer = isinstance(low, int) and isinstance(high, int)
        spec = IntDistribution(low, high, log=log) if integer else FloatDistribution(
            float(low), float(high), log=log)
    if isinstance(spec, IntDistribution):
        return trial.suggest_int(name, spec.low, spec.high, step=spec.step, log=spec.log)
    if isinstance(spec, FloatDistribution):
        return trial.suggest_float(name, spec.low, spec.high, step=spec.step, log=spec.log)
    if isinstance(spec, CategoricalDistribution):
        return trial.suggest_categorical(name, spec.choices)
    raise TypeError(f"seqforge.optuna: {name}: expected an optuna distribution, a list or a "
                    f"(low, high) tuple, got {spec!r}")


class PruningCallback:
    """on_epoch for seqforge.train: reports the monitored metric to the trial after each epoch
    and raises optuna.TrialPruned when the study's pruner says so."""

    def __init__(self, trial, monitor):
        self.trial = trial
        self.monitor = monitor

    def __call__(self, epoch, metrics):
        if self.monitor not in metrics:
            raise KeyError(f"seqforge.optuna: the run reports no '{self.monitor}' (it reports "
                           f"{', '.join(sorted(metrics))})")
        self.trial.report(metrics[self.monitor], epoch - 1)  # steps from 0, as seqforge tune
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned after epoch {epoch}: {self.monitor} "
                                     f"{metrics[self.monitor]:.6g}")
        return True


def _kept_value(run_dir, metric):
    """`metric` at the last epoch whose checkpoint the run kept (metrics.jsonl), or None where
    none was kept or its value is not finite (written as null)."""
    kept = None
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    entry = json.loads(line) if line.endswith("\n") else {}
                except ValueError:
                    return None
                if entry.get("checkpoint") is True:
                    kept = entry.get(metric)
    return kept if isinstance(kept, (int, float)) and math.isfinite(kept) else None


def objective(config, space, data=None, monitor=None, runs="runs", log=None, **sections):
    """An objective for study.optimize: each trial trains `config` with the values `space`
    ({config key: spec}, see suggest) suggests, pruned through PruningCallback, and returns the
    best value of `monitor` (default: the config's train.early_stopping.monitor) in the study's
    direction, whose epoch's checkpoint the run keeps (`train.save: best`)."""

    def run_trial(trial):
        values = {name: suggest(trial, name, spec) for name, spec in space.items()}
        study = getattr(trial, "study", None)  # none for optuna.trial.FixedTrial
        if study is not None:
            run_dir = os.path.join(runs, study.study_name, f"trial-{trial.number}")
        else:  # a run of given values (the best ones, say): a directory of its own per values
            digest = hashlib.sha256(repr(sorted(values.items())).encode()).hexdigest()[:12]
            run_dir = os.path.join(runs, "fixed", f"trial-{digest}")
        overrides = dict(values, **{"train.run_dir": run_dir})
        metric = monitor
        resolved = _api.resolved_config(config, overrides, sections)
        if metric is None:
            metric = resolved["train"]["early_stopping"]["monitor"]
        # Early stopping and the checkpoint kept follow the study's metric and direction (without
        # a study, the config's).
        maximize = (study.direction == optuna.study.StudyDirection.MAXIMIZE if study is not None
                    else resolved["train"]["early_stopping"]["mode"] == "max")
        overrides["train.early_stopping.monitor"] = metric
        overrides["train.early_stopping.mode"] = "max" if maximize else "min"
        overrides["train.save"] = "best"  # the checkpoint of the value returned
        trial.set_user_attr("run_dir", run_dir)
        try:
            run = _api.train(config, data=data, overrides=overrides, overwrite=True,
                             on_epoch=PruningCallback(trial, metric), log=log, **sections)
        except _native.Diverged as e:
            # As seqforge tune: a run that diverged after an epoch it kept counts that epoch.
            kept = _kept_value(run_dir, metric)
            if kept is None:
                raise
            trial.set_user_attr("diverged", str(e))
            return kept
        return run.summary["best"]

    return run_trial
