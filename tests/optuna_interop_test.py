#!/usr/bin/python3
"""seqforge studies are Optuna studies: python3-optuna (Debian, 3.1) reads a study seqforge wrote
(states, parameters, intermediate values, values, trials_dataframe, parameter importances),
seqforge continues a study Optuna created (complete, pruned and an enqueued WAITING trial), and
Optuna continues it again with a trivial objective over the same distributions.

Usage: optuna_interop_test.py SEQFORGE DATA.csv WORKDIR
"""
import json
import math
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import warnings

import optuna

seqforge, data, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.simplefilter("ignore")

LR = optuna.distributions.FloatDistribution(1e-4, 0.1, log=True)
HIDDEN = optuna.distributions.IntDistribution(4, 12, step=4)
KIND = optuna.distributions.CategoricalDistribution(["adamw", "sgd"])
WD = optuna.distributions.FloatDistribution(0.0, 0.1, step=0.05)


TUNED = """    optim.lr: {type: float, low: 1.0e-4, high: 0.1, log: true}
    model.hidden: {type: int, low: 4, high: 12, step: 4}
    optim.kind: {type: categorical, choices: [adamw, sgd]}
    optim.weight_decay: {type: float, low: 0.0, high: 0.1, step: 0.05}
"""


def config(name, n_trials, sampler="{kind: tpe, seed: 1, n_startup_trials: 3}",
           pruner="{kind: median, n_startup_trials: 2}", space=TUNED):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"""data:
  path: {data}
  date_column: date
  features: [pressure, temperature, wind]
  targets: [temperature]
  lookback: 8
model: {{hidden: 8}}
train: {{epochs: 4, batch_size: 32, max_batches: 4, threads: 1, precision: fp32}}
tune:
  name: {name}
  n_trials: {n_trials}
  sampler: {sampler}
  pruner: {pruner}
  heartbeat_interval: 0.2
  grace_period: 30
  space:
{space}""")
    return path


def tune(args):
    p = subprocess.run([seqforge, "tune"] + args, cwd=work, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        sys.exit(f"FAIL: seqforge tune {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)
    print("ok:", what)


def finished_ok(study):
    S = optuna.trial.TrialState
    for t in study.trials:
        if t.state == S.COMPLETE:
            assert t.value is not None and math.isfinite(t.value), t
        if t.state in (S.COMPLETE, S.PRUNED):
            assert set(t.params) == {"optim.lr", "model.hidden", "optim.kind",
                                     "optim.weight_decay"}, t.params
            assert t.distributions["optim.lr"] == LR, t.distributions
            assert t.distributions["model.hidden"] == HIDDEN, t.distributions
            assert t.distributions["optim.kind"] == KIND, t.distributions
            assert t.distributions["optim.weight_decay"] == WD, t.distributions
            assert t.params["optim.kind"] in ("adamw", "sgd")
            assert isinstance(t.params["model.hidden"], int)
    return True


# 1. A seqforge study, read by Optuna.
db = os.path.join(work, "sf.db")
url = "sqlite:///" + db
out = tune([config("sf", 8), "--study", db, "train.run_dir=" + work + "/sf"]).stdout
study = optuna.load_study(study_name="sf", storage=url)
S = optuna.trial.TrialState
states = [t.state for t in study.trials]
check(len(study.trials) == 8 and [t.number for t in study.trials] == list(range(8)),
      "optuna sees the 8 trials numbered 0..7")
check(all(s in (S.COMPLETE, S.PRUNED) for s in states) and S.COMPLETE in states,
      f"states COMPLETE/PRUNED ({[s.name for s in states]})")
check(finished_ok(study), "parameters by value with Float/Int/Categorical distributions")
for t in study.trials:
    if t.state == S.COMPLETE:
        check(t.intermediate_values and t.value == min(t.intermediate_values.values()),
              f"trial {t.number}: value is its best epoch's val_loss ({t.value})")
    if t.state == S.PRUNED:
        check(t.value == t.intermediate_values[max(t.intermediate_values)],
              f"trial {t.number}: pruned, value is the last reported")
    check(t.datetime_start is not None and t.datetime_complete >= t.datetime_start,
          f"trial {t.number}: datetimes")
    check(t.system_attrs.get("seqforge:epochs") == len(t.intermediate_values),
          f"trial {t.number}: seqforge:epochs attribute")
check(study.best_trial.value == min(t.value for t in study.trials if t.state == S.COMPLETE),
      "best trial")
check(study.system_attrs.get("seqforge:fingerprint", "").startswith("minimize;val_loss"),
      "study attribute seqforge:fingerprint")
df = study.trials_dataframe()
check(len(df) == 8 and "params_optim.kind" in df.columns and "value" in df.columns,
      "trials_dataframe")
check(set(df["params_optim.kind"]) <= {"adamw", "sgd"}, "dataframe shows categoricals by value")
imp = optuna.importance.get_param_importances(study)
check(set(imp) == {"optim.lr", "model.hidden", "optim.kind", "optim.weight_decay"},
      f"parameter importances {imp}")
# Optuna's plots (python3-plotly) draw every finished trial of the seqforge study.
history = optuna.visualization.plot_optimization_history(study)
drawn = sum(len(trace.x) for trace in history.data if trace.name == "Objective Value")
check(drawn == len([t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]),
      f"plot_optimization_history draws the {drawn} complete trials")
curves = optuna.visualization.plot_intermediate_values(study)
check(len(curves.data) == len([t for t in study.trials if t.intermediate_values]),
      "plot_intermediate_values draws a curve per trial that reported")
optuna.visualization.plot_param_importances(study)
optuna.visualization.plot_parallel_coordinate(study)
print("ok: optuna.visualization plots")

# The SQLite schema is the one Optuna creates, statement for statement.
ref = os.path.join(work, "ref.db")
optuna.create_study(study_name="ref", storage="sqlite:///" + ref)


def sqlite_schema(path):
    c = sqlite3.connect(path)
    rows = c.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").fetchall()
    versions = c.execute("SELECT * FROM version_info").fetchall() + \
        c.execute("SELECT * FROM alembic_version").fetchall()
    c.close()
    return rows, versions


check(sqlite_schema(db) == sqlite_schema(ref),
      "sqlite_master and version rows equal those of a file Optuna created")

# 2. Optuna continues the seqforge study with a trivial objective over the same distributions.
def objective(trial):
    lr = trial.suggest_float("optim.lr", 1e-4, 0.1, log=True)
    h = trial.suggest_int("model.hidden", 4, 12, step=4)
    k = trial.suggest_categorical("optim.kind", ["adamw", "sgd"])
    wd = trial.suggest_float("optim.weight_decay", 0.0, 0.1, step=0.05)
    for step in range(3):
        trial.report(abs(math.log10(lr) + 2) + 1 / (step + 1) + h / 100, step)
    return abs(math.log10(lr) + 2) + 1 / 3 + h / 100 + (k == "sgd") + wd


study.optimize(objective, n_trials=2)
check(len(study.trials) == 10 and study.trials[-1].state == S.COMPLETE,
      "optuna ran 2 more trials in the seqforge study")
out = tune([config("sf", 12), "--study", db, "train.run_dir=" + work + "/sf"]).stdout
study = optuna.load_study(study_name="sf", storage=url)
check(len(study.trials) == 12 and finished_ok(study) and
      all(t.state in (S.COMPLETE, S.PRUNED) for t in study.trials),
      "seqforge went on after Optuna: 12 trials")

# 3. A study Optuna created (complete, pruned, an enqueued WAITING trial), continued by seqforge.
db2 = os.path.join(work, "op.db")
url2 = "sqlite:///" + db2
study = optuna.create_study(study_name="op", storage=url2, direction="minimize")


def objective2(trial):
    value = objective(trial)
    if trial.number == 1:
        raise optuna.TrialPruned()
    return value


study.optimize(objective2, n_trials=3)
study.enqueue_trial({"optim.lr": 0.003, "optim.kind": "sgd"})
check([t.state for t in study.trials] == [S.COMPLETE, S.PRUNED, S.COMPLETE, S.WAITING],
      "optuna study: complete, pruned, complete, waiting")
optuna.create_study(study_name="another", storage=url2)  # an Optuna file may hold several
p = tune([config("op", 7), "--study", db2, "train.run_dir=" + work + "/op"])
study = optuna.load_study(study_name="op", storage=url2)
check(len(study.trials) == 7 and all(t.state in (S.COMPLETE, S.PRUNED) for t in study.trials),
      f"seqforge continued the optuna study to 7 trials ({[t.state.name for t in study.trials]})")
t3 = study.trials[3]
check(t3.params["optim.lr"] == 0.003 and t3.params["optim.kind"] == "sgd" and
      t3.system_attrs.get("fixed_params") == {"optim.lr": 0.003, "optim.kind": "sgd"} and
      t3.system_attrs.get("seqforge:host"),
      f"the enqueued trial ran in seqforge with its fixed parameters ({t3.params})")
check(finished_ok(study), "seqforge's trials in the optuna study have its distributions")
study.optimize(objective, n_trials=1)
check(len(study.trials) == 8 and study.trials[-1].state == S.COMPLETE,
      "optuna went on after seqforge")

# 4. A grid study shared with Optuna's GridSampler, either one first: every point runs once.
GRID_SPACE = """    optim.lr: {type: float, low: 0.001, high: 0.1, grid: [0.001, 0.01, 0.1]}
    model.hidden: {type: int, low: 4, high: 8, step: 4}
    optim.kind: {type: categorical, choices: [adamw, sgd]}
"""
GRID = {"optim.lr": [0.001, 0.01, 0.1], "model.hidden": [4, 8], "optim.kind": ["adamw", "sgd"]}


def grid_objective(trial):
    lr = trial.suggest_float("optim.lr", 0.001, 0.1)
    trial.suggest_int("model.hidden", 4, 8, step=4)
    trial.suggest_categorical("optim.kind", ["adamw", "sgd"])
    return lr


def points_run(study):
    done = [t for t in study.trials if t.state == S.COMPLETE]
    return sorted(tuple(sorted(t.params.items())) for t in done)


every_point = sorted(tuple(sorted({"optim.lr": lr, "model.hidden": h, "optim.kind": k}.items()))
                     for lr in GRID["optim.lr"] for h in GRID["model.hidden"]
                     for k in GRID["optim.kind"])
for first in ("seqforge", "optuna"):
    name = "grid_" + first
    db3 = os.path.join(work, name + ".db")
    url3 = "sqlite:///" + db3
    grid_args = [config(name, 100, sampler="{kind: grid, seed: 2}", pruner="{kind: none}",
                        space=GRID_SPACE), "--study", db3, "train.run_dir=" + work + "/" + name]
    if first == "seqforge":
        tune(grid_args + ["--n-trials", "5"])
        study = optuna.load_study(study_name=name, storage=url3,
                                  sampler=optuna.samplers.GridSampler(GRID))
        study.optimize(grid_objective, n_trials=30)
    else:
        study = optuna.create_study(study_name=name, storage=url3, direction="minimize",
                                    sampler=optuna.samplers.GridSampler(GRID, seed=0))
        study.optimize(grid_objective, n_trials=5)
        tune(grid_args)
    study = optuna.load_study(study_name=name, storage=url3)
    check(points_run(study) == every_point and len(study.trials) == 12,
          f"a grid run by {first} first, then the other: each of the 12 points once "
          f"({len(study.trials)} trials)")

# 5. Running trials are judged by one clock: Optuna's check of stale heartbeats (the database's
# CURRENT_TIMESTAMP, whole seconds on SQLite) finds a seqforge trial under way alive, and a
# parameter enqueued from Optuna that the space does not search is not the trial's.
db5 = os.path.join(work, "hb.db")
url5 = "sqlite:///" + db5
hb = optuna.create_study(study_name="hb", storage=url5, direction="minimize")
hb.enqueue_trial({"optim.lr": 0.003, "optim.kind": "sgd", "model.layers": 2})
runner = subprocess.Popen([seqforge, "tune", config("hb", 1), "--study", db5,
                           "train.run_dir=" + work + "/hb", "train.epochs=5000",
                           "train.max_batches=20"], cwd=work, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
storage = optuna.storages.RDBStorage(url5, heartbeat_interval=1, grace_period=10)
study_id = storage.get_study_id_from_name("hb")
checks, stale = 0, []
deadline = time.time() + 60
while time.time() < deadline and checks < 40:
    running = [t for t in storage.get_all_trials(study_id) if t.state == S.RUNNING]
    if running:
        stale += storage._get_stale_trial_ids(study_id)
        checks += 1
    time.sleep(0.05)
runner.send_signal(signal.SIGINT)
runner.communicate(timeout=120)
check(checks == 40 and not stale,
      f"Optuna finds seqforge's running trial alive in {checks} checks (stale: {stale})")
t0 = optuna.load_study(study_name="hb", storage=url5).trials[0]
check("model.layers" not in t0.params and t0.params["optim.lr"] == 0.003,
      f"an enqueued parameter outside the space is not the trial's ({t0.params})")

# 6. A categorical of Optuna's with None among its choices reads as null.
url6 = "sqlite:///" + os.path.join(work, "none.db")
none_study = optuna.create_study(study_name="none", storage=url6)
NONE = {"train.clip_grad_norm": optuna.distributions.CategoricalDistribution([None, 1.0])}
for choice in (None, 1.0):
    none_study.enqueue_trial({"train.clip_grad_norm": choice})
    t = none_study.ask(NONE)
    none_study.tell(t, 0.5)
exported = subprocess.run([seqforge, "tune", "--export", "json", os.path.join(work, "none.db")],
                          capture_output=True, text=True)
params = ([t["params"]["train.clip_grad_norm"] for t in json.loads(exported.stdout)["trials"]]
          if exported.returncode == 0 else exported.stderr)
check(params == [None, 1.0], f"Optuna's None choice exports as null: {params}")
print("optuna interop: all checks passed")
