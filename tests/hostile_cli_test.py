#!/usr/bin/python3
"""Every command of the CLI on hostile inputs of each kind: a file that is not what it claims to
be, a damaged checkpoint or metadata, a device file, a directory, invalid UTF-8 and control
characters, huge numbers, a config that is not a map. Each must end with a non-zero exit code
below 128 and one line on standard error starting "seqforge: error:" (never a signal, a
sanitizer report, a library's own message or a hang). The suite runs it in the release and the ASan+UBSan builds.

Usage: hostile_cli_test.py SEQFORGE REPO_ROOT
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile


def fail(message):
    raise SystemExit("FAIL: " + message)


def safetensors(path, header, data=b""):
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + data)


def main():
    seqforge, root = sys.argv[1:3]
    work = tempfile.mkdtemp(prefix="seqforge_hostile_cli_")
    config = os.path.join(root, "examples/configs/weather_forecast.yaml")
    data = os.path.join(root, "data/seattle-weather-hourly-normals.csv")
    env = dict(os.environ, SEQFORGE_CACHE_DIR=os.path.join(work, "cache"))

    def run(args, timeout=120):
        return subprocess.run([seqforge] + args, capture_output=True, cwd=work, env=env,
                              timeout=timeout)

    run_dir = os.path.join(work, "run")
    r = run(["train", config, "data.path=" + data, "train.epochs=1", "train.max_batches=2",
             "train.run_dir=" + run_dir])
    if r.returncode != 0:
        fail("the base run: exit %d\n%s" % (r.returncode, r.stderr.decode(errors="replace")))

    # Hostile files.
    garbage = os.path.join(work, "garbage.safetensors")
    with open(garbage, "wb") as f:
        f.write(b"\xff" * 64)
    truncated = os.path.join(work, "truncated")
    shutil.copytree(run_dir, truncated)
    model = os.path.join(truncated, "model.safetensors")
    with open(model, "rb") as f:
        blob = f.read()
    with open(model, "wb") as f:
        f.write(blob[:len(blob) // 2])
    bad_meta = os.path.join(work, "bad_meta")
    os.makedirs(bad_meta)
    safetensors(os.path.join(bad_meta, "model.safetensors"),
                {"__metadata__": {"seqforge.config": "[1, 2]\n\x1b[31m", "format": "seqforge"}})
    bad_yaml = os.path.join(work, "bad.yaml")
    with open(bad_yaml, "wb") as f:
        f.write(b"model: {hidden: 99999999999999999999999}\n[a]: \xff\xfe\n")
    list_yaml = os.path.join(work, "list.yaml")
    with open(list_yaml, "w") as f:
        f.write("- 1\n- 2\n")
    bad_csv = os.path.join(work, "bad.csv")
    with open(bad_csv, "wb") as f:
        f.write(b"date,pressure,temperature,wind\n2010-01-01T01:00:00,\xff\x1b[2J,1,2\n")
    peft = os.path.join(work, "adapter_model.safetensors")
    safetensors(peft, {"__metadata__": {"format": "pt"},
                       "base_model.model.head.lora_A.weight": {
                           "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    directory = os.path.join(work, "a_directory")
    os.makedirs(directory)
    out = os.path.join(work, "out.csv")

    cases = {
        "train on /dev/zero": ["train", config, "data.path=/dev/zero"],
        "train on a directory": ["train", config, "data.path=" + directory],
        "train on a CSV with control bytes": ["train", config, "data.path=" + bad_csv],
        "train with a huge integer": ["train", config, "model.layers=4611686018427387904"],
        "train a config that is not a map": ["train", list_yaml],
        "train a damaged config": ["train", bad_yaml],
        "train from /dev/zero": ["train", config, "data.path=" + data,
                                 "model.init_from=/dev/zero"],
        "train from garbage": ["train", config, "data.path=" + data,
                               "model.init_from=" + garbage],
        "train a config that is /dev/zero": ["train", "/dev/zero"],
        "resume a truncated run": ["train", "--resume", truncated],
        "eval a truncated run": ["eval", truncated, "--split", "val"],
        "eval garbage": ["eval", garbage],
        "eval with damaged metadata": ["eval", bad_meta],
        "eval on /dev/zero": ["eval", run_dir, "--data", "/dev/zero"],
        "predict garbage": ["predict", garbage, "--input", data, "--output", out],
        "predict a CSV with control bytes": ["predict", run_dir, "--input", bad_csv,
                                             "--output", out],
        "generate from /dev/zero": ["generate", "/dev/zero"],
        "generate with damaged metadata": ["generate", bad_meta],
        "merge a truncated run": ["merge", truncated, "--output", out],
        "merge garbage": ["merge", garbage, "--output", out],
        "predict over the run's model": ["predict", run_dir, "--input", data, "--output",
                                         os.path.join(run_dir, "model.safetensors")],
        "merge over the run's config": ["merge", run_dir, "--output",
                                        os.path.join(run_dir, "config.resolved.yaml")],
        "merge over the run's adapters": ["merge", run_dir, "--output",
                                          os.path.join(run_dir, "adapter_model.safetensors")],
        "predict over val_predictions": ["predict", run_dir, "--input", data, "--output",
                                         os.path.join(run_dir, "val_predictions.csv")],
        "merge a PEFT adapter file": ["merge", peft, "--output", out],
        "merge into the run's directory": ["merge", run_dir, "--output", run_dir],
        "merge into another run's directory": ["merge", run_dir, "--output", truncated],
        "predict over another run's metrics": ["predict", run_dir, "--input", data, "--output",
                                               os.path.join(truncated, "metrics.jsonl")],
        "tune a damaged config": ["tune", bad_yaml],
        "tune on /dev/zero": ["tune", "/dev/zero"],
        "report a directory that is no run": ["report", directory],
        "report a file": ["report", garbage],
        "diagnose a damaged config": ["diagnose", bad_yaml],
        "bench an unknown workload": ["bench", "W\x1b[31m"],
        "bench with a huge step count": ["bench", "W3", "--steps", "99999999999999999999"],
        "bench with a negative warm-up": ["bench", "W3", "--warmup", "-1"],
    }
    # What some of the lines must say.
    expected = {
        "merge over the run's adapters": "is the run's own adapter_model.safetensors",
        "predict over val_predictions": "is the run's own val_predictions.csv",
        "merge a PEFT adapter file": "a PEFT adapter file, which holds the adapters alone",
        "merge into the run's directory": "is the run's own directory",
        "merge into another run's directory": "is a run directory",
        "predict over another run's metrics": "is the metrics.jsonl of the run in",
    }
    failures = []
    for name, args in cases.items():
        try:
            r = run(args)
        except subprocess.TimeoutExpired:
            failures.append("%s: no exit in 120 s" % name)
            continue
        err = r.stderr.decode("utf-8", errors="replace")
        lines = [l for l in err.splitlines() if l.strip() and not l.startswith("seqforge: autotune")]
        if not 0 < r.returncode < 128 or len(lines) != 1 or \
                not lines[0].startswith("seqforge: error: "):
            failures.append("%s: exit %d, stderr %r" % (name, r.returncode, err[-600:]))
        elif "\x1b" in err or "json.exception" in err or "yaml-cpp" in err:
            failures.append("%s: a raw message: %r" % (name, err))
        elif expected.get(name, "") not in lines[0]:
            failures.append("%s: expected %r in %r" % (name, expected[name], lines[0]))
        else:
            print("%-36s %s" % (name, lines[0][:110]))
    r = run(["eval", run_dir, "--split", "val"])
    if r.returncode != 0:
        failures.append("the run no longer evaluates after the hostile commands: %s" % r.stderr)
    shutil.rmtree(work)
    if failures:
        fail("\n".join(failures))


if __name__ == "__main__":
    main()
