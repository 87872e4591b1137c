#!/usr/bin/python3
"""seqforge's PostgreSQL studies in Optuna's schema: a temporary server holds one database whose
schema Optuna (SQLAlchemy, python3-psycopg2) created and one seqforge created; `pg_dump
--schema-only` of the two must be the same (tables, columns, native enum types and their labels,
constraints, indexes), and optuna.load_study reads the seqforge study.

Usage: optuna_postgres_test.py SEQFORGE DATA.csv WORKDIR   (skips when no server binaries)
"""
import glob
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import warnings

seqforge, data, work = sys.argv[1:4]
bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
if not bins:
    print("skipped: no PostgreSQL server binaries under /usr/lib/postgresql")
    sys.exit(0)
try:
    import optuna
    import psycopg2  # noqa: F401
except ImportError as e:
    sys.exit(f"FAIL: {e} (scripts/install-deps.sh installs python3-optuna and python3-psycopg2)")
warnings.simplefilter("ignore")
optuna.logging.set_verbosity(optuna.logging.WARNING)
bin_dir = os.path.dirname(bins[-1])
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
os.chmod(work, 0o777)
as_user = []
if os.geteuid() == 0:  # PostgreSQL refuses to run as root
    as_user = ["runuser", "-u", "nobody", "--"]
    nobody = pwd.getpwnam("nobody")
    os.chown(work, nobody.pw_uid, nobody.pw_gid)
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
pgdata = os.path.join(work, "data")
subprocess.run(as_user + [bin_dir + "/initdb", "-D", pgdata, "-A", "trust", "-U", "seqforge",
                          "--no-sync"], check=True, capture_output=True)
subprocess.run(as_user + [bin_dir + "/pg_ctl", "-D", pgdata, "-l", os.path.join(work, "log"), "-w",
                          "-o", f"-h 127.0.0.1 -p {port} -k {work} -c fsync=off", "start"],
               check=True, capture_output=True)


def check(cond, what):
    if not cond:
        stop()
        sys.exit("FAIL: " + what)
    print("ok:", what)


def stop():
    subprocess.run(as_user + [bin_dir + "/pg_ctl", "-D", pgdata, "-m", "immediate", "-w", "stop"],
                   capture_output=True)


try:
    base = f"postgresql://seqforge@127.0.0.1:{port}/"
    for db in ("by_optuna", "by_seqforge"):
        subprocess.run([bin_dir + "/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "seqforge",
                        db], check=True)
    optuna.create_study(study_name="ref", storage=base + "by_optuna")
    cfg = os.path.join(work, "pg.yaml")
    with open(cfg, "w") as f:
        f.write(f"""data:
  path: {data}
  date_column: date
  features: [pressure, temperature, wind]
  targets: [temperature]
  lookback: 8
model: {{hidden: 8}}
train: {{epochs: 4, batch_size: 32, max_batches: 4, threads: 1, precision: fp32}}
tune:
  name: pg
  n_trials: 4
  sampler: {{kind: random, seed: 1}}
  pruner: {{kind: median, n_startup_trials: 2}}
  space:
    optim.lr: {{type: float, low: 1.0e-4, high: 0.1, log: true}}
    optim.kind: {{type: categorical, choices: [adamw, sgd]}}
""")
    p = subprocess.run([seqforge, "tune", cfg, "--study", base + "by_seqforge",
                        "train.run_dir=" + os.path.join(work, "runs")], capture_output=True,
                       text=True, timeout=600)
    check(p.returncode == 0, f"seqforge tune on PostgreSQL ({p.stderr.strip()[-300:]})")

    def schema(db):
        out = subprocess.run([bin_dir + "/pg_dump", "--schema-only", "--no-owner", "-h",
                              "127.0.0.1", "-p", str(port), "-U", "seqforge", db],
                             check=True, capture_output=True, text=True).stdout
        lines = [l for l in out.splitlines() if l and not l.startswith("--") and
                 not l.startswith("SET ") and not l.startswith("SELECT pg_catalog") and
                 not l.startswith("\\restrict") and not l.startswith("\\unrestrict")]
        return "\n".join(lines)

    a, b = schema("by_optuna"), schema("by_seqforge")
    if a != b:
        import difflib
        print("\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), "optuna", "seqforge",
                                             lineterm="")))
    check(a == b, "pg_dump --schema-only: seqforge's schema is Optuna's")
    for db in ("by_optuna", "by_seqforge"):
        rows = subprocess.run([bin_dir + "/psql", "-At", "-h", "127.0.0.1", "-p", str(port), "-U",
                               "seqforge", db, "-c",
                               "SELECT schema_version, library_version FROM version_info; "
                               "SELECT version_num FROM alembic_version"],
                              check=True, capture_output=True, text=True).stdout.split()
        check(rows == ["12|3.1.0", "v3.0.0.d"], f"{db}: version_info and alembic_version {rows}")
    study = optuna.load_study(study_name="pg", storage=base + "by_seqforge")
    S = optuna.trial.TrialState
    check(len(study.trials) == 4 and all(t.state in (S.COMPLETE, S.PRUNED) for t in study.trials)
          and all(t.params["optim.kind"] in ("adamw", "sgd") and t.intermediate_values
                  for t in study.trials), "optuna.load_study reads the seqforge study")
    study.optimize(lambda t: t.suggest_float("optim.lr", 1e-4, 0.1, log=True) +
                   (t.suggest_categorical("optim.kind", ["adamw", "sgd"]) == "sgd"), n_trials=1)
    check(len(study.trials) == 5, "optuna continues it on PostgreSQL")

    # A database of seqforge's former schema (as it was created on PostgreSQL) is converted on
    # first open and the study goes on.
    def psql(db, sql):
        return subprocess.run([bin_dir + "/psql", "-At", "-v", "ON_ERROR_STOP=1", "-h",
                               "127.0.0.1", "-p", str(port), "-U", "seqforge", db, "-c", sql],
                              check=True, capture_output=True, text=True).stdout

    fingerprint = json.loads(psql("by_seqforge", "SELECT value_json FROM study_system_attributes "
                                  "WHERE key = 'seqforge:fingerprint'").strip())
    space = json.loads(psql("by_seqforge", "SELECT value_json FROM study_system_attributes "
                            "WHERE key = 'seqforge:space'").strip())
    subprocess.run([bin_dir + "/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "seqforge",
                    "old"], check=True)
    q = lambda v: "'" + v.replace("'", "''") + "'"
    psql("old", f"""
CREATE TABLE seqforge_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE seqforge_studies (name TEXT PRIMARY KEY, direction TEXT NOT NULL, fingerprint TEXT
  NOT NULL, space TEXT, created TEXT);
CREATE TABLE seqforge_trials (id BIGSERIAL PRIMARY KEY, study TEXT NOT NULL, number BIGINT NOT
  NULL, state TEXT NOT NULL, value TEXT, params TEXT, attrs TEXT, started TEXT, finished TEXT,
  heartbeat TEXT, epochs BIGINT, host TEXT, pid BIGINT, message TEXT, UNIQUE (study, number));
CREATE TABLE seqforge_intermediate (trial_id BIGINT NOT NULL, step BIGINT NOT NULL, value TEXT,
  PRIMARY KEY (trial_id, step));
INSERT INTO seqforge_meta VALUES ('schema_version', '1');
INSERT INTO seqforge_studies VALUES ('pg', 'minimize', {q(fingerprint)}, {q(json.dumps(space))},
  '1700000000');
INSERT INTO seqforge_trials (study, number, state, value, params, attrs, started, finished,
  heartbeat, epochs, host, pid, message) VALUES
  ('pg', 0, 'complete', '0.33333333333333331', '{{"optim.lr": 0.01, "optim.kind": 1}}', '{{}}',
   '1700000000', '1700000010', '1700000010', 2, 'h', 12, ''),
  ('pg', 1, 'waiting', NULL, '{{"optim.lr": 0.02, "optim.kind": 0}}',
   '{{"retries": 1, "retry_of": 0}}', NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO seqforge_intermediate VALUES (1, 0, '0.5'), (1, 1, '0.33333333333333331');
""")
    p = subprocess.run([seqforge, "tune", cfg, "--study", base + "old", "--n-trials", "3",
                        "train.run_dir=" + os.path.join(work, "old")], capture_output=True,
                       text=True, timeout=600)
    check(p.returncode == 0, f"seqforge tune on a former-schema database ({p.stderr.strip()[-300:]})")
    check(psql("old", "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE "
                      "'seqforge%'").strip() == "0", "the former tables are gone")
    study = optuna.load_study(study_name="pg", storage=base + "old")
    t = study.trials
    check(len(t) == 3 and t[0].state == S.COMPLETE and t[0].value == 1 / 3 and
          t[0].params == {"optim.lr": 0.01, "optim.kind": "sgd"} and
          t[0].intermediate_values == {0: 0.5, 1: 1 / 3} and
          t[1].params["optim.lr"] == 0.02 and t[1].params["optim.kind"] == "adamw" and
          t[1].state in (S.COMPLETE, S.PRUNED) and t[1].system_attrs["seqforge:retry_of"] == 0,
          "converted: the old trials in Optuna's tables, the queued retry ran with its parameters")

    # A database in another time zone: heartbeats on the database's clock, as Optuna's. An
    # Optuna worker's running trial with a fresh heartbeat stays running, and seqforge's
    # heartbeats are the database's time, not UTC.
    subprocess.run([bin_dir + "/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "seqforge",
                    "eastern"], check=True)
    psql("eastern", "ALTER DATABASE eastern SET timezone TO 'America/New_York'")
    optuna.create_study(study_name="pg", storage=base + "eastern")
    storage = optuna.storages.RDBStorage(base + "eastern", heartbeat_interval=1)
    study_id = storage.get_study_id_from_name("pg")
    running = storage.create_new_trial(study_id)
    storage.record_heartbeat(running)
    p = subprocess.run([seqforge, "tune", cfg, "--study", base + "eastern", "--n-trials", "2",
                        "train.run_dir=" + os.path.join(work, "eastern")], capture_output=True,
                       text=True, timeout=600)
    check(p.returncode == 0, f"seqforge tune in another time zone ({p.stderr.strip()[-300:]})")
    t = optuna.load_study(study_name="pg", storage=base + "eastern").trials
    check(len(t) == 2 and t[0].state == S.RUNNING and t[1].state in (S.COMPLETE, S.PRUNED),
          f"another worker's live trial stays running ({[x.state.name for x in t]})")
    age = float(psql("eastern", "SELECT EXTRACT(EPOCH FROM LOCALTIMESTAMP - heartbeat) FROM "
                     f"trial_heartbeats WHERE trial_id = {t[1]._trial_id}").strip())
    check(0 <= age < 120, f"seqforge's heartbeat is the database's time ({age:.1f} s old)")
finally:
    stop()
print("optuna postgres: all checks passed")
