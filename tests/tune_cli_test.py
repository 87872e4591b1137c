#!/usr/bin/python3
"""`seqforge tune` end to end: two processes on one study file, two workers from one command
(tune.trials_per_device), a worker killed with SIGKILL and
the study resumed, a crashing trial, the report, and the bad-input errors.

Usage: tune_cli_test.py SEQFORGE DATA.csv WORKDIR
"""
import glob
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time

seqforge, data, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def config(name, extra_space="", sampler="{kind: tpe, seed: 1, n_startup_trials: 3}",
           epochs=4, batches=4, n_trials=8):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"""data:
  path: {data}
  date_column: date
  features: [pressure, temperature, wind]
  targets: [temperature]
  lookback: 8
model: {{hidden: 8}}
train: {{epochs: {epochs}, batch_size: 32, max_batches: {batches}, threads: 1, precision: fp32}}
tune:
  n_trials: {n_trials}
  sampler: {sampler}
  pruner: {{kind: median, n_startup_trials: 2}}
  heartbeat_interval: 0.2
  grace_period: 30
  space:
    optim.lr: {{type: float, low: 1.0e-4, high: 0.1, log: true, grid: [0.001, 0.01]}}
    model.hidden: {{type: int, low: 4, high: 12, step: 4}}
{extra_space}""")
    return path


def run(args, ok=True):
    p = subprocess.run([seqforge, "tune"] + args, cwd=work, capture_output=True, text=True,
                       timeout=300)
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: seqforge tune {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


STATE = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running",
         "WAITING": "waiting"}


def trials(db):
    """(number, state, params, message, system attrs) per trial, from Optuna's tables."""
    c = sqlite3.connect(db)
    rows = []
    for tid, number, state in c.execute(
            "SELECT trial_id, number, state FROM trials ORDER BY number").fetchall():
        params = dict(c.execute("SELECT param_name, param_value FROM trial_params "
                                "WHERE trial_id = ?", (tid,)).fetchall())
        attrs = {k: json.loads(v) for k, v in c.execute(
            "SELECT key, value_json FROM trial_system_attributes WHERE trial_id = ?", (tid,))}
        rows.append((number, STATE[state], params, attrs.get("seqforge:message", ""), attrs))
    c.close()
    return rows


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)
    print("ok:", what)


# 1. Two workers on one study file: every trial once.
cfg = config("pair")
db = os.path.join(work, "pair.db")
for suffix in ("", "-wal", "-shm"):
    if os.path.exists(db + suffix):
        os.remove(db + suffix)
procs = [subprocess.Popen([seqforge, "tune", cfg, "--study", db, "train.run_dir=" + work + "/pair"],
                          cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
         for _ in range(2)]
outs = [p.communicate(timeout=300) for p in procs]
for p, (out, err) in zip(procs, outs):
    check(p.returncode == 0, f"worker exit 0 ({err.strip()[-300:]})")
rows = trials(db)
check(len(rows) == 8 and sorted(r[0] for r in rows) == list(range(8)),
      "two workers: 8 trials numbered 0..7")
check(all(r[1] in ("complete", "pruned") for r in rows), "two workers: none failed or lost")
check("best: trial" in outs[0][0] and "config:" in outs[0][0], "best trial's config and checkpoint printed")
# best.yaml trains anew, not over the best trial's directory.
best_yaml = os.path.join(work, "pair", "best.yaml")
with open(best_yaml) as f:
    check('run_dir: ""' in f.read(), "best.yaml leaves train.run_dir to its default")

# 1b. tune.trials_per_device: one command, two workers on one study (the second's console in
# worker-1.log beside the study): every trial once, from two processes, each trial on its share
# of the CPUs; auto on a CPU is one.
cfg = config("per_device", epochs=8, batches=12, n_trials=6)
db = os.path.join(work, "per_device.db")
out = run([cfg, "--study", db, "tune.trials_per_device=2", "train.threads=0",
           "train.run_dir=" + work + "/per_device"]).stdout
rows = trials(db)
check(len(rows) == 6 and all(r[1] in ("complete", "pruned") for r in rows),
      f"trials_per_device 2: 6 trials, none failed ({[r[1] for r in rows]})")
pids = {r[4].get("seqforge:pid") for r in rows}
check(len(pids) == 2, f"trials_per_device 2: trials from two processes ({pids})")
check("tune.trials_per_device: 1 more worker on this CPU" in out, "the extra worker is announced")
cpus = len(os.sched_getaffinity(0))
each = max(1, cpus // 2)
threads = f"{each} thread" + ("s" if each > 1 else "")
check(f"tune.trials_per_device: 2 trials at once on {cpus} CPUs, {threads} each" in out,
      "the two workers share the CPUs")
for trial in glob.glob(os.path.join(work, "per_device", "trial-*", "train.log")):
    with open(trial) as f:
        text = f.read()
    check(f" {threads} (requested)" in text, f"{trial}: the trial takes its share of the CPUs")
check("study 'per_device' in" in out, "a tune.* override leaves the study its config's name")
with open(os.path.join(work, "per_device", "worker-1.log")) as f:
    check("trial" in f.read(), "the extra worker's console is in worker-1.log")
out = run([cfg, "--study", os.path.join(work, "per_device_auto.db"), "tune.trials_per_device=auto",
           "--n-trials", "1", "train.run_dir=" + work + "/per_device_auto"]).stdout
check("tune.trials_per_device auto: one trial at a time (the trials train on the CPU)" in out,
      "auto on a CPU: one trial at a time")
# More workers than trials left: the worker that finds nothing to claim while the other trains
# exits 0, so the leader has no worker's failure to warn of.
out = run([cfg, "--study", os.path.join(work, "per_device_one.db"), "tune.trials_per_device=2",
           "--n-trials", "1", "train.run_dir=" + work + "/per_device_one"]).stdout
check("ended with exit code" not in out and "best: trial 0" in out,
      f"two workers on one trial: neither fails ({out[-400:]})")
p = run([cfg, "tune.trials_per_device=0"], ok=False)
check(p.returncode != 0 and "tune.trials_per_device: expected auto or 1 to 64, got 0" in p.stderr,
      f"trials_per_device 0 is one line naming the key ({p.stderr.strip()})")
# A choice no trial could run with is refused before any trial starts.
p = run([cfg, "tune.space={optim.kind: {type: categorical, choices: [adamw, adamax]}}"], ok=False)
check(p.returncode != 0 and "tune.space.optim.kind.choices: 'adamax' is not a valid value: override "
      "'optim.kind=adamax': optim.kind must be adamw, adam or sgd, got 'adamax'" in p.stderr,
      f"an unknown optimizer among the choices is refused ({p.stderr.strip()})")
# The overrides rewrite the tune: section, so an error names the config without a line of it.
p = run([cfg, "tune.study_dir=x"], ok=False)
check(p.returncode != 0 and p.stderr.strip().endswith(
    "(as the tune.* overrides leave it): unknown key 'tune.study_dir' (known: name, direction, "
    "metric, value, n_trials, timeout, heartbeat_interval, grace_period, trials_per_device, "
    "sampler, pruner, space)"), f"an unknown tune.* key names no line ({p.stderr.strip()})")


def signal_mid_trial(cfg, db, run_dir, sig):
    """Starts a worker and sends it `sig` once its second trial has reported an epoch; (whether
    it was sent, the worker's stderr, its exit code)."""
    p = subprocess.Popen([seqforge, "tune", cfg, "--study", db, "train.run_dir=" + run_dir],
                         cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    sent = False
    while time.time() < deadline and p.poll() is None:
        try:
            c = sqlite3.connect(db)
            r = c.execute("SELECT count(*) FROM trials t JOIN trial_intermediate_values i "
                          "ON i.trial_id = t.trial_id WHERE t.state = 'RUNNING' AND t.number >= 1"
                          ).fetchone()
            c.close()
            if r[0] >= 1:
                p.send_signal(sig)
                sent = True
                break
        except sqlite3.Error:
            pass
        time.sleep(0.02)
    return sent, p.communicate()[1], p.returncode


# 2. A killed worker: its trial is found dead, retried, and the study resumes.
cfg = config("kill", epochs=6, batches=12, n_trials=5)
db = os.path.join(work, "kill.db")
for suffix in ("", "-wal", "-shm"):
    if os.path.exists(db + suffix):
        os.remove(db + suffix)
killed = signal_mid_trial(cfg, db, work + "/kill", signal.SIGKILL)[0]
check(killed, "a worker killed in the middle of a trial")
out = run([cfg, "--study", db, "train.run_dir=" + work + "/kill"]).stdout
rows = trials(db)
done = [r for r in rows if r[1] in ("complete", "pruned")]
failed = [r for r in rows if r[1] == "failed"]
check(len(done) == 5, f"resumed study has its 5 trials ({[r[1] for r in rows]})")
check(len(failed) == 1 and "died" in failed[0][3], f"the killed trial is failed: {failed}")
retry = [r for r in rows if "seqforge:retry_of" in r[4]]
check(len(retry) == 1 and retry[0][2] == failed[0][2], "the killed trial's parameters ran again")
# The study's trials start from one config: another one is refused, naming the key.
p = run([cfg, "--study", db, "train.run_dir=" + work + "/kill", "data.lookback=6",
         "tune.n_trials=6"], ok=False)
check(p.returncode != 0 and "ran its trials with data.lookback 8, this config gives 6" in p.stderr
      and len(trials(db)) == len(rows), f"a study's trials keep their config: {p.stderr.strip()}")
# A damaged record of that config is refused, not replaced by this one's.
with sqlite3.connect(db) as con:
    con.execute("UPDATE study_system_attributes SET value_json = '5' "
                "WHERE key = 'seqforge:trial_config'")
p = run([cfg, "--study", db, "train.run_dir=" + work + "/kill", "data.lookback=6",
         "tune.n_trials=6"], ok=False)
check(p.returncode != 0 and "seqforge:trial_config (the settings its trials ran with) is not a "
      "JSON object" in p.stderr and len(trials(db)) == len(rows),
      f"a damaged trial config is refused: {p.stderr.strip()}")

# 2a. A worker stopped by Ctrl-C: its trial is failed and its parameters run first when the
# study goes on.
cfg = config("int", epochs=6, batches=12, n_trials=3)
db = os.path.join(work, "int.db")
stopped, err, code = signal_mid_trial(cfg, db, work + "/int", signal.SIGINT)
check(stopped and code == 130 and "its parameters run again first" in err
      and "seqforge train --resume" not in err, f"a trial stopped by Ctrl-C: {err.strip()}")
run([cfg, "--study", db, "train.run_dir=" + work + "/int"])
rows = trials(db)
failed = [r for r in rows if r[1] == "failed"]
retry = [r for r in rows if "seqforge:retry_of" in r[4]]
check(len(failed) == 1 and len(retry) == 1 and retry[0][2] == failed[0][2]
      and retry[0][1] in ("complete", "pruned"),
      f"the stopped trial's parameters ran again: {[(r[0], r[1]) for r in rows]}")

# 2b. A worker paused (SIGSTOP) past the grace period: another worker fails its trial and runs
# the parameters again; when the paused one resumes, its late writes are rejected, it prints one
# line, discards the trial and goes on with the next.
cfg = config("pause", epochs=60, batches=20, n_trials=3, sampler="{kind: random, seed: 3}")
with open(cfg) as f:
    text = f.read()
with open(cfg, "w") as f:
    f.write(text.replace("lookback: 8", "lookback: 24").replace("model: {hidden: 8}",
                                                                "model: {hidden: 64}")
            .replace("grace_period: 30", "grace_period: 1.5")
            .replace("pruner: {kind: median, n_startup_trials: 2}", "pruner: none"))
db = os.path.join(work, "pause.db")
for suffix in ("", "-wal", "-shm"):
    if os.path.exists(db + suffix):
        os.remove(db + suffix)


def query(sql, args=()):
    c = sqlite3.connect(db, timeout=30)
    try:
        return c.execute(sql, args).fetchall()
    finally:
        c.close()


def trial0_steps():
    return query("SELECT count(*) FROM trials t JOIN trial_intermediate_values i "
                 "ON i.trial_id = t.trial_id WHERE t.number = 0")[0][0]


def unlocked():  # the paused worker must not hold the study's write lock
    c = sqlite3.connect(db, timeout=0.05)
    try:
        c.execute("BEGIN IMMEDIATE")
        c.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        c.close()


a = subprocess.Popen([seqforge, "tune", cfg, "--study", db, "train.run_dir=" + work + "/pause"],
                     cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
paused = False
deadline = time.time() + 120
while time.time() < deadline and a.poll() is None and not paused:
    try:
        if trial0_steps() >= 2:
            a.send_signal(signal.SIGSTOP)
            time.sleep(0.05)
            if unlocked():
                paused = True
            else:
                a.send_signal(signal.SIGCONT)
    except sqlite3.Error:
        pass
    time.sleep(0.02)
check(paused, "worker A paused (SIGSTOP) in the middle of trial 0")
time.sleep(2.0)  # past grace_period
b = subprocess.Popen([seqforge, "tune", cfg, "--study", db, "train.run_dir=" + work + "/pause"],
                     cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
retried = False
deadline = time.time() + 120
while time.time() < deadline and not retried:
    try:
        rows = trials(db)
        retried = any(r[4].get("seqforge:retry_of") == 0 and r[1] in ("complete", "pruned")
                      for r in rows)
    except sqlite3.Error:
        pass
    time.sleep(0.05)
check(retried, "worker B failed trial 0 and ran its parameters again")
steps_when_failed = trial0_steps()
a.send_signal(signal.SIGCONT)
out_a, err_a = a.communicate(timeout=300)
out_b, err_b = b.communicate(timeout=300)
check(a.returncode == 0 and b.returncode == 0, f"both workers exit 0 ({err_a[-300:]} {err_b[-300:]})")
rows = trials(db)
check(rows[0][1] == "failed" and "no heartbeat" in rows[0][3],
      f"the paused trial stays failed ({rows[0][1]}: {rows[0][3]})")
check(trial0_steps() == steps_when_failed,
      f"no intermediate value written after it was failed ({steps_when_failed})")
retry = [r for r in rows if r[4].get("seqforge:retry_of") == 0]
check(len(retry) == 1 and retry[0][2] == rows[0][2], "the retry holds trial 0's parameters")
line = [l for l in out_a.splitlines() if l.startswith("trial 0: failed by another worker")]
check(len(line) == 1 and "while this worker was paused (no heartbeat" in line[0]
      and line[0].endswith("its result is discarded"), f"the late worker printed: {line}")
check(sum(r[1] in ("complete", "pruned") for r in rows) == 3 and
      len({tuple(sorted(r[2].items())) for r in rows}) == len(rows) - 1,
      f"3 trials done, no parameters ran twice but the retry ({[r[1] for r in rows]})")

# 3. A trial that crashes (a window longer than the data) fails; the others complete.
cfg = config("crash", sampler="grid", epochs=2,
             extra_space="    data.lookback: {type: categorical, choices: [8, 100000]}\n")
db = os.path.join(work, "crash.db")
if os.path.exists(db):
    os.remove(db)
p = run([cfg, "--study", db, "train.run_dir=" + work + "/crash", "--n-trials", "100"], ok=False)
rows = trials(db)
check(len(rows) == 2 * 3 * 2, f"grid: every point once ({len(rows)} trials)")
check(sum(r[1] == "failed" for r in rows) == 6 and p.returncode == 0,
      "crashing trials failed, the study went on and found a best trial")
check("failed: " in p.stdout, "the crash is reported on the console")
crash_db = db

# 4. The report.
p = run(["--report", db])
check("trial  state" in p.stdout and os.path.exists(os.path.join(work, "report.html")),
      "--report prints the table and writes report.html")
with open(os.path.join(work, "report.html")) as f:
    html = f.read()
check("<svg" in html and "data.lookback" in html, "report has the history and each parameter")
metric = re.search(r"\((?:minimize|maximize) (val_\w+|train_loss)\)", p.stdout.splitlines()[0])
check(metric is not None and metric.group(1) + " per epoch" in html,
      f"the report names the study's metric: {p.stdout.splitlines()[0]}")
# A trial left running by a worker of this host that is gone is shown so, not running for ever;
# the header counts every state, waiting trials too.
gone = os.path.join(work, "gone.db")
shutil.copyfile(db, gone)
dead = subprocess.Popen(["true"])
dead.wait()
with sqlite3.connect(gone) as con:
    tid = con.execute("SELECT min(trial_id) FROM trials").fetchone()[0]
    con.execute("UPDATE trials SET state = 'RUNNING', datetime_complete = NULL WHERE trial_id = ?",
                (tid,))
    con.execute("DELETE FROM trial_system_attributes WHERE trial_id = ? AND key IN "
                "('seqforge:host', 'seqforge:pid')", (tid,))
    for key, value in (("seqforge:host", socket.gethostname()), ("seqforge:pid", dead.pid)):
        con.execute("INSERT INTO trial_system_attributes (trial_id, key, value_json) "
                    "VALUES (?, ?, ?)", (tid, key, json.dumps(value)))
p = run(["--report", gone, "--html", os.path.join(work, "gone.html")])
check("1 running (1 of them with their worker gone), 0 waiting" in p.stdout.splitlines()[0] and
      "running (worker gone)" in p.stdout and f"pid {dead.pid}) is gone" in p.stdout,
      f"a trial whose worker is gone: {p.stdout[:600]!r}")
# Names from the study file reach the terminal escaped.
escaped = os.path.join(work, "escaped.db")
shutil.copyfile(db, escaped)
with sqlite3.connect(escaped) as con:
    con.execute("UPDATE trial_params SET param_name = param_name || char(27) || '[31m' "
                "WHERE param_id = (SELECT min(param_id) FROM trial_params)")
p = run(["--report", escaped, "--html", os.path.join(work, "escaped.html")])
check("\x1b" not in p.stdout and "\\x1b[31m" in p.stdout,
      f"a control character in the study is printed escaped: {p.stdout!r}")
# A categorical parameter's record that does not say its choices is named as such.
damaged = os.path.join(work, "damaged.db")
for distribution, index, words in [
        ("{not json", "0", "its distribution_json is not a categorical distribution with choices: "
                           "'{not json'"),
        ('{"name": "CategoricalDistribution", "attributes": {"choices": []}}', "0",
         "its distribution_json is not a categorical distribution"),
        (None, "0.5", "holds 0.5, not the whole number of a choice"),
        (None, "7", "holds choice 7 of the 2 its distribution_json lists")]:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(damaged + suffix):
            os.remove(damaged + suffix)
    source, copy = sqlite3.connect(crash_db), sqlite3.connect(damaged)
    source.backup(copy)
    source.close()
    copy.close()
    with sqlite3.connect(damaged) as con:
        con.execute("UPDATE trial_params SET param_value = ?" +
                    (", distribution_json = ?" if distribution else "") +
                    " WHERE param_name = 'data.lookback'",
                    (index, distribution) if distribution else (index,))
    p = run(["--report", damaged], ok=False)
    err = p.stderr.strip()
    check(p.returncode != 0 and err.count("\n") == 0 and
          "trial 0: parameter 'data.lookback'" in err and words in err,
          f"a damaged categorical record: {err}")

# 5. Bad input: one line naming the file and key, non-zero exit.
bad = config("bad", extra_space="    model.hiden: {type: int, low: 1, high: 4}\n")
p = run([bad], ok=False)
err = p.stderr.strip()
check(p.returncode != 0 and err.count("\n") == 0 and "bad.yaml:" in err and "model.hiden" in err,
      f"malformed space: {err}")
p = run([config("other"), "--study", os.path.join(work, "pair.db")], ok=False)
check(p.returncode != 0 and "holds study 'pair', not 'other'" in p.stderr
      and not os.path.exists(os.path.join(work, "runs", "other")),
      f"a study file of another study (no trial directory left): {p.stderr.strip()}")
p = run([config("devnull"), "--study", "/dev/null"], ok=False)
check(p.returncode != 0 and "/dev/null: not a regular file" in p.stderr,
      f"a study that is no file: {p.stderr.strip()}")
p = run(["--report", os.path.join(work, "nothing.db")], ok=False)
check(p.returncode != 0 and "no such study file" in p.stderr, f"missing study: {p.stderr.strip()}")
with open(os.path.join(work, "junk.db"), "w") as f:
    f.write("not a database\n" * 100)
p = run([config("junk"), "--study", os.path.join(work, "junk.db")], ok=False)
check(p.returncode != 0 and "not a seqforge study database" in p.stderr,
      f"a file that is no database: {p.stderr.strip()}")
# A metric the task never reports, and one this data does not give (val_pinball without
# quantiles), are refused before the study exists.
bad = config("metric")
with open(bad) as f:
    text = f.read()
with open(bad, "w") as f:
    f.write(text.replace("tune:\n", "tune:\n  metric: val_accuracy\n"))
p = run([bad, "--study", os.path.join(work, "metric.db")], ok=False)
check(p.returncode != 0 and "tune.metric: 'val_accuracy' is not a metric of a forecast run"
      in p.stderr and not os.path.exists(os.path.join(work, "metric.db")),
      f"a metric the task never reports is refused at once: {p.stderr.strip()}")
with open(bad, "w") as f:
    f.write(text.replace("tune:\n", "tune:\n  metric: val_pinball\n"))
p = run([bad, "--study", os.path.join(work, "metric.db")], ok=False)
check(p.returncode != 0 and "tune.metric: 'val_pinball' is not a metric" in p.stderr
      and p.stderr.strip().count("\n") == 0 and not os.path.exists(os.path.join(work, "metric.db")),
      f"a metric this data does not give is refused at once: {p.stderr.strip()}")
# So is a column the data file lacks: no study of trials that all fail.
with open(bad, "w") as f:
    f.write(text.replace("targets: [temperature]", "targets: [no_such_column]", 1))
p = run([bad, "--study", os.path.join(work, "column.db")], ok=False)
check(p.returncode != 0 and "no_such_column" in p.stderr
      and "the trial of the space's low bounds and first choices (optim.lr=" in p.stderr
      and not os.path.exists(os.path.join(work, "column.db")),
      f"a missing column is refused before the study: {p.stderr.strip()}")
# 6. A study file in a directory that does not exist: one line naming it, nothing created.
missing = os.path.join(work, "no", "such", "dir", "s.db")
p = run([config("nodir"), "--study", missing], ok=False)
err = p.stderr.strip()
check(p.returncode != 0 and err.count("\n") == 0 and missing in err and "does not exist" in err
      and not os.path.exists(os.path.join(work, "no")), f"missing study directory: {err}")

# 6b. A tuned key every trial ignores (adapter.rank without an adapter) is said once at start.
p = run([config("ignored", epochs=1, batches=1, n_trials=1,
                extra_space="    adapter.rank: {type: int, low: 1, high: 4}\n"),
         "--study", os.path.join(work, "ignored.db")])
check(p.stdout.count("warning: adapter.rank is set but adapter.kind is none") == 1,
      f"an ignored tuned key is a warning: {p.stdout}")

# 6c. Two studies of one name in two databases do not share trial directories: the second is
# refused before any trial, naming the first; the first goes on.
cfg = config("owned", epochs=1, batches=1, n_trials=1)
owned = os.path.join(work, "owned")
run([cfg, "--study", os.path.join(work, "owned_a.db"), "train.run_dir=" + owned])
p = run([cfg, "--study", os.path.join(work, "owned_b.db"), "train.run_dir=" + owned], ok=False)
err = p.stderr.strip()
check(p.returncode != 0 and err.count("\n") == 0 and
      f"holds the trials of study 'owned' in {os.path.realpath(work)}/owned_a.db, not of study "
      f"'owned' in {os.path.realpath(work)}/owned_b.db" in err and
      not os.path.exists(os.path.join(work, "owned_b.db")), f"another study's trial directory: {err}")
run([cfg, "--study", os.path.join(work, "owned_a.db"), "train.run_dir=" + owned, "--n-trials", "2"])
check(len(trials(os.path.join(work, "owned_a.db"))) == 2, "the owning study goes on")
# Nor does a study go into a training run's directory (the two report.html would clash).
p = run([cfg, "train.run_dir=" + os.path.join(owned, "trial-0")], ok=False)
check(p.returncode != 0 and "holds a training run's files" in p.stderr and
      not os.path.exists(os.path.join(owned, "trial-0", "study.db")),
      f"a study in a run's directory: {p.stderr}")

# Two studies started at the same moment on one directory: one runs, the other is refused.
racing = os.path.join(work, "racing")
both = [subprocess.Popen([seqforge, "tune", cfg, "--study", os.path.join(work, f"racing_{x}.db"),
                          "train.run_dir=" + racing], cwd=work, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True) for x in "ab"]
outcomes = [(q.wait(timeout=300), q.stderr.read()) for q in both]
refused = [err for rc, err in outcomes if rc != 0 and "holds the trials of study 'owned'" in err]
check(len(refused) == 1 and sum(rc == 0 for rc, _ in outcomes) == 1,
      f"two studies started at once on one directory: one refused: {outcomes}")
check(os.path.exists(os.path.join(racing, "study.json")) and glob.glob(os.path.join(racing, "trial-*")),
      "the refused study leaves the other's files whole")

# 6c2. An override of a searched key would be recorded but never run: refused, naming it.
p = run([cfg, "--study", os.path.join(work, "override.db"), "optim.lr=0.5"], ok=False)
err = p.stderr.strip()
check(p.returncode != 0 and err.count("\n") == 0 and
      err.startswith("seqforge: error: override 'optim.lr=0.5': optim.lr is searched (") and
      not os.path.exists(os.path.join(work, "override.db")), f"an override of a searched key: {err}")

# 6d. A tune.* override of a subsection the file leaves out sets it (tune.pruner.kind=none).
cfg = config("no_pruner", epochs=1, batches=1, n_trials=1)
with open(cfg) as f:
    text = f.read()
with open(cfg, "w") as f:
    f.write(text.replace("  pruner: {kind: median, n_startup_trials: 2}\n", ""))
p = run([cfg, "--study", os.path.join(work, "no_pruner.db"), "tune.pruner.kind=none",
         "train.run_dir=" + os.path.join(work, "no_pruner")])
check("pruner none" in p.stdout, f"tune.pruner.kind=none without a pruner: section: {p.stdout}")

# 6e. A tune.* override given as a map merges into the file's section, as a training one does.
cfg = config("merged_pruner", epochs=1, batches=1, n_trials=1)
with open(cfg) as f:
    text = f.read()
with open(cfg, "w") as f:
    f.write(text.replace("  pruner: {kind: median, n_startup_trials: 2}\n",
                         "  pruner: {kind: none}\n"))
p = run([cfg, "--study", os.path.join(work, "merged_pruner.db"),
         "tune.pruner={n_warmup_steps: 1}", "train.run_dir=" + os.path.join(work, "merged")])
check("pruner none" in p.stdout, f"tune.pruner={{n_warmup_steps: 1}} keeps kind none: {p.stdout}")

# 7. --enqueue: trials with fixed parameters run first; values are checked against the space.
cfg = config("enq", n_trials=3,
             extra_space="    optim.kind: {type: categorical, choices: [adamw, sgd]}\n")
db = os.path.join(work, "enq.db")
p = run([cfg, "--study", db, "--enqueue", "optim.lr=0.003,optim.kind=sgd",
         "train.run_dir=" + work + "/enq", "--enqueue", "model.hidden=12"])  # overrides between
check(os.path.isdir(os.path.join(work, "enq", "trial-0")), "an override after --enqueue stays one")
check("enqueued trial 0: optim.lr=0.003,optim.kind=sgd" in p.stdout
      and "enqueued trial 1: model.hidden=12" in p.stdout, "--enqueue prints the trials it adds")
rows = trials(db)
check(rows[0][2]["optim.lr"] == 0.003 and rows[0][2]["optim.kind"] == 1 and
      rows[0][4]["fixed_params"] == {"optim.lr": 0.003, "optim.kind": "sgd"} and
      rows[1][2]["model.hidden"] == 12 and all(r[1] in ("complete", "pruned") for r in rows),
      f"enqueued trials ran first with their parameters ({rows[:2]})")
for spec, want in [("optim.lr=0.5", "is outside the space"),
                   ("model.hidden=5", "is outside the space"),
                   ("optim.kind=adam", "is not one of the choices (adamw, sgd)"),
                   ("optim.momentum=0.9", "is not a parameter"),
                   ("optim.lr", "expected key=value")]:
    p = run([cfg, "--study", db, "--enqueue", spec], ok=False)
    err = p.stderr.strip()
    check(p.returncode != 0 and want in err and err.count("\n") == 0, f"--enqueue {spec}: {err}")
check(len(trials(db)) == 3, "a rejected --enqueue adds nothing")

# 8. --export csv|json: every trial, parameters by value.
import csv
import io
p = run(["--export", "json", db])
doc = json.loads(p.stdout)
check(doc["study"] == "enq" and len(doc["trials"]) == 3 and
      doc["trials"][0]["params"] == {"optim.lr": 0.003, "optim.kind": "sgd",
                                     "model.hidden": rows[0][2]["model.hidden"]},
      "--export json: trials with parameters by value")
t0 = doc["trials"][0]
c = sqlite3.connect(db)
stored = dict(c.execute("SELECT i.step, i.intermediate_value FROM trial_intermediate_values i "
                        "JOIN trials t ON t.trial_id = i.trial_id WHERE t.number = 0"))
value = c.execute("SELECT v.value FROM trial_values v JOIN trials t ON t.trial_id = v.trial_id "
                  "WHERE t.number = 0").fetchone()[0]
c.close()
check({int(k): v for k, v in t0["intermediate_values"].items()} == stored and t0["value"] == value
      and t0["state"] in ("COMPLETE", "PRUNED") and t0["datetime_start"] and
      t0["seqforge"]["epochs"] == len(stored) and t0["seqforge"]["host"],
      "--export json: exact values, intermediate values, datetimes, seqforge attributes")
p = run(["--export", "csv", db])
table = list(csv.DictReader(io.StringIO(p.stdout)))
check(len(table) == 3 and table[0]["params_optim.kind"] == "sgd" and
      float(table[0]["value"]) == value and
      json.loads(table[0]["intermediate_values"]) == {str(k): v for k, v in stored.items()} and
      "seqforge_seconds" in table[0], "--export csv: the same, one row per trial")
p = run(["--export", "xml", db], ok=False)
check(p.returncode != 0 and "expected csv or json" in p.stderr, "--export: unknown format")
# A boolean choice is exported as the boolean Optuna reads, not as text.
bool_db = os.path.join(work, "bool.db")
run([config("bool", "    model.bidirectional: {type: categorical, choices: [false, true]}\n",
            sampler="{kind: random, seed: 3}", epochs=1, batches=2, n_trials=2),
     "--study", bool_db, "train.run_dir=" + work + "/bool"])
exported = [t["params"]["model.bidirectional"] for t in json.loads(run(["--export", "json", bool_db])
                                                               .stdout)["trials"]]
optuna_csv = list(csv.DictReader(io.StringIO(run(["--export", "csv", bool_db]).stdout)))
check(all(isinstance(v, bool) for v in exported) and
      [r["params_model.bidirectional"] for r in optuna_csv] == [str(v).lower() for v in exported],
      f"--export: booleans as booleans ({exported})")

# 9. tune.value: the trial's value is the epoch whose checkpoint is kept (best: the best epoch by
# the study's metric, even when the config monitors another one; last: the last epoch).
import struct


def checkpoint_meta(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


for mode in ("best", "last"):
    cfg = config("value_" + mode, n_trials=3, epochs=6,
                 sampler="{kind: random, seed: 5}")
    with open(cfg) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text.replace("tune:\n", f"tune:\n  value: {mode}\n  metric: val_mae\n")
                .replace("pruner: {kind: median, n_startup_trials: 2}", "pruner: none")
                .replace("precision: fp32}", "precision: fp32, early_stopping: {monitor: val_loss}}"))
    db = os.path.join(work, f"value_{mode}.db")
    run([cfg, "--study", db, "train.run_dir=" + work + "/value_" + mode])
    doc = json.loads(run(["--export", "json", db]).stdout)
    for t in doc["trials"]:
        meta = checkpoint_meta(os.path.join(work, f"value_{mode}", f"trial-{t['number']}",
                                            "model.safetensors"))
        saved = json.loads(meta["seqforge.metrics"])["val_mae"]
        inter = t["intermediate_values"]
        want = min(inter.values()) if mode == "best" else inter[str(max(map(int, inter)))]
        check(t["state"] == "COMPLETE" and t["value"] == want and saved == want and
              (mode == "best" or int(meta["seqforge.epoch"]) == len(inter)),
              f"tune.value {mode}: trial {t['number']} value {t['value']} is its kept "
              f"checkpoint's val_mae (epoch {meta['seqforge.epoch']})")

# 10. The shipped example study runs (briefly: 2 trials of 2 short epochs).
example = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(data))), "examples",
                       "configs", "weather_tune.yaml")
p = run([example, "--study", os.path.join(work, "example.db"), "--n-trials", "2",
         "data.path=" + data, "train.epochs=2", "train.max_batches=2",
         "train.run_dir=" + os.path.join(work, "example")])
check("study 'weather_tune'" in p.stdout and "sampler tpe, pruner median" in p.stdout and
      "best: trial" in p.stdout, "examples/configs/weather_tune.yaml runs")

print("tune CLI: all checks passed")
