#!/usr/bin/python3
"""`seqforge tune` end to end: two processes on one study file, a worker killed with SIGKILL and
the study resumed, a crashing trial, the report, and the bad-input errors.

Usage: tune_cli_test.py SEQFORGE DATA.csv WORKDIR
"""
import json
import os
import shutil
import signal
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

# 2. A killed worker: its trial is found dead, retried, and the study resumes.
cfg = config("kill", epochs=6, batches=12, n_trials=5)
db = os.path.join(work, "kill.db")
for suffix in ("", "-wal", "-shm"):
    if os.path.exists(db + suffix):
        os.remove(db + suffix)
p = subprocess.Popen([seqforge, "tune", cfg, "--study", db, "train.run_dir=" + work + "/kill"],
                     cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.time() + 120
killed = False
while time.time() < deadline and p.poll() is None:
    try:
        c = sqlite3.connect(db)
        r = c.execute("SELECT count(*) FROM trials t JOIN trial_intermediate_values i "
                      "ON i.trial_id = t.trial_id WHERE t.state = 'RUNNING' AND t.number >= 1"
                      ).fetchone()
        c.close()
        if r[0] >= 1:
            p.send_signal(signal.SIGKILL)
            killed = True
            break
    except sqlite3.Error:
        pass
    time.sleep(0.02)
p.wait()
check(killed, "a worker killed in the middle of a trial")
out = run([cfg, "--study", db, "train.run_dir=" + work + "/kill"]).stdout
rows = trials(db)
done = [r for r in rows if r[1] in ("complete", "pruned")]
failed = [r for r in rows if r[1] == "failed"]
check(len(done) == 5, f"resumed study has its 5 trials ({[r[1] for r in rows]})")
check(len(failed) == 1 and "died" in failed[0][3], f"the killed trial is failed: {failed}")
retry = [r for r in rows if "seqforge:retry_of" in r[4]]
check(len(retry) == 1 and retry[0][2] == failed[0][2], "the killed trial's parameters ran again")

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

# 4. The report.
p = run(["--report", db])
check("trial  state" in p.stdout and os.path.exists(os.path.join(work, "report.html")),
      "--report prints the table and writes report.html")
with open(os.path.join(work, "report.html")) as f:
    html = f.read()
check("<svg" in html and "data.lookback" in html, "report has the history and each parameter")

# 5. Bad input: one line naming the file and key, non-zero exit.
bad = config("bad", extra_space="    model.hiden: {type: int, low: 1, high: 4}\n")
p = run([bad], ok=False)
err = p.stderr.strip()
check(p.returncode != 0 and err.count("\n") == 0 and "bad.yaml:" in err and "model.hiden" in err,
      f"malformed space: {err}")
p = run([config("other"), "--study", os.path.join(work, "pair.db")], ok=False)
check(p.returncode != 0 and "holds study 'pair', not 'other'" in p.stderr,
      f"a study file of another study: {p.stderr.strip()}")
p = run(["--report", os.path.join(work, "nothing.db")], ok=False)
check(p.returncode != 0 and "no such study file" in p.stderr, f"missing study: {p.stderr.strip()}")
with open(os.path.join(work, "junk.db"), "w") as f:
    f.write("not a database\n" * 100)
p = run([config("junk"), "--study", os.path.join(work, "junk.db")], ok=False)
check(p.returncode != 0 and "not a seqforge study database" in p.stderr,
      f"a file that is no database: {p.stderr.strip()}")
bad = config("metric").replace("metric.yaml", "metric.yaml")
with open(bad) as f:
    text = f.read()
with open(bad, "w") as f:
    f.write(text.replace("tune:\n", "tune:\n  metric: val_accuracy\n"))
p = run([bad, "--study", os.path.join(work, "metric.db")], ok=False)
rows = trials(os.path.join(work, "metric.db"))
check(p.returncode != 0 and "tune.metric: 'val_accuracy' is not a metric" in p.stderr
      and len(rows) == 1, f"an unknown metric stops the study at once: {p.stderr.strip()}")
print("tune CLI: all checks passed")
