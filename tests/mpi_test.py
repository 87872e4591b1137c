#!/usr/bin/env python3
"""Data-parallel training under mpirun, end to end.

  mpi_test.py SEQFORGE SOURCE_DIR WORK_DIR

1. Equivalence: 2 ranks at batch b reach the parameters of 1 process at batch 2b (same seed, fp32,
   no dropout or augmentation), over epochs whose last global batch is short and leaves one rank
   without windows, and so do 3 ranks, also in micro-batches, and a masked autoencoder's 2 ranks
   (its logged training loss too); a run with another seed does not match (the comparison can
   fail).
2. A rank killed (SIGKILL) after the first epoch ends the job within a bound with a non-zero code;
   the checkpoint loads (seqforge eval) and every rank resumes from it.
3. A rank that hangs (SIGSTOP) makes the other stop after dist.timeout_seconds with one line that
   names the run directory.
4. Errors: a bad dist key names the key; a missing MPI module is a clear error; the seqforge
   binary does not link libmpi (a single process needs no MPI at run time).
Exits 77 (skipped) where mpirun or the MPI module is missing.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np

seqforge, source, work = sys.argv[1:4]
mpirun = shutil.which("mpirun")
module = os.path.join(os.path.dirname(os.path.realpath(seqforge)), "libseqforge_mpi.so")
if not mpirun or not os.path.exists(module):
    print(f"skipped: needs mpirun and {module} (Debian: openmpi-bin libopenmpi-dev)")
    sys.exit(77)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
data = os.path.join(source, "data", "seattle-weather-hourly-normals.csv")

env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
MPI = [mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2"]
failures = []


def epoch_lines(run):
    """metrics.jsonl's per-epoch lines (the test split's line after training left out)."""
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [j for j in map(json.loads, filter(str.strip, f)) if "epoch" in j]


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def config(name, extra=""):
    path = os.path.join(work, name + ".yaml")
    with open(path, "w") as f:
        f.write(f"""data:
  path: {data}
  date_column: date
  features: [pressure, temperature, wind]
  targets: [temperature]
  lookback: 24
  split: {{train: 0.1, val: 0.05}}
model: {{hidden: 24, layers: 2, dropout: 0.0}}
optim: {{kind: adamw, lr: 0.005}}
train:
  epochs: 2
  precision: fp32
  clip_grad_norm: 1.0
  save: last
  seed: 3
{extra}""")
    return path


def run(cmd, timeout=120, **kw):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    return p.returncode, p.stdout + p.stderr


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    header.pop("__metadata__", None)
    return {k: np.frombuffer(body[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
            for k, v in header.items()}


def max_rel_diff(a, b):
    worst = 0.0
    for k in a:
        worst = max(worst, float(np.max(np.abs(a[k] - b[k]) / (np.abs(b[k]) + 1e-2))))
    return worst


# 1. Equivalence. 851 training windows: 13 global batches of 64 and one of 19, all on rank 0
# (rank 1 has none in the last step).
cfg = config("equiv")
single = os.path.join(work, "single")
code, out = run([seqforge, "train", cfg, "train.batch_size=64", "train.threads=1",
                 "train.run_dir=" + single])
check(code == 0, "single process, batch 64: " + ("trained" if code == 0 else out[-2000:]))
code, out = run(MPI + [seqforge, "train", cfg, "train.batch_size=32",
                       "train.run_dir=" + os.path.join(work, "two")])
check(code == 0 and "data-parallel: 2 processes" in out,
      "mpirun -np 2, batch 32 per rank: " + ("trained" if code == 0 else out[-2000:]))
if not failures:
    a = tensors(os.path.join(work, "two", "model.safetensors"))
    b = tensors(os.path.join(single, "model.safetensors"))
    d = max_rel_diff(a, b)
    check(d < 1e-4, f"2 ranks x 32 equal 1 x 64 after 2 epochs of 14 steps (max relative difference {d:.2e})")
    code, out = run([seqforge, "train", cfg, "train.batch_size=64", "train.threads=1",
                     "train.seed=4", "train.run_dir=" + os.path.join(work, "other")])
    d_other = max_rel_diff(tensors(os.path.join(work, "other", "model.safetensors")), b)
    check(d_other > 1e-2, f"another seed does not match (max relative difference {d_other:.2e})")
    # 3 ranks: 851 = 8 * 96 + 83, the last step's ranks get 32, 32 and 19 windows.
    code, out = run(MPI[:-1] + ["3", seqforge, "train", cfg, "train.batch_size=32",
                                "train.run_dir=" + os.path.join(work, "three")])
    if code == 0:
        single96 = os.path.join(work, "single96")
        run([seqforge, "train", cfg, "train.batch_size=96", "train.threads=1",
             "train.run_dir=" + single96])
        d3 = max_rel_diff(tensors(os.path.join(work, "three", "model.safetensors")),
                          tensors(os.path.join(single96, "model.safetensors")))
        check(d3 < 1e-4, f"3 ranks x 32 (a short last step) equal 1 x 96 "
                         f"(max relative difference {d3:.2e})")
        # Micro-batches of 12 on every rank (12, 12, 8; the last step's 19 as 12 and 7).
        code, out = run(MPI[:-1] + ["3", seqforge, "train", cfg, "train.batch_size=32",
                                    "train.micro_batch_size=12",
                                    "train.run_dir=" + os.path.join(work, "three_micro")])
        if code == 0:
            dm = max_rel_diff(tensors(os.path.join(work, "three_micro", "model.safetensors")),
                              tensors(os.path.join(single96, "model.safetensors")))
            check(dm < 1e-4, f"3 ranks x 32 in micro-batches of 12 equal 1 x 96 "
                             f"(max relative difference {dm:.2e})")
        else:
            check(False, "mpirun -np 3 with micro-batches: " + out[-2000:])
    else:
        check(False, "mpirun -np 3: " + out[-2000:])
    # The masked autoencoder: a window's mask depends on the epoch and the window, not on the rank
    # or batch it lands in, so its runs are equal too (each rank's share weighed by its masked
    # steps).
    mae = ["data.task=mae", "data.targets=[]"]
    run([seqforge, "train", cfg, "train.batch_size=64", "train.threads=1",
         "train.run_dir=" + os.path.join(work, "mae_single")] + mae)
    code, out = run(MPI + [seqforge, "train", cfg, "train.batch_size=32", "train.micro_batch_size=20",
                           "train.run_dir=" + os.path.join(work, "mae_two")] + mae)
    if code == 0:
        da = max_rel_diff(tensors(os.path.join(work, "mae_two", "model.safetensors")),
                          tensors(os.path.join(work, "mae_single", "model.safetensors")))
        check(da < 1e-4, f"mae: 2 ranks x 32 in micro-batches of 20 equal 1 x 64 "
                         f"(max relative difference {da:.2e})")
        # Its ranks' mean losses are over their own masked steps, whose counts differ: the
        # logged training loss weighs each by its share of the step's.
        two = [j["train_loss"] for j in epoch_lines(os.path.join(work, "mae_two"))]
        one = [j["train_loss"] for j in epoch_lines(os.path.join(work, "mae_single"))]
        dl = max(abs(a - b) / abs(b) for a, b in zip(two, one)) if one else 1
        check(len(two) == len(one) == 2 and dl < 1e-6,
              f"mae: rank 0 logs one process's training loss (max relative difference {dl:.2e})")
    else:
        check(False, "mpirun -np 2, mae: " + out[-2000:])
    lines = epoch_lines(os.path.join(work, "two"))
    single_lines = epoch_lines(single)
    check(len(lines) == 2 and abs(lines[-1]["train_loss"] - single_lines[-1]["train_loss"]) < 1e-4,
          "rank 0 logs the global training loss, one line per epoch")


def ranks_of(job):
    """pid of each rank of the job started by mpirun (pid `job`), by OMPI_COMM_WORLD_RANK."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != job:
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                for var in f.read().split(b"\0"):
                    if var.startswith(b"OMPI_COMM_WORLD_RANK="):
                        found[int(var.split(b"=")[1])] = int(pid)
        except (OSError, ValueError, IndexError):
            pass
    return found


def signal_and_wait(job, pids, sig):
    """Sends `sig` to each of `pids` and waits for the job (killed after 60 s): its output and
    seconds."""
    t0 = time.time()
    for pid in pids:
        os.kill(pid, sig)
    try:
        out, _ = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
    return out, time.time() - t0


def start_and_wait_for_epoch(run_dir, extra):
    cfg = config("long")
    job = subprocess.Popen(MPI + [seqforge, "train", cfg, "train.run_dir=" + run_dir,
                                  "train.batch_size=16", "train.epochs=50", "train.save=every_n"]
                           + extra,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    state = os.path.join(run_dir, "training_state.safetensors")  # saved after the epoch's line
    deadline = time.time() + 60
    while time.time() < deadline and job.poll() is None:
        if os.path.exists(metrics) and os.path.getsize(metrics) > 0 and os.path.exists(state):
            break
        time.sleep(0.05)
    return job


# 2. A rank killed after the first epoch.
dead = os.path.join(work, "dead")
job = start_and_wait_for_epoch(dead, [])
pids = ranks_of(job.pid)
check(job.poll() is None and 1 in pids, f"ranks running after the first epoch ({pids})")
if 1 in pids:
    out, took = signal_and_wait(job, [pids[1]], signal.SIGKILL)
    print("  mpirun said: " + " | ".join(l for l in out.splitlines()[-8:] if l.strip()))
    check(job.returncode != 0 and took < 30,
          f"the job ends after a rank is killed (exit {job.returncode}, {took:.1f} s)")
    code, out = run([seqforge, "eval", dead])
    check(code == 0 and "test_rmse" in out, "the last checkpoint loads: " + out.strip()[-300:])
    code, out = run(MPI + [seqforge, "train", "--resume", dead, "train.epochs=4"])
    epochs = [j["epoch"] for j in epoch_lines(dead)]
    check(code == 0 and "resuming" in out and epochs == list(range(1, 5)),
          f"2 ranks resume the run (epochs {epochs})" + ("" if code == 0 else out[-1500:]))
else:
    job.kill()
    job.communicate()

# 3. A rank that hangs: the other gives up after dist.timeout_seconds, naming the run directory
# (rank 0's, which a rank past 0 learns from it) and its last checkpoint.
for stopped, waiting in ((1, 0), (0, 1)):
    hung = os.path.join(work, f"hung{stopped}")
    job = start_and_wait_for_epoch(hung, ["dist.timeout_seconds=3"])
    pids = ranks_of(job.pid)
    if stopped in pids:
        out, took = signal_and_wait(job, [pids[stopped]], signal.SIGSTOP)
        try:
            os.kill(pids[stopped], signal.SIGKILL)  # if the launcher left it stopped
        except ProcessLookupError:
            pass
        expected = (f"rank {waiting}: no reply from rank(s) within 3 s (a rank died?); the last "
                    f"checkpoint in {hung} is intact")
        check(job.returncode != 0 and expected in out and took < 30,
              f"rank {stopped} hung: rank {waiting} ends the job after the timeout "
              f"(exit {job.returncode}, {took:.1f} s)" + ("" if expected in out else ": " + out[-1500:]))
        code, out = run([seqforge, "eval", hung])
        check(code == 0, "the last checkpoint loads after the timeout")
    else:
        check(False, f"ranks running for the timeout test ({pids})")
        job.kill()
        job.communicate()

# 3b. Ctrl-C (SIGINT to every rank) of a profiled run: the ranks stop at one step, and the trace
# of the steps taken is written into the run directory.
profiled = os.path.join(work, "profiled")
job = start_and_wait_for_epoch(profiled, ["--profile"])
pids = ranks_of(job.pid)
if len(pids) == 2:
    out, _ = signal_and_wait(job, pids.values(), signal.SIGINT)
    trace = os.path.join(profiled, "trace.json")
    check(job.returncode != 0 and "interrupted (SIGINT)" in out and os.path.exists(trace)
          and f"profile ({trace}" in out,
          f"an interrupted profiled run writes its trace (exit {job.returncode})"
          + ("" if os.path.exists(trace) else ": " + out[-1500:]))
else:
    check(False, f"ranks running for the interrupt test ({pids})")
    job.kill()
    job.communicate()

# 4. Errors.
code, out = run(MPI + [seqforge, "train", config("bad"), "dist.timeout_seconds=0",
                       "train.run_dir=" + os.path.join(work, "bad")])
check(code != 0 and "dist.timeout_seconds must be positive" in out, "bad dist key: " + out.strip()[-200:])
code, out = run([seqforge, "train", config("bad"), "dist.bucket_mb=-1"])
check(code != 0 and "dist.bucket_mb must be positive" in out.splitlines()[-1], "bad bucket size (one process)")
env_missing = dict(env, SEQFORGE_MPI_MODULE="/nonexistent/libseqforge_mpi.so")
p = subprocess.run(MPI + ["-x", "SEQFORGE_MPI_MODULE", seqforge, "train", config("bad")],
                   env=env_missing, capture_output=True, text=True, timeout=60)
check(p.returncode != 0 and "could not be loaded" in p.stdout + p.stderr,
      "a missing MPI module is a clear error")
# A rank given another setting (a model that no longer fits rank 0's collectives, another learning
# rate that would train silently) is refused naming the key, before any rank claims the directory.
# The seed too: a masked autoencoder's masks come from it.
for key, values in (("model.hidden", ("16", "32")), ("optim.lr", ("0.001", "0.1")),
                    ("train.seed", ("3", "8"))):
    differs = os.path.join(work, "differs")
    ranks = []
    for value in values:
        ranks += [":", "-np", "1", seqforge, "train", config("differs"), f"{key}={value}",
                  "train.run_dir=" + differs]
    code, out = run(MPI[:-2] + ranks[1:])
    expected = f"rank 1's {key} is '{values[1]}', rank 0's is '{values[0]}'"
    check(code != 0 and expected in out and not os.path.exists(differs),
          f"ranks with different {key} are refused: " + out.strip()[-300:])
# A rank whose copy of the data differs in one value would train on other windows silently.
changed = os.path.join(work, "changed.csv")
with open(data) as f:
    lines = f.readlines()
cells = lines[40].rstrip("\n").split(",")
cells[2] = str(float(cells[2]) + 1)
lines[40] = ",".join(cells) + "\n"
with open(changed, "w") as f:
    f.writelines(lines)
differs = os.path.join(work, "differs")
code, out = run(MPI[:-2] + ["-np", "1", seqforge, "train", config("differs"), "train.run_dir=" + differs,
                            ":", "-np", "1", seqforge, "train", config("differs"), "data.path=" + changed,
                            "train.run_dir=" + differs])
check(code != 0 and f"rank 1's data file '{changed}' is not rank 0's" in out and not os.path.exists(differs),
      "ranks reading different data are refused: " + out.strip()[-300:])
# A rank's own resources may differ from rank 0's: its loader's workers and prefetch.
own = os.path.join(work, "own")
code, out = run(MPI[:-2] + ["-np", "1", seqforge, "train", config("differs"), "train.run_dir=" + own,
                            "train.max_batches=2", ":", "-np", "1", seqforge, "train",
                            config("differs"), "train.run_dir=" + own, "train.max_batches=2",
                            "data.num_workers=0", "data.prefetch_factor=4"])
check(code == 0, "a rank's own data.num_workers and data.prefetch_factor: " + out.strip()[-300:])
# A study's trials run in one process each: tune under mpirun is one clear line, no study.
tune_config = config("tune", "tune:\n  n_trials: 2\n  space:\n    optim.lr: {type: float, low: 0.001, high: 0.01}\n")
study_db = os.path.join(work, "tune.db")
code, out = run(MPI + [seqforge, "tune", tune_config, "--study", study_db])
check(code != 0 and "tune: under mpirun with 2 processes: each trial runs in one process" in out
      and not os.path.exists(study_db), "tune under mpirun is refused: " + out.strip()[-300:])
# So do eval, predict, generate and merge: each rank would do all of it, writing the same files.
code, out = run(MPI + [seqforge, "eval", own])
check(code != 0 and "eval: under mpirun with 2 processes: eval runs in one process" in out,
      "eval under mpirun is refused: " + out.strip()[-300:])
ldd = subprocess.run(["ldd", seqforge], capture_output=True, text=True).stdout
check("libmpi" not in ldd, "the seqforge binary does not link libmpi")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
