#!/usr/bin/python3
"""Command-line mistakes get one line on standard error, in the user's words, and a non-zero exit;
the same arguments in another order that mean the same thing just work.

Usage: cli_errors_test.py SEQFORGE REPO_ROOT
"""
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile


def fail(message):
    raise SystemExit("FAIL: " + message)


def main():
    seqforge, root = sys.argv[1:3]
    work = tempfile.mkdtemp(prefix="seqforge_cli_errors_")
    config = os.path.join(root, "examples/configs/weather_forecast.yaml")
    quick = ["train.epochs=1", "train.max_batches=2"]

    def run(*args):
        return subprocess.run([seqforge] + list(args), capture_output=True, text=True, cwd=root)

    forecast = os.path.join(work, "forecast")
    # Overrides before the config, options after it: the same run.
    r = run("train", "train.run_dir=" + forecast, *quick, config, "--overwrite")
    if r.returncode != 0:
        fail("overrides before the config: exit %d\n%s" % (r.returncode, r.stderr))
    weather = os.path.join(root, "data/seattle-weather-hourly-normals.csv")
    # A file name YAML would read otherwise (" #" starts a comment) is the file named.
    odd_name = os.path.join(work, "weather #1 [copy].csv")
    shutil.copyfile(weather, odd_name)
    plain, odd = (run("predict", forecast, "--input", f, "--last") for f in (weather, odd_name))
    if odd.returncode != 0 or odd.stdout != plain.stdout:
        fail("predict --input '%s': exit %d\n%s" % (odd_name, odd.returncode, odd.stderr))
    text = os.path.join(work, "text.txt")
    with open(text, "w") as f:
        f.write("to be or not to be, that is the question\n" * 40)
    charlm = os.path.join(work, "charlm")
    r = run("train", os.path.join(root, "examples/configs/shakespeare_charlm.yaml"),
            "data.path=" + text, "data.seq_len=16", "model.hidden=16", "train.run_dir=" + charlm, *quick)
    if r.returncode != 0:
        fail("charlm run: exit %d\n%s" % (r.returncode, r.stderr))
    # Runs started from a base model that has since moved away: a forecast resumes from its
    # training state alone; a character model reads its vocabulary from the base, and says so.
    moved_base = os.path.join(work, "base.safetensors")
    finetuned = os.path.join(work, "finetuned")
    charlm_config = os.path.join(root, "examples/configs/shakespeare_charlm.yaml")
    charlm_data = ["data.path=" + text, "data.seq_len=16", "model.hidden=16"]
    for model, cfg, extra, ft_dir in ((forecast, config, [], os.path.join(work, "forecast_ft")),
                                      (charlm, charlm_config, charlm_data, finetuned)):
        shutil.copyfile(os.path.join(model, "model.safetensors"), moved_base)
        r = run("train", cfg, *extra, "model.init_from=" + moved_base, "train.run_dir=" + ft_dir,
                *quick)
        if r.returncode != 0:
            fail("init_from run: exit %d\n%s" % (r.returncode, r.stderr))
        os.remove(moved_base)
    r = run("train", "--resume", os.path.join(work, "forecast_ft"), "train.epochs=2")
    if r.returncode != 0:
        fail("a forecast resumed without its base model: exit %d\n%s" % (r.returncode, r.stderr))
    tokens = os.path.join(work, "tokenizer.json")
    r = run("tokenizer", "train", text, "--vocab-size", "300", "-o", tokens)
    if r.returncode != 0:
        fail("tokenizer train: exit %d\n%s" % (r.returncode, r.stderr))
    study = os.path.join(work, "study")
    os.makedirs(study)
    open(os.path.join(study, "study.db"), "w").close()
    sqlite_db = os.path.join(work, "s.db")
    with sqlite3.connect(sqlite_db) as db:
        db.execute("CREATE TABLE studies (study_id INTEGER)")

    # A config of two YAML documents, one with a key given twice; a data file to predict over.
    two_documents = os.path.join(work, "two_documents.yaml")
    with open(config) as f:
        base = f.read()
    with open(two_documents, "w") as f:
        f.write(base + "---\ntrain:\n  epochs: 1\n")
    twice = os.path.join(work, "twice.yaml")
    with open(twice, "w") as f:
        f.write(base.replace("model:\n", "model:\n  hidden: 8\n  hidden: 16\n", 1))
    data_copy = os.path.join(work, "data_copy.csv")
    shutil.copyfile(weather, data_copy)
    on_copy = os.path.join(work, "on_copy")  # a run that trained on the copy
    r = run("train", config, "train.run_dir=" + on_copy, "data.path=" + data_copy, *quick)
    if r.returncode != 0:
        fail("a run on a copy of the data: exit %d\n%s" % (r.returncode, r.stderr))
    two_documents_line = base.count("\n") + 1  # its '---'
    # A study without tune.metric: it takes train.early_stopping.monitor's.
    with open(os.path.join(root, "examples/configs/weather_tune.yaml")) as f:
        tune_text = f.read()
    by_monitor = os.path.join(work, "by_monitor.yaml")
    with open(by_monitor, "w") as f:
        f.write(tune_text.replace("  metric: val_loss\n", "").replace(
            "data/", os.path.join(root, "data") + "/"))
    nul = os.path.join(work, "nul.yaml")
    with open(nul, "w") as f:
        lines = base.split("\n")
        f.write("\n".join(lines[:2] + [lines[2] + "\0"] + lines[3:]))
    # A data file named as one of the run's own files in its directory: refused, and kept.
    inside = os.path.join(work, "inside")
    os.makedirs(inside)
    inside_data = os.path.join(inside, "val_predictions.csv")
    shutil.copyfile(weather, inside_data)
    bad_space = os.path.join(work, "bad_space.yaml")
    with open(bad_space, "w") as f:
        f.write(base + "tune:\n  space:\n    model.hidden: {type: int, low: -4, high: 4}\n")
    # A run whose model.safetensors is a named pipe: refused, not waited on for ever.
    piped = os.path.join(work, "piped")
    shutil.copytree(forecast, piped)
    os.remove(os.path.join(piped, "model.safetensors"))
    os.mkfifo(os.path.join(piped, "model.safetensors"))

    cases = [
        (["eval", piped], "piped/model.safetensors: not a regular file (a directory, device or "
                          "pipe)"),
        (["train", two_documents], "two_documents.yaml:%d: a second YAML document ('---'): a "
                                   "config is one document" % two_documents_line),
        (["train", twice], "twice.yaml:%d: 'model.hidden' is given twice" %
         (base[:base.index("model:\n")].count("\n") + 3)),
        (["generate", charlm, "--length", "18446744073709551617"],
         "--length: '18446744073709551617' is not a whole number from 0 to"),
        (["predict", forecast, "--input", data_copy, "--output", data_copy],
         "--output %s is the --input file: the predictions would replace the data" % data_copy),
        (["predict", on_copy, "--input", weather, "--output", data_copy],
         "--output: %s is the data the run trained on (its data.path)" % data_copy),
        (["train", "--resume", forecast, config],
         "train: --resume %s continues that run with its own config" % forecast),
        (["train", config, "--epochs", "3"],
         "config keys are given as key.path=value, e.g. train.epochs=3"),
        (["train", config, config], "train: one CONFIG.yaml expected"),
        (["train", config, "train.run_dir=#1"],
         "override 'train.run_dir=#1': the value starts with '#', which YAML reads as a comment "
         "(no value); quote it: 'train.run_dir=\"#1\"'"),
        (["predict", forecast], "--input is required"),
        (["frobnicate"], "The following argument was not expected: frobnicate"),
        (["eval", forecast, "train.epochs=3"],
         "eval takes no config keys: a run keeps the config it trained with"),
        (["train"], "train: give a CONFIG.yaml, or --resume RUN_DIR"),
        # A run's training state is what --resume reads, not a model to evaluate or start from.
        (["eval", os.path.join(forecast, "training_state.safetensors")],
         "training_state.safetensors: a run's training state (what --resume reads), not its model: "
         "give the run directory or its model.safetensors"),
        (["train", config, "model.init_from=" + os.path.join(forecast, "training_state.safetensors"),
          "train.run_dir=" + os.path.join(work, "from_state")],
         "training_state.safetensors' is a run's training state (what --resume reads), not a "
         "model"),
        (["train", "--resume", finetuned, "train.epochs=2"],
         "model.init_from '%s': no such file or folder; the resumed run reads its base model there "
         "(its vocabulary, its shape): give its new place with model.init_from=PATH" % moved_base),
        (["train", "--resume", os.path.join(work, "nothing")], "no such run directory"),
        (["train", "--resume", forecast, "train.run_dir=" + os.path.join(work, "elsewhere")],
         "train.run_dir=%s': a resumed run goes on in its directory %s; train.run_dir cannot "
         "move it" % (os.path.join(work, "elsewhere"), forecast)),
        (["train", config, "train.epochs"], "is not a config file, nor an override: expected train.epochs=VALUE"),
        (["generate", forecast], "generate needs a language model (data.task charlm or lm); this "
                                 "is a forecast run (use seqforge predict)"),
        (["generate", charlm, "--top-k", "0"], "--top-k must be positive"),
        (["bench", "W3", "--warmup", "2147483648"],
         "--warmup: '2147483648' is not a whole number from 0 to 1048576"),
        (["diagnose", "--steps", "99999999999"],
         "--steps: '99999999999' is not a whole number from 0 to 1048576"),
        (["generate", charlm, "--top-k", "1.5"], "--top-k: '1.5' is not a whole number ("),
        (["generate", charlm, "--temperature", "-1"], "--temperature must be 0"),
        (["predict", charlm, "--input", text, "--output", "-"],
         "predict needs a forecast, classify or text_classify run; this is a charlm run "
         "(sample from it with seqforge generate)"),
        (["predict", study, "--input", text, "--output", "-"],
         "a tune study's directory, not a run: give one of its trials"),
        (["eval", os.path.join(work, "nothing")], "no such run directory or model.safetensors"),
        (["report", study], "a tune study's directory, not a run: its report is written by "
                            "seqforge tune"),
        (["train", "--resume", study], "a tune study's directory, not a run: resume one of its "
                                       "trials"),
        (["eval", sqlite_db], "s.db: a study database, not a run: `seqforge tune --report"),
        (["merge", forecast, "--output", "-"], "--output -: merge writes a model file"),
        (["train", os.path.join(root, "examples/configs/shakespeare_gpt.yaml"), "data.path=" + text,
          "model.init_from=" + charlm, "train.run_dir=" + os.path.join(work, "gpt_from_lstm")],
         "is a recurrent model; model.family transformer starts from a transformer's checkpoint"),
        # A tokenizer's tokens train a Hugging Face decoder, never a check failure of the model.
        (["train", charlm_config, *charlm_data, "data.task=lm", "data.tokenizer=" + tokens,
          "train.run_dir=" + os.path.join(work, "lm_lstm")],
         "data.task lm takes model.family decoder (a Hugging Face model on its tokenizer's "
         "tokens, model.init_from its folder); a recurrent model of characters is data.task "
         "charlm"),
        (["train", os.path.join(root, "examples/configs/shakespeare_gpt.yaml"), "data.path=" + text,
          "data.task=lm", "data.tokenizer=" + tokens,
          "train.run_dir=" + os.path.join(work, "lm_gpt")],
         "model.family transformer takes data.task charlm or text_classify, not lm (a "
         "tokenizer's tokens train a Hugging Face model: model.family decoder"),
        (["train", config, "optim.eps=0"], "override 'optim.eps=0': optim.eps must be above 0"),
        (["train", config, "optim.beta1=1"], "override 'optim.beta1=1': optim.beta1 must be in "
                                             "[0, 1), got 1"),
        (["tune", os.path.join(root, "examples/configs/weather_tune.yaml"), "--study", study],
         "is a directory; a study is a database file in it, e.g. " +
         os.path.join(study, "study.db")),
        (["tune", os.path.join(root, "examples/configs/weather_tune.yaml"), "--n-trials", "-1"],
         "--n-trials: '-1' is not a whole number from 1 up"),
        (["tune", os.path.join(root, "examples/configs/weather_tune.yaml"), "--n-trials",
          "18446744073709551617"], "--n-trials: '18446744073709551617' is not a whole number"),
        (["tokenizer", "train", text, "-o", os.path.join(work, "t.json"), "--min-frequency",
          "18446744073709551617"], "--min-frequency: '18446744073709551617' is not a whole number"),
        (["tokenizer", "train", text, "-o", os.path.join(work, "t.json"), "--vocab-size",
          "99999999999"], "--vocab-size: '99999999999' is not a whole number from 1 to"),
        (["tune", os.path.join(root, "examples/configs/weather_tune.yaml"), "--timeout", "-1"],
         "tune: --timeout must be a positive, finite number of seconds, got -1"),
        (["tune", os.path.join(root, "examples/configs/weather_tune.yaml"), "--timeout", "inf"],
         "tune: --timeout must be a positive, finite number of seconds, got inf"),
        (["train", config, "model.cell=rnn"], "override 'model.cell=rnn': model.cell must be lstm, "
                                              "gru or lnlstm, got 'rnn'"),
        (["train", config, "optim.kind=adamax"], "override 'optim.kind=adamax': optim.kind must "
                                                 "be adamw, adam or sgd, got 'adamax'"),
        (["train", config, "model.cell=lnlstm", "model.hidden=1"],
         "model.hidden must be at least 2 for model.cell lnlstm, got 1"),
        (["train", config, "model.cell=gru", "model.proj_size=4"], "model.proj_size is for "
                                                                   "model.cell: lstm"),
        (["train", config, "model.proj_size=64", "model.hidden=64"],
         "model.proj_size must be 0 (none) or below model.hidden 64, got 64"),
        (["train", config, "model.dropout_mode=locked"],
         "model.dropout_mode must be standard or variational, got 'locked'"),
        (["train", "--profile", config], "--profile took '%s' as its trace file" % config),
        (["train", config, "--profile", "train.epochs=1"],
         "--profile took 'train.epochs=1' as its trace file"),
        (["train", "--resume", config], "is a file, not a run directory; start a run from a "
                                        "config with: seqforge train " + config),
        (["train", "--resume", os.path.join(forecast, "model.safetensors")],
         "is a file, not a run directory; its run is %s: seqforge train --resume %s" %
         (forecast, forecast)),
        (["train", config, "data.path=../nowhere.csv"],
         "override 'data.path=../nowhere.csv': data.path '../nowhere.csv': no such file (a "
         "relative path is read from the current directory, %s, not from the config's)" % root),
        (["train", config, "optim.lr=-1"],
         "override 'optim.lr=-1': optim.lr must be a finite number >= 0, got -1"),
        (["train", config, "train.threads=-1"],
         "override 'train.threads=-1': train.threads must be in [0, 4096], got -1"),
        (["eval", forecast, "--data", text, "--split", "val"],
         "eval: --data evaluates every window of that file; --split val evaluates a split"),
        (["generate", config], "a config, not a run: train it first (seqforge train %s)" % config),
        (["generate", text], "not a run directory or a model.safetensors"),
        (["predict", charlm, "--input", config, "--output", "-"],
         "predict needs a forecast, classify or text_classify run; this is a charlm run"),
        (["eval", charlm, "--split", "val", "--split", "test"],
         "--split: given 2 times; give it once (--help lists the options)"),
        (["eval", charlm, "--data", config],
         "characters are not in the vocabulary of the model"),
        # The forecasting keys' values.
        (["train", config, "data.horizon=20000"],
         "data.horizon 20000 with data.horizon_mode direct is an output per step ahead; at most "
         "10000"),
        (["train", config, "data.horizon_mode=next"],
         "data.horizon_mode must be direct or last, got 'next'"),
        (["train", config, "train.loss=quantile", "train.quantiles=[0.5, 0.5]"],
         "train.quantiles must be ascending and distinct, got 0.5 then 0.5"),
        (["train", config, "train.loss=quantile", "train.quantiles=[nan]"],
         "train.quantiles: 'nan' is not a quantile"),
        (["train", config, "model.output=sequence"],
         "model.output must be last, every_step or final_states, got 'sequence'"),
        (["train", config, "data.split.train=0.9", "data.split.val=0.2"],
         "data.split.train 0.9 (override 'data.split.train=0.9') + data.split.val 0.2 exceed 1: "
         "the test part is what is left"),
        (["train", config, "data.missing_values=['', x]"],
         "data.missing_values: an empty entry (empty cells are missing values already)"),
        (["train", config, "data.missing=drop"],
         "data.missing must be error, ffill, interpolate or mask, got 'drop'"),
        (["train", config, "data.frequency=0H"], "data.frequency must be auto, B"),
        (["train", config, "data.holidays=/nonexistent/h.txt"],
         "/nonexistent/h.txt: cannot open: No such file or directory (data.holidays)"),
        (["train", config, "data.static=[pressure]"],
         "column 'pressure' (data.static) is"),
        (["train", config, "data.known_future=[nothing]"],
         "has no column 'nothing'"),
        # Data quoted in a message is escaped: no terminal control sequence, no second line.
        (["train", config, "data.targets=[\x1b(0red]"], "no column '\\x1b(0red'"),
        # A target named as a column predict writes would be two columns of one name there.
        (["train", config, "data.targets=[forecast_for]"],
         "data.targets: 'forecast_for' is the name of a column predict writes"),
        (["train", config, "data.targets=[temperature, temperature_actual]"],
         "'temperature_actual' is the name of the column predict writes for target 'temperature'"),
        (["train", config, "data.date_column=a\tb"], "'a\\x09b'"),
        # Loader and augmentation settings are checked before anything is printed.
        (["train", config, "data.num_workers=-3"],
         "data.num_workers must be auto or a count in [0, 256], got '-3'"),
        (["train", config, "augment.jitter.p=3"],
         "override 'augment.jitter.p=3': augment.jitter.p must be in [0, 1], got 3"),
        # diagnose refuses them as train does; tune before any trial starts.
        (["diagnose", config, "augment.jitter.p=3"],
         "override 'augment.jitter.p=3': augment.jitter.p must be in [0, 1], got 3"),
        (["diagnose", config, "optim.lr=-1"],
         "override 'optim.lr=-1': optim.lr must be a finite number >= 0, got -1"),
        (["tune", os.path.join(root, "examples/configs/weather_tune.yaml"), "--study",
          os.path.join(work, "bad_base.db"), "augment.jitter.p=3"],
         "override 'augment.jitter.p=3': augment.jitter.p must be in [0, 1], got 3"),
        (["tune", by_monitor, "--study", os.path.join(work, "bad_monitor.db"),
          "train.early_stopping.monitor=val_bogus"],
         "override 'train.early_stopping.monitor=val_bogus': train.early_stopping.monitor (the "
         "study's metric): 'val_bogus' is not a metric of a forecast run"),
        (["train", config, "data.path=" + os.path.join(root, "data/seattle-weather.csv"),
          "data.features=[wind]", "data.targets=[temp_max]", "data.lookback=7",
          "data.categorical=[weather]", "data.known_future=[weather]"],
         "data.known_future: 'weather' is a column of categories (data.categorical, "
         "data.static); the values known ahead are numbers"),
        (["train", nul], "nul.yaml:3: a control byte (0x00, NUL), which YAML does not allow"),
        (["train", config, "data.known_future=[wind, wind]"],
         "override 'data.known_future=[wind, wind]': data.known_future names 'wind' twice"),
        (["train", config, "data.path=" + inside_data, "train.run_dir=" + inside, "--overwrite"],
         "data.path '%s' is a file the run writes in its directory" % inside_data),
        (["train", config, "train.precision=fp8"],
         "override 'train.precision=fp8': train.precision must be auto, fp32, bf16 or fp16"),
        # An override longer than a file name may be is still an override.
        (["train", config, "model.hidden=" + "[" * 1000],
         "not valid YAML: nests deeper than 64 levels; a config is far shallower"),
        # An output that cannot be written is refused before the work, not after it.
        (["predict", forecast, "--input", weather, "--output", work],
         "--output: %s is a folder; give a file to write" % work),
        (["predict", forecast, "--input", weather, "--output", os.path.join(work, "no/p.csv")],
         "there is no folder %s to write it in" % os.path.join(work, "no")),
        (["predict", forecast, "--input", weather, "--output", os.path.join(work, "p.JSON")],
         "predict writes CSV, not json; give a .csv file, or - for standard output"),
        (["bench", "W1", "--steps", "1", "--json", work], "bench: --json: %s is a folder" % work),
        (["train", config, "--profile", work], "train: --profile: %s is a folder" % work),
        (["tokenizer", "train", text, "--vocab-size", "300", "-o", work],
         "tokenizer train: -o: %s is a folder" % work),
        # Nor is one that would replace a file the command reads.
        (["tokenizer", "train", text, "--vocab-size", "300", "-o", text],
         "tokenizer train: -o: %s is the text it trains on: writing it would replace it" % text),
        (["tune", "--report", sqlite_db, "--html", sqlite_db],
         "tune: --html: %s is the study: writing it would replace it" % sqlite_db),
        (["train", config, "data.path=" + data_copy, "--profile=" + data_copy],
         "train: --profile: %s is the data file: writing it would replace it" % data_copy),
        (["tune", "--report", sqlite_db, "--html", os.path.join(work, "no/r.html")],
         "tune: --html: %s: there is no folder %s to write it in" %
         (os.path.join(work, "no/r.html"), os.path.join(work, "no"))),
        (["tune", os.path.join(root, "examples/configs/weather_tune.yaml"),
          "tune.space.optim.lr.low=-1"],
         "(as the tune.* overrides leave it): tune.space.optim.lr: log needs low > 0, got -1"),
        (["train", os.path.join(root, "examples/configs/shakespeare_charlm.yaml"),
          "data.path=" + text, "model.bidirectional=true",
          "train.run_dir=" + os.path.join(work, "bidirectional_charlm")],
         "model.bidirectional: a character model predicts each character from those before it"),
        (["tune", bad_space], "bad_space.yaml: tune.space.model.hidden.low: -4 makes no valid "
                              "trial config: model.hidden must be positive, got -4"),
        # An empty path (a script's unset variable) names no file; it is not "not given".
        (["predict", forecast, "--input", weather, "--output", ""], "--output: an empty path"),
        (["predict", forecast, "--input", ""], "--input: an empty path"),
        (["tune", os.path.join(root, "examples/configs/weather_tune.yaml"), "--study", ""],
         "--study: an empty path"),
        (["generate", charlm, "--seed", "-1"], "--seed: '-1' is not a whole number from 0 to "
                                               "2^64 - 1"),
        # A path the system refuses is named with the system's reason, not a library's words.
        (["eval", os.path.join(work, "a" * 300, "run")], "a" * 300 + "/run: File name too long"),
    ]
    for args, words in cases:
        r = run(*args)
        lines = r.stderr.strip().splitlines()
        if r.returncode == 0:
            fail("%s: exit code 0" % " ".join(args))
        usage = "--help lists the options" in r.stderr
        if r.returncode != (2 if usage else 1):
            fail("%s: exit code %d, expected %d" % (" ".join(args), r.returncode, 2 if usage else 1))
        if "\x1b" in r.stderr or "\t" in r.stderr:
            fail("%s: a control character reached the terminal: %r" % (" ".join(args), r.stderr))
        if len(lines) != 1 or words not in lines[0]:
            fail("%s: expected one line with %r, got:\n%s" % (" ".join(args), words, r.stderr))
        if r.stdout:
            fail("%s: the error came after output:\n%s" % (" ".join(args), r.stdout))
        print("ok: seqforge %s -> %s" % (" ".join(os.path.basename(a) for a in args), lines[0]))
    # A checkpoint named by its bare file name, from its own directory.
    r = subprocess.run([seqforge, "eval", "model.safetensors"], capture_output=True, text=True,
                       cwd=forecast)
    if r.returncode != 0 or "test_loss" not in r.stdout:
        fail("eval model.safetensors in its directory: exit %d\n%s" % (r.returncode, r.stderr))
    if not os.path.exists(inside_data):
        fail("a refused run removed its data file %s" % inside_data)
    # Output that cannot be written (a full disk) is an error, not a success.
    with open("/dev/full", "w") as full:
        r = subprocess.run([seqforge, "predict", forecast, "--input", weather, "--output", "-"],
                           stdout=full, stderr=subprocess.PIPE, text=True, cwd=root)
    if r.returncode == 0 or "cannot write to standard output" not in r.stderr:
        fail("predict to a full disk: exit %d, %r" % (r.returncode, r.stderr))
    print("ok: predict to a full standard output -> %s" % r.stderr.strip().splitlines()[-1])
    # Dropout settings that drop nothing are said at start-up.
    for args, words in [
        (["model.layers=1", "model.dropout=0.2"], "drops between layers and model.layers is 1"),
        (["model.dropout_mode=variational", "model.dropout=0"], "variational but model.dropout is 0"),
    ]:
        r = run("train", config, "--overwrite", "train.run_dir=" + os.path.join(work, "warn"),
                *quick, *args)
        if r.returncode != 0 or ("warning: model." not in r.stdout + r.stderr) or \
                words not in r.stdout + r.stderr:
            fail("%s: expected a warning with %r, got exit %d:\n%s%s" %
                 (" ".join(args), words, r.returncode, r.stdout, r.stderr))
        print("ok: warning for %s" % " ".join(args))
    # A run started from a directory since removed (every path absolute): one line saying so.
    gone = os.path.join(work, "gone")
    os.makedirs(gone)
    r = subprocess.run(["sh", "-c", 'cd "$1" && rmdir "$1" && exec "$2" train "$3" "$4" "$5" "$6"',
                        "sh", gone, seqforge, config, "data.path=" + weather,
                        "train.run_dir=" + os.path.join(work, "from_gone"), quick[0]],
                       capture_output=True, text=True)
    if r.returncode != 1 or "the current directory cannot be read" not in r.stderr:
        fail("train from a removed directory: exit %d\n%s" % (r.returncode, r.stderr))
    print("ok: train from a removed directory -> %s" % r.stderr.strip().splitlines()[-1])
    # OMP_NUM_THREADS far above the CPUs (libgomp crashed starting 100,000 threads) runs one
    # thread per CPU, with a warning where a run prints one.
    many = dict(os.environ, OMP_NUM_THREADS="100000")
    cpus = len(os.sched_getaffinity(0))
    for args in (["diagnose"], ["train", config, "train.run_dir=" + os.path.join(work, "omp"),
                                *quick]):
        r = subprocess.run([seqforge] + args, capture_output=True, text=True, cwd=root, env=many)
        shown = r.stdout + r.stderr
        if r.returncode != 0 or "%d CPUs available to this process" % cpus not in shown or (
                args[0] == "train" and "100000 threads (OMP_NUM_THREADS) on %d CPUs" % cpus
                not in shown):
            fail("OMP_NUM_THREADS=100000 %s: exit %d\n%s" % (args[0], r.returncode, shown))
    print("ok: OMP_NUM_THREADS=100000 runs %d threads" % cpus)
    # An address space limited below 4 GiB (ulimit -v) keeps OpenBLAS out, whose allocator waited
    # for good there, and the run trains on the other GEMM providers. (Not in the sanitizers'
    # build, whose shadow memory takes terabytes of address space; two threads, as a many-core
    # machine's stacks would not fit.)
    sanitized = os.environ.get("SEQFORGE_SANITIZED") == "1" or "ASAN_OPTIONS" in os.environ
    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (1500 << 20, resource.RLIM_INFINITY))
    for args in ([] if sanitized else
                 (["diagnose"], ["train", config, "train.run_dir=" + os.path.join(work, "ulimit"),
                                 *quick])):
        try:
            r = subprocess.run([seqforge] + args, capture_output=True, text=True, cwd=root,
                               preexec_fn=limited, timeout=120,
                               env=dict(os.environ, OMP_NUM_THREADS="2"))
        except subprocess.TimeoutExpired:
            fail("ulimit -v 1500 MB %s: still running after 120 s" % args[0])
        shown = r.stdout + r.stderr
        if r.returncode != 0 or (args[0] == "diagnose" and
                                 "openblas      not loaded: memory is limited to 1500 MB (ulimit -v)"
                                 not in shown):
            fail("ulimit -v 1500 MB %s: exit %d\n%s" % (args[0], r.returncode, shown))
    if not sanitized:
        print("ok: under ulimit -v 1500 MB OpenBLAS stays out and the run trains")
    # A run whose adapters train on a bf16 base is evaluated and merged on a CPU without bf16
    # GEMMs (here: SEQFORGE_MAX_ISA hiding them), the base held in fp32, with a note.
    bf16_base = os.path.join(work, "bf16_base")
    r = run("train", config, "train.run_dir=" + bf16_base, *quick, "train.precision=bf16",
            "adapter.kind=lora", "adapter.base_precision=bf16")
    if r.returncode != 0:
        if "adapter.base_precision bf16 needs bf16 GEMMs" not in r.stderr:
            fail("a run on a bf16 base: exit %d\n%s" % (r.returncode, r.stderr))
        print("ok: a bf16 base without bf16 GEMMs -> %s" % r.stderr.strip())
    else:
        capped = dict(os.environ, SEQFORGE_MAX_ISA="avx2")

        def test_loss(out):
            return float(next(l.split()[1] for l in out.splitlines() if l.startswith("test_loss")))

        full, low = run("eval", bf16_base), subprocess.run(
            [seqforge, "eval", bf16_base], capture_output=True, text=True, cwd=root, env=capped)
        if low.returncode != 0 or "base weights held in fp32" not in low.stderr:
            fail("eval of a bf16 base without bf16 GEMMs: exit %d\n%s" % (low.returncode, low.stderr))
        gap = abs(test_loss(low.stdout) - test_loss(full.stdout)) / test_loss(full.stdout)
        if gap > 0.02:
            fail("eval of a bf16 base in fp32 differs by %.3g from bf16's" % gap)
        merged = subprocess.run([seqforge, "merge", bf16_base, "--output", bf16_base + "_merged"],
                                capture_output=True, text=True, cwd=root, env=capped)
        if merged.returncode != 0:
            fail("merge of a bf16 base without bf16 GEMMs: exit %d\n%s" %
                 (merged.returncode, merged.stderr))
        print("ok: a bf16 base evaluated and merged in fp32 (test loss %.2e apart)" % gap)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
