"""The Python package (python/seqforge) against the command: every task through seqforge.train,
arrays and data frames as data, predictions over the library's buffers, the GIL released while
training, Ctrl-C, errors, callbacks, the scikit-learn estimators and the Optuna integration.

Run by ctest with Debian's python3: pytest python_api_test.py, with PYTHONPATH holding the
built package and SEQFORGE the command, SEQFORGE_DATA the repository's data folder."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pandas as pd
import pytest

import seqforge

SEQFORGE = os.environ["SEQFORGE"]
DATA = os.environ["SEQFORGE_DATA"]
HOURLY = os.path.join(DATA, "seattle-weather-hourly-normals.csv")
DAILY = os.path.join(DATA, "seattle-weather.csv")
SHAKESPEARE = os.path.join(DATA, "tinyshakespeare.txt")

FORECAST = {
    "data": {"path": HOURLY, "date_column": "date", "features": ["pressure", "temperature", "wind"],
             "targets": ["temperature"], "lookback": 8, "split": {"train": 0.7, "val": 0.15}},
    "model": {"hidden": 8},
    "train": {"epochs": 2, "batch_size": 32, "max_batches": 6, "threads": 1,
              "progress_seconds": 0},
}
# How long an epoch took and what it used: never part of a comparison.
RESOURCES = ("cpu_percent", "rss_mb", "per_second", "_seconds", "_share")


def without_timing(rows):
    return [{k: v for k, v in row.items() if not k.endswith(RESOURCES)} for row in rows]


def config_file(tmp_path, config):
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return str(path)


def test_forecast_from_a_path_a_frame_and_the_command_agree(tmp_path):
    os.chdir(tmp_path)
    path_run = seqforge.train(FORECAST, train={"run_dir": "a"}, log=None)
    frame = pd.read_csv(HOURLY)
    frame_run = seqforge.train(FORECAST, data=frame, train={"run_dir": "b"}, log=None)
    assert frame_run.config["data"]["path"].startswith(os.path.abspath("b") + "/data-")
    cli = subprocess.run([SEQFORGE, "train", config_file(tmp_path, FORECAST), "train.run_dir=c"],
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    cli_metrics = seqforge.load("c").metrics
    assert len(path_run.metrics) == 3  # two epochs and the test split
    assert without_timing(path_run.metrics) == without_timing(cli_metrics)
    assert without_timing(frame_run.metrics) == without_timing(cli_metrics)
    assert path_run.summary["epochs"] == 2 and path_run.summary["monitor"] == "val_loss"

    assert path_run.evaluate("val")["val_loss"] == pytest.approx(path_run.metrics[1]["val_loss"],
                                                                rel=1e-12)
    predicted = path_run.predict(frame)
    subprocess.run([SEQFORGE, "predict", "c", "--input", HOURLY, "--output", "p.csv"],
                   check=True, capture_output=True)
    expected = pd.read_csv("p.csv")
    assert list(predicted.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(predicted, expected, check_dtype=False)
    last = path_run.predict_last(HOURLY)
    assert len(last) == 1 and np.isnan(last["temperature_actual"][0])
    # predict's notes reach Python as warnings: pressure in Pa where the run trained on hPa.
    with pytest.warns(UserWarning, match="column 'pressure' of .* far outside what the model"):
        path_run.predict(frame.assign(pressure=frame["pressure"] * 100))
    # Shown at the caller's line, whichever method warns: each call's own, none hidden as a repeat.
    pascal = frame.assign(pressure=frame["pressure"] * 100)
    for call in (path_run.predict, path_run.predict_last, path_run.predictions):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("default")
            call(pascal)
        assert seen and all(w.filename == __file__ for w in seen), \
            [(w.filename, w.lineno) for w in seen]
    with pytest.raises(TypeError, match="predictions: last is True or False, not str 'no'"):
        path_run.predict(frame, last="no")
    # A setting beyond the Basic Multilingual Plane, as in a config file.
    emoji = seqforge.train(FORECAST, train={"epochs": 1, "max_batches": 2, "threads": 1,
                                            "run_dir": "run \U0001F600"}, log=None)
    assert emoji.path.endswith("run \U0001F600") and os.path.isdir("run \U0001F600")
    # Columns of two levels are refused, not written as two header lines.
    two_levels = frame.copy()
    two_levels.columns = pd.MultiIndex.from_tuples([("x", c) for c in frame.columns])
    with pytest.raises(seqforge.Error, match="columns have 2 levels"):
        path_run.predict(two_levels)


def test_a_frame_is_read_as_pandas_holds_it(tmp_path):
    os.chdir(tmp_path)
    frame = pd.read_csv(HOURLY)
    numbers = frame[["pressure", "temperature", "wind"]]
    short = {"epochs": 1, "max_batches": 2, "threads": 1}
    undated = dict(FORECAST, data=dict(FORECAST["data"], date_column=""))
    run = seqforge.train(undated, data=numbers, train=dict(short, run_dir="r"), log=None)
    # Floats narrower than float64 at their exact values (float16's 1015.5, not "1016.0").
    half = numbers.astype(np.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run.evaluate(data=half) == run.evaluate(data=half.astype(np.float64))
    # Windows without dates are named by the frame's labels: .loc finds their rows.
    tail = numbers.tail(30)
    p = run.predict(tail)
    assert p["window_end"].iloc[0] == tail.index[7]  # lookback 8
    known = p.dropna(subset=["temperature_actual"])
    assert list(known["temperature_actual"]) == list(tail.loc[known["forecast_for"],
                                                              "temperature"])
    assert p["forecast_for"].iloc[-1] == tail.index[-1] + 1  # after the last row
    # Within a frame of several series the time after a series' last row is no row: None, as the
    # command leaves it empty, not a RangeIndex continued from NaN.
    two = pd.concat([numbers.head(40).assign(site="a"), numbers.tail(40).assign(site="b")],
                    ignore_index=True)
    sites = seqforge.train(dict(undated, data=dict(undated["data"], series_column="site")),
                           data=two, train=dict(short, run_dir="sites"), log=None)
    last = sites.predict_last(two)
    assert list(last["forecast_for"]) == [None, None]
    assert list(last["window_end"]) == [39, 79]
    assert sites.predict(two)["forecast_for"].iloc[-1] is None
    # A named index is no feature unless the config names it; set_index(drop=False) is no
    # second column of that name.
    everything = dict(undated, data=dict(undated["data"], features=[]))
    labelled = seqforge.train(everything, data=numbers.rename_axis("hour"),
                              train=dict(short, run_dir="labelled"), log=None)
    assert labelled.predict(tail.reset_index(drop=True)).shape[0] == p.shape[0]
    dated = seqforge.train(FORECAST, data=frame.set_index("date", drop=False),
                           train=dict(short, run_dir="dated"), log=None)
    assert len(dated.predict(frame.tail(30).set_index("date", drop=False))) > 0
    with pytest.raises(seqforge.Error, match="index 'wind' has the name of one of its columns"):
        dated.predict(frame.tail(30).set_index(pd.Index(range(30), name="wind")))
    # A text cell with a lone carriage return stays one cell of its row.
    tagged = frame.assign(tag=np.where(np.arange(len(frame)) % 2, "a", "b"))
    categorical = dict(FORECAST, data=dict(FORECAST["data"], categorical=["tag"],
                                           features=["pressure", "temperature"]))
    with_tag = seqforge.train(categorical, data=tagged, train=dict(short, run_dir="tag"),
                              log=None)
    odd = tagged.tail(30).reset_index(drop=True)
    odd.loc[3, "tag"] = "x\ry"
    with pytest.warns(UserWarning, match="which the model was not trained on"):
        assert len(with_tag.predict(odd)) == len(with_tag.predict(tagged.tail(30)))
    # A text "None" or "NA" in a frame is a value (a category, a class), a NaN a missing cell.
    worded = frame.assign(tag=np.where(np.arange(len(frame)) % 3, "None", "NA"))
    worded.loc[5, "tag"] = np.nan
    with_words = seqforge.train(categorical, data=worded, train=dict(short, run_dir="words"),
                                log=None)
    with open(os.path.join(with_words.path, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    features = json.loads(header["__metadata__"]["seqforge.features"])
    assert {"tag=NA", "tag=None"} <= set(features), features


def test_arrays_in_and_out(tmp_path):
    os.chdir(tmp_path)
    array = pd.read_csv(HOURLY)[["pressure", "temperature", "wind"]].to_numpy()
    config = {"data": {"features": ["0", "1", "2"], "targets": ["1"], "lookback": 8},
              "model": {"hidden": 8},
              "train": {"epochs": 1, "max_batches": 4, "threads": 1, "run_dir": "arr"}}
    run = seqforge.train(config, data=array, log=None)
    assert run.config["data"]["path"].endswith(".npy")
    y = run.predict(array[:100])
    assert y.shape == (100 - 8 + 1,) and y.dtype == np.float64 and np.isfinite(y).all()
    # The library's buffer, not a copy: the array's base owns the C++ vector.
    assert not y.flags.owndata and type(y.base).__name__ == "PyCapsule"
    # Columns are named by position: one more would rename those after it, so it is refused.
    with pytest.raises(seqforge.Error, match="an array of 4 columns, where the run trained on "
                                             "one of 3"):
        run.predict(np.c_[array[:100, :1], array[:100]])
    # Arrays in are read where they are (no file written): errors name the array.
    np.testing.assert_array_equal(run.predict(np.asfortranarray(array[:100])), y)
    assert np.allclose(run.predict(array[:100].astype(np.float32)), y, rtol=1e-4)
    holed = array[:100].copy()
    holed[50, 1] = np.nan
    with pytest.raises(seqforge.Error, match=r"^the array's row 50, column 1: nan"):
        run.predict(holed)
    with pytest.raises(seqforge.Error, match=r"^the array's row 50, column 1: nan"):
        run.evaluate(data=holed)
    with pytest.raises(seqforge.Error, match=r"^the array: an array of 2 columns, where the run "
                                             r"trained on one of 3"):
        run.predict(array[:100, :2])
    filled = holed.copy()
    filled[50, 1] = holed[49, 1]
    np.testing.assert_array_equal(run.predict(holed, missing="ffill"), run.predict(filled))
    # The missing target is filled as an input, and its window left out of the metrics.
    assert run.evaluate(data=holed, missing="interpolate")["samples"] == 100 - 8 - 1
    # A code the run was not trained with marks a missing cell on request, as --missing-values.
    coded = array[:100].copy()
    coded[50, 1] = -999.0
    for codes in (-999, [-999.0], np.array([-999], dtype=np.float32)):
        np.testing.assert_array_equal(run.predict(coded, missing="ffill", missing_values=codes),
                                      run.predict(filled))
    assert run.evaluate(data=coded, missing="interpolate", missing_values=[-999])["samples"] == 91
    with pytest.raises(TypeError, match=r"missing_values: expected numbers or texts, got True"):
        run.predict(coded, missing_values=[True])
    with pytest.raises(ValueError, match=r"missing, missing_values and date_order read `data`"):
        run.evaluate(missing_values=[-999])
    assert run.evaluate(data=array[:500])["samples"] == 500 - 8
    # The library flushes denormals on its threads; the caller's arithmetic is left as it was.
    assert (np.array([5e-324]) * 2.0)[0] > 0
    table = run.predictions(array[:100])
    assert np.isnan(table["1_actual"][-1]) and table["1_actual"][0] == array[8, 1]
    # The same data written again is the same file; a run directory is not overwritten.
    with pytest.raises(seqforge.Error, match="holds another run's files; pass overwrite=True"):
        seqforge.train(config, data=array, log=None)
    again = seqforge.train(config, data=array, overwrite=True, log=None)
    assert again.config["data"]["path"] == run.config["data"]["path"]
    with pytest.raises(seqforge.Error, match="2-D numeric array .*, got 1 dimension of float"):
        seqforge.train(config, data=array[:, 0], overwrite=True, log=None)
    with pytest.raises(TypeError, match="a list whose item 0 is not a text .*np.asarray"):
        seqforge.train(config, data=array.tolist(), overwrite=True, log=None)
    with pytest.raises(seqforge.Error, match="the DataFrame has the column '1' more than once"):
        seqforge.train(config, data=pd.DataFrame(array, columns=["0", "1", "1"]), overwrite=True,
                       log=None)
    with pytest.raises(seqforge.Error, match="windows cut already"):
        seqforge.train(config, data=array[:96].reshape(8, 12, -1), overwrite=True, log=None)


def test_errors_in_a_frame_or_an_array_name_its_row(tmp_path):
    os.chdir(tmp_path)
    days = pd.date_range("2024-01-01", periods=60, name="day")
    frame = pd.DataFrame({"load": np.arange(60.0)}, index=days)
    frame.iloc[7, 0] = np.nan
    config = {"data": {"targets": ["load"], "lookback": 4, "date_column": "day"},
              "train": {"epochs": 1, "run_dir": "frame"}}
    with pytest.raises(seqforge.Error, match=r"^the DataFrame's row 7 \(index 2024-01-08 00:00:00\): "
                                             r"column 'load': empty cell is not a number"):
        seqforge.train(config, data=frame, log=None)
    array = np.arange(120.0).reshape(60, 2)
    array[9, 1] = np.inf
    with pytest.raises(seqforge.Error, match=r"^the array's row 9, column 1: inf is not a finite"):
        seqforge.train({"data": {"targets": ["0"], "lookback": 4},
                        "train": {"epochs": 1, "run_dir": "array"}}, data=array, log=None)
    # The failed call's copy of the array is the package's, not a stranger's file: the mended
    # array trains in the same directory.
    array[9, 1] = 0.0
    seqforge.train({"data": {"targets": ["0"], "lookback": 4},
                    "train": {"epochs": 1, "run_dir": "array"}}, data=array, log=None)
    run = seqforge.train(config, data=frame.fillna(0.0), log=None, overwrite=True)
    with pytest.raises(seqforge.Error, match=r"^the DataFrame's row 7 \(index 2024-01-08.*"
                                             r"\(missing='ffill' or 'interpolate' fills"):
        run.predict(frame)
    with pytest.raises(ValueError, match="missing is \"ffill\", \"interpolate\" or \"error\""):
        run.predict(frame, missing="zero")
    with pytest.raises(ValueError, match="date_order is \"dmy\" \\(day first\\) or \"mdy\""):
        run.predict(frame, date_order="ymd")
    # Dates written day first, none past the 12th: read as the user says.
    day_first = frame.fillna(0.0).iloc[:12].reset_index()
    day_first["day"] = day_first["day"].dt.strftime("%d/%m/%Y")
    by_order = run.predict(day_first, date_order="dmy")
    assert list(by_order["window_end"])[0] == "2024-01-04"
    # A note about a frame names the frame, not the file it was written to.
    far = frame.fillna(0.0)
    far["load"] += 1e6
    with pytest.warns(UserWarning, match="^column 'load' of the DataFrame averages"):
        run.predict(far)
    # Filled as inputs; a missing target stays unknown in the actual column.
    filled, by_hand = run.predict(frame, missing="ffill"), run.predict(frame.ffill())
    assert np.isnan(filled["load_actual"][3]) and by_hand["load_actual"][3] == 6.0
    pd.testing.assert_frame_equal(filled.drop(columns="load_actual"),
                                  by_hand.drop(columns="load_actual"))


def test_classify_mae_charlm_transformer_and_adapters(tmp_path):
    os.chdir(tmp_path)
    classify = seqforge.train(
        {"data": {"path": DAILY, "task": "classify", "date_column": "date",
                  "class_column": "weather", "features": ["precipitation", "temp_max", "wind"],
                  "lookback": 7},
         "model": {"hidden": 8}, "train": {"epochs": 2, "threads": 1, "run_dir": "cls"}},
        log=None)
    assert 0 <= classify.metrics[-1]["test_accuracy"] <= 1
    frame = pd.read_csv(DAILY)
    proba = classify.predict_proba(frame)
    assert proba.shape[1] == 5 and np.allclose(proba.sum(axis=1), 1, atol=1e-5)
    assert set(classify.predict(frame)["class"]) <= {"drizzle", "fog", "rain", "snow", "sun"}
    # An evaluation with no window left says why, as eval's notes do before its error.
    with pytest.raises(seqforge.Error, match="noted before: .*'RAIN'.*not trained on"):
        classify.evaluate(data=frame.assign(weather=frame["weather"].str.upper()))

    mae = seqforge.train({"data": {"path": HOURLY, "task": "mae", "date_column": "date",
                                   "lookback": 8},
                          "model": {"hidden": 8, "bidirectional": True},
                          "train": {"epochs": 1, "max_batches": 4, "threads": 1,
                                    "run_dir": "mae"}}, log=None)
    assert "test_masked_mse" in mae.evaluate() or "test_loss" in mae.evaluate()

    with open(SHAKESPEARE, encoding="utf-8") as f:
        texts = f.read().split("\n")[:3000]
    gpt = seqforge.train({"data": {"task": "charlm", "seq_len": 32},
                          "model": {"family": "transformer", "embedding": 32, "layers": 1,
                                    "heads": 2},
                          "train": {"epochs": 1, "max_batches": 8, "threads": 1,
                                    "run_dir": "gpt"}}, data=texts, log=None)
    sample = gpt.generate("ROMEO:", length=40, temperature=0, seed=1)
    assert sample.startswith("ROMEO:") and len(sample) == len("ROMEO:") + 40
    pieces = []  # streamed: the prompt, then a character at a time
    assert gpt.generate("ROMEO:", length=40, temperature=0, seed=1, stream=pieces.append) == sample
    assert pieces[0] == "ROMEO:" and len(pieces) == 41 and "".join(pieces) == sample

    def stop(piece):
        if len(piece) == 1:
            raise KeyError("enough")

    with pytest.raises(KeyError, match="enough"):
        gpt.generate("ROMEO:", length=1000, stream=stop)
    with pytest.warns(UserWarning, match="^the texts: its last [0-9]+ characters are not scored"):
        scored = gpt.evaluate(data=texts[:200])  # another text: every whole sequence of it
    assert scored["samples"] == (len("\n".join(texts[:200])) - 1) // 32
    assert 0 < scored["data_loss"] < 10 and scored["data_perplexity"] > 1
    with pytest.raises(seqforge.Error, match="not in the vocabulary of the model"):
        gpt.evaluate(data=["ROMEO: \u00e9t\u00e9"])
    lora = seqforge.train({"data": {"task": "charlm", "seq_len": 32},
                           "model": {"family": "transformer", "init_from": gpt.path},
                           "adapter": {"kind": "lora", "rank": 4},
                           "train": {"epochs": 1, "max_batches": 4, "threads": 1,
                                     "run_dir": "lora"}}, data=texts, log=None)
    assert lora.merge("merged.safetensors") > 0 and os.path.exists("merged.safetensors")

    lstm = seqforge.train({"data": {"task": "charlm", "seq_len": 32}, "model": {"hidden": 16},
                           "train": {"epochs": 1, "max_batches": 4, "threads": 1,
                                     "run_dir": "lstm"}}, data=texts, log=None)
    assert len(lstm.generate("A", length=10, seed=3)) == 11
    # A prompt is read as a training text is: no byte-order mark, "\r\n" as "\n".
    plain = lstm.generate("ROMEO:\nA", length=10, temperature=0)
    assert lstm.generate("\ufeffROMEO:\r\nA", length=10, temperature=0) == plain
    with pytest.raises(seqforge.Error, match=r"character 7 \('\\x09' U\+0009\) is not in"):
        lstm.generate("ROMEO:\t", length=1)
    # A frame of one column, or a Series, is texts; the CSV's header line is no text of them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        as_texts = lstm.evaluate(data=texts[:300])
        assert lstm.evaluate(data=pd.DataFrame({"line": texts[:300]})) == as_texts
        assert lstm.evaluate(data=pd.Series(texts[:300])) == as_texts
    with pytest.raises(seqforge.Error, match="a charlm run reads texts, and the DataFrame has 2"):
        lstm.evaluate(data=pd.DataFrame({"a": texts[:9], "b": texts[:9]}))
    with pytest.raises(seqforge.Error, match="a charlm run reads texts .*, not an array"):
        lstm.evaluate(data=np.zeros((50, 2)))
    # Arguments of the wrong kind or range are one line naming them, as the command's are.
    for bad, error, words in [(dict(length=2.5), ValueError, "length must be a whole number"),
                              (dict(length=10**20), ValueError, "length must be a whole number"),
                              (dict(top_k=0), ValueError, "top_k must be a positive"),
                              (dict(temperature="hot"), TypeError, "temperature is a number"),
                              (dict(prompt=5), TypeError, "prompt is text"),
                              (dict(prompt="\ud800"), ValueError, "lone surrogate"),
                              (dict(stream=5), TypeError, "stream is a function")]:
        with pytest.raises(error, match=words):
            lstm.generate(**dict(dict(prompt="A", length=3), **bad))


def test_a_text_classifier_reads_a_table(tmp_path):
    os.chdir(tmp_path)
    with open(SHAKESPEARE, encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n")[:600] if line.strip()]
    frame = pd.DataFrame({"text": [t.upper() if i % 2 else t.lower() for i, t in enumerate(lines)],
                          "label": ["loud" if i % 2 else "quiet" for i in range(len(lines))]})
    run = seqforge.train({"data": {"task": "text_classify", "text_columns": ["text"],
                                   "class_column": "label", "seq_len": 24},
                          "model": {"family": "transformer", "embedding": 16, "layers": 1,
                                    "heads": 2},
                          "train": {"epochs": 1, "max_batches": 4, "threads": 1,
                                    "run_dir": "tc"}}, data=frame, log=None)
    # A list of texts is the one text column; a frame's rows keep its index.
    texts = ["HELLO THERE", "hello there"]
    framed = pd.DataFrame({"text": texts}, index=["a", "b"])
    by_frame = run.predict(framed)
    assert list(by_frame.index) == ["a", "b"] and "line" not in by_frame
    by_list = run.predict(texts)
    assert list(by_list["class"]) == list(by_frame["class"])
    with pytest.raises(seqforge.Error, match=r"at the DataFrame's row 1 \(index b\)"):
        run.predict(framed.assign(text=["HELLO", "hello \u00a7"]))
    with pytest.raises(seqforge.Error, match="reads a table of texts .*, not an array"):
        run.predict(np.zeros((4, 2)))


def test_errors_are_the_commands_line(tmp_path):
    os.chdir(tmp_path)
    bad = dict(FORECAST, model={"hiden": 8})
    with pytest.raises(seqforge.Error) as caught:
        seqforge.train(config_file(tmp_path, bad), log=None)
    cli = subprocess.run([SEQFORGE, "train", config_file(tmp_path, bad)], capture_output=True,
                         text=True)
    assert cli.returncode == 1
    assert cli.stderr.strip() == f"seqforge: error: {caught.value}"
    assert "did you mean 'model.hidden'" in str(caught.value)
    with pytest.raises(seqforge.Error, match="not a run directory"):
        seqforge.load(tmp_path / "nowhere")
    # The command's options in Python's words.
    seqforge.train(FORECAST, train={"run_dir": "taken", "epochs": 1}, log=None)
    with pytest.raises(seqforge.Error, match="pass overwrite=True to replace them, or "
                                             "resume='.*taken' to continue that run"):
        seqforge.train(FORECAST, train={"run_dir": "taken", "epochs": 1}, log=None)
    with pytest.raises(TypeError, match="cannot give"):
        seqforge.train(FORECAST, train={"epochs": object()})
    # A dict's value is a setting, not an override the user never gave.
    with pytest.raises(seqforge.Error, match="^setting 'model.hidden=-4': model.hidden must be "
                                             "positive"):
        seqforge.train(dict(FORECAST, model={"hidden": -4}), log=None)


def test_a_directory_another_process_trains_in_is_left_alone(tmp_path):
    """A frame's data file is written into a run directory only once no other process trains in
    it; without a run_dir, the next free runs/<name>-N is taken, as the command takes it."""
    import fcntl
    os.chdir(tmp_path)
    frame = pd.read_csv(HOURLY)
    config = config_file(tmp_path, dict(FORECAST, data=dict(FORECAST["data"], path="")))
    held = []
    for directory in ("busy", "runs/config"):
        os.makedirs(directory)
        fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT)
        os.write(fd, b"4242")
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a training process holds it
        held.append(fd)
    with pytest.raises(seqforge.Error, match=r"busy: in use: another seqforge process is training "
                                             r"in it \(pid 4242 holds"):
        seqforge.train(config, data=frame, train={"run_dir": "busy", "epochs": 1}, overwrite=True,
                       log=None)
    assert os.listdir("busy") == [".lock"]
    run = seqforge.train(config, data=frame, train={"epochs": 1}, log=None)
    assert os.path.relpath(run.path) == os.path.join("runs", "config-2")
    assert os.listdir("runs/config") == [".lock"]
    for fd in held:
        os.close(fd)
    # Held by another thread of this very process: said so, not "another process".
    os.makedirs("ours")
    fd = os.open(os.path.join("ours", ".lock"), os.O_RDWR | os.O_CREAT)
    os.write(fd, str(os.getpid()).encode())
    fcntl.flock(fd, fcntl.LOCK_EX)
    for data in (frame, HOURLY):
        with pytest.raises(seqforge.Error, match=r"ours: in use: another training of this process "
                                                 r"\(pid %d, another of its threads\)" % os.getpid()):
            seqforge.train(config, data=data, train={"run_dir": "ours", "epochs": 1},
                           overwrite=True, log=None)
    os.close(fd)


FORK_CHILD = """
import json, os, sys
import seqforge
config = json.loads(sys.argv[1])
seqforge.train(config, train={"run_dir": "two", "threads": 2}, log=None)  # the OpenMP pool
parent = seqforge.train(config, train={"run_dir": "one", "threads": 1}, log=None)
losses = lambda run: [row.get("val_loss") for row in run.metrics]
pid = os.fork()
if pid == 0:
    child = seqforge.train(config, train={"run_dir": "child", "threads": 2}, log=None)
    os._exit(0 if losses(child) == losses(parent) else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_child_forked_after_training_trains_too(tmp_path):
    """multiprocessing's fork start method (os.fork) after the parent trained: the child's OpenMP
    pool did not come with it, and libgomp waited for it for good. It trains on one thread, and
    its numbers are the parent's."""
    os.chdir(tmp_path)
    said = subprocess.run([sys.executable, "-c", FORK_CHILD, json.dumps(FORECAST)],
                          capture_output=True, text=True, timeout=240)
    assert said.returncode == 0 and said.stdout.strip().endswith("child 0"), said.stderr


def test_a_call_leaves_the_callers_openmp_threads_as_they_were(tmp_path):
    """A host sharing the OpenMP runtime (PyTorch with Debian's libgomp) finds its thread count as
    it set it after a training or an evaluation that used another."""
    torch = pytest.importorskip("torch")
    os.chdir(tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run = seqforge.train(FORECAST, train={"run_dir": "one", "threads": 1}, log=None)
        assert torch.get_num_threads() == 2
        run.evaluate()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_callbacks_stop_the_run_and_their_errors_reach_the_caller(tmp_path):
    os.chdir(tmp_path)
    seen = []

    def stop_after_first(epoch, metrics):
        seen.append((epoch, metrics["val_loss"]))
        return False

    run = seqforge.train(FORECAST, train={"epochs": 5, "run_dir": "stop"}, log=None,
                         on_epoch=stop_after_first)
    assert seen == [(1, run.metrics[0]["val_loss"])] and run.summary["stopped"]

    def failing(epoch, metrics):
        raise ValueError("from the callback")

    with pytest.raises(ValueError, match="from the callback"):
        seqforge.train(FORECAST, train={"epochs": 5, "run_dir": "fail"}, log=None,
                       on_epoch=failing)

    # A callback's own kind of seqforge.Error reaches the caller as it was raised.
    class Stop(seqforge.Error):
        def __init__(self, epoch, why):
            super().__init__(why)
            self.epoch = epoch

    def stopping(epoch, metrics):
        raise Stop(epoch, "enough")

    with pytest.raises(Stop) as stopped:
        seqforge.train(FORECAST, train={"epochs": 5, "run_dir": "own"}, log=None,
                       on_epoch=stopping)
    assert stopped.value.epoch == 1
    lines = []
    seqforge.train(FORECAST, train={"run_dir": "log"}, log=lines.append)
    assert any(line.startswith("epoch 2/2") for line in lines)
    # A log function that fails does not end the run; a warning says so once.
    with pytest.warns(RuntimeWarning, match="the log function raised ZeroDivisionError") as warned:
        seqforge.train(FORECAST, train={"run_dir": "bad_log"}, log=lambda line: 1 / 0)
    assert len([w for w in warned if "log function" in str(w.message)]) == 1
    # Callbacks and overrides of the wrong kind are refused before any training.
    with pytest.raises(TypeError, match="on_epoch is a function"):
        seqforge.train(FORECAST, train={"run_dir": "not_callable"}, log=None, on_epoch=5)
    with pytest.raises(TypeError, match="overrides is a dict"):
        seqforge.train(FORECAST, overrides=["train.epochs=1"], log=None)
    assert not os.path.exists("not_callable")


def test_callbacks_compute_with_the_callers_denormals(tmp_path):
    os.chdir(tmp_path)
    tiny = np.array([1e-40], np.float32)  # a float32 denormal, kept unless flushed to zero
    seen = []
    seqforge.train(FORECAST, train={"run_dir": "denormals"}, log=lambda line: None,
                   on_epoch=lambda epoch, metrics: seen.append((tiny * np.float32(1))[0] != 0))
    assert seen == [True, True] and (tiny * np.float32(1))[0] != 0


LOCALE_RUN = """
import json, locale, sys
import seqforge
locale.setlocale(locale.LC_ALL, "de_DE.UTF-8")
config = json.loads(sys.argv[1])
seen = []
run = seqforge.train(config, train={"run_dir": "de"}, log=None,
                     on_epoch=lambda epoch, metrics: seen.append(locale.localeconv()["decimal_point"]))
seqforge.train(resume="cli", train={"epochs": 3}, log=None)
print(json.dumps({"point": locale.localeconv()["decimal_point"], "seen": seen,
                  "metrics": run.metrics, "eval": run.evaluate(),
                  "resumed": seqforge.load("cli").metrics}))
"""


def test_numbers_are_read_and_written_alike_in_any_locale(tmp_path):
    """A program that set a locale writing decimal commas (locale.setlocale, as for a German
    spreadsheet) trains, evaluates and resumes as the command does: the numbers in the files the
    library writes and reads keep C's notation, and its callbacks run in the program's locale."""
    os.chdir(tmp_path)
    locales = tmp_path / "locales"
    locales.mkdir()
    try:
        subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(locales / "de_DE.UTF-8")],
                       capture_output=True, timeout=120)
    except FileNotFoundError:
        pass
    if not (locales / "de_DE.UTF-8").is_dir():
        pytest.skip("no decimal-comma locale to test with: localedef cannot make de_DE.UTF-8 "
                    "(Debian's locales package)")
    config = {**FORECAST, "train": {**FORECAST["train"], "loss": "quantile"}}
    cli = subprocess.run([SEQFORGE, "train", config_file(tmp_path, config), "train.run_dir=cli"],
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    c_run = seqforge.load("cli")
    c_metrics, c_eval = c_run.metrics, c_run.evaluate()
    said = subprocess.run([sys.executable, "-c", LOCALE_RUN, json.dumps(config)],
                          capture_output=True, text=True, env={**os.environ, "LOCPATH": str(locales)})
    assert said.returncode == 0, said.stderr
    out = json.loads(said.stdout.strip().splitlines()[-1])
    assert out["point"] == "," and out["seen"] == [",", ","]
    assert without_timing(out["metrics"]) == without_timing(c_metrics)
    assert out["eval"] == c_eval
    assert [row["epoch"] for row in out["resumed"] if "epoch" in row] == [1, 2, 3]
    with open("de/report.html") as f:
        assert not re.search(r'="[0-9]+,[0-9]', f.read())  # SVG coordinates in C's notation


def test_the_gil_is_released_while_training(tmp_path):
    os.chdir(tmp_path)
    counts = {"during": 0}
    running = threading.Event()
    done = threading.Event()

    def count():
        while not done.is_set():
            if running.is_set():
                counts["during"] += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    calls = []

    def on_epoch(epoch, metrics):
        calls.append(counts["during"])
        return True

    running.set()
    seqforge.train(FORECAST, train={"epochs": 3, "max_batches": 60, "run_dir": "gil"},
                   model={"hidden": 64}, log=None, on_epoch=on_epoch)
    done.set()
    counter.join()
    # The counting thread ran between the epochs' ends, while the library trained.
    assert calls[0] > 5 and calls[2] - calls[0] > 5, calls


def test_ctrl_c_saves_the_run_and_raises_keyboard_interrupt(tmp_path):
    os.chdir(tmp_path)
    settings = {"epochs": 3, "max_batches": 0, "run_dir": "int", "batch_size": 8}
    model = {"hidden": 48}
    full = seqforge.train(FORECAST, train=dict(settings, run_dir="full"), model=model, log=None)
    timer = None

    def interrupt_during_epoch_two(epoch, metrics):
        nonlocal timer
        if epoch == 1:
            timer = threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
        return True

    with pytest.raises(KeyboardInterrupt) as caught:
        seqforge.train(FORECAST, train=settings, model=model, log=None,
                       on_epoch=interrupt_during_epoch_two)
    timer.join()
    message = str(caught.value)
    assert "in epoch 2 after batch" in message, message
    assert message.endswith("/int')") and "continue with: seqforge.train(resume='/" in message
    assert os.path.exists("int/training_state.safetensors")
    resumed = seqforge.train(resume="int", log=None)
    assert resumed.summary["epochs"] == 3
    assert without_timing(resumed.metrics) == without_timing(full.metrics)


def test_a_second_ctrl_c_is_keyboard_interrupt_not_the_interpreters_end(tmp_path):
    script = tmp_path / "twice.py"
    script.write_text(f"""
import os, signal, threading, time, seqforge
config = {json.dumps(FORECAST)}
def twice(epoch, metrics):
    def send():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=send).start()
    return True
try:
    seqforge.train(config, train={{"epochs": 5, "max_batches": 20, "batch_size": 256,
                                   "run_dir": "twice"}}, model={{"hidden": 512}}, log=None,
                   on_epoch=twice)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
print("the interpreter goes on")
""")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ), timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["KeyboardInterrupt", "the", "interpreter", "goes", "on"], r.stdout


def test_ctrl_c_ends_generate_without_a_stream(tmp_path):
    script = tmp_path / "generate.py"
    script.write_text(f"""
import os, signal, threading, time, seqforge
with open({SHAKESPEARE!r}, encoding="utf-8") as f:
    texts = f.read().split("\\n")[:2000]
run = seqforge.train({{"data": {{"task": "charlm", "seq_len": 32}}, "model": {{"hidden": 16}},
                      "train": {{"epochs": 1, "max_batches": 2, "threads": 1, "run_dir": "lm"}}}},
                     data=texts, log=None)
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
start = time.monotonic()
try:
    run.generate("A", length=10**9)
except KeyboardInterrupt:
    print("KeyboardInterrupt", time.monotonic() - start < 30)
""")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["KeyboardInterrupt", "True"], r.stdout + r.stderr


def test_metrics_skip_a_line_being_written_and_name_a_damaged_one(tmp_path):
    os.chdir(tmp_path)
    run = seqforge.train(FORECAST, train={"run_dir": "m", "epochs": 1}, log=None)
    rows = run.metrics
    path = os.path.join(run.path, "metrics.jsonl")
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"epoch": 2, "val_lo')  # a line being written
    assert run.metrics == rows
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n")
    with pytest.raises(seqforge.Error, match=f"^{path}:{len(rows) + 1}: not a line of metrics"):
        run.metrics


def test_estimators_pass_scikit_learns_checks():
    from sklearn.utils.estimator_checks import check_estimator
    from seqforge.sklearn import SeqForgeClassifier, SeqForgeRegressor
    check_estimator(SeqForgeRegressor(epochs=5, threads=1))
    check_estimator(SeqForgeClassifier(epochs=5, threads=1))


def test_estimators_learn_and_work_in_pipelines_and_grid_search():
    import pickle
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer
    from seqforge.sklearn import SeqForgeClassifier, SeqForgeRegressor
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 12, 2))
    y = X[:, :, 0].sum(axis=1) - X[:, -1, 1]
    regressor = SeqForgeRegressor(epochs=25, hidden=16, threads=1).fit(X[:200], y[:200])
    assert regressor.score(X[200:], y[200:]) > 0.9
    two = SeqForgeRegressor(epochs=5, threads=1).fit(X, np.stack([y, -y], axis=1))
    assert two.predict(X[:7]).shape == (7, 2)
    labels = np.where(y > 0, "up", "down")
    pipeline = make_pipeline(FunctionTransformer(np.negative),
                             SeqForgeClassifier(epochs=20, hidden=16, threads=1))
    pipeline.fit(X[:200], labels[:200])
    assert pipeline.score(X[200:], labels[200:]) > 0.85
    restored = pickle.loads(pickle.dumps(pipeline))
    np.testing.assert_array_equal(restored.predict(X[200:]), pipeline.predict(X[200:]))
    search = GridSearchCV(SeqForgeRegressor(epochs=5, threads=1), {"hidden": [4, 16]}, cv=2)
    search.fit(X[:100, :, 0], y[:100])
    assert search.best_params_["hidden"] in (4, 16)
    with pytest.raises(ValueError, match=r"windows of shape \(5, 2\), the estimator was fitted "
                                         r"on \(12, 2\)"):
        regressor.predict(X[:, :5])
    with pytest.raises(ValueError, match=r"windows of shape \(12, 3\)"):
        regressor.predict(np.zeros((4, 12, 3)))


def test_optuna_prunes_as_seqforge_tune_does(tmp_path):
    import optuna
    import seqforge.optuna
    os.chdir(tmp_path)
    study_config = dict(FORECAST, train=dict(FORECAST["train"], epochs=4, max_batches=4), tune={
        "n_trials": 6, "sampler": {"kind": "random", "seed": 3},
        "pruner": {"kind": "median", "n_startup_trials": 2},
        "space": {"optim.lr": {"type": "float", "low": 1e-4, "high": 3e-2, "log": True}}})
    config = config_file(tmp_path, study_config)
    subprocess.run([SEQFORGE, "tune", config, "train.run_dir=tuned"], check=True,
                   capture_output=True)
    tuned = optuna.load_study(study_name=None, storage="sqlite:///tuned/study.db").trials
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="python",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2))
    for trial in tuned:
        study.enqueue_trial(trial.params)
    objective = seqforge.optuna.objective(
        config, {"optim.lr": optuna.distributions.FloatDistribution(1e-4, 3e-2, log=True)})
    study.optimize(objective, n_trials=len(tuned))
    assert [t.state for t in study.trials] == [t.state for t in tuned]
    assert any(t.state == optuna.trial.TrialState.PRUNED for t in tuned)
    for mine, theirs in zip(study.trials, tuned):
        assert mine.intermediate_values == theirs.intermediate_values
        assert mine.value == theirs.value
        assert os.path.exists(os.path.join(mine.user_attrs["run_dir"], "metrics.jsonl"))
        # A pruned run's last epoch says so, as a seqforge tune trial's does.
        with open(os.path.join(mine.user_attrs["run_dir"], "metrics.jsonl")) as f:
            last = [json.loads(line) for line in f if '"epoch"' in line][-1]
        if mine.state == optuna.trial.TrialState.PRUNED:
            assert last["stop"] == "pruned", last
    # The best values again, as optuna's FixedTrial gives them: the same best value.
    best = objective(optuna.trial.FixedTrial(study.best_params))
    assert best == study.best_value


def test_a_diverged_trial_keeps_its_best_epoch_as_seqforge_tune_does(tmp_path):
    import optuna
    import seqforge.optuna
    os.chdir(tmp_path)
    with pytest.raises(seqforge.Diverged, match="lower optim.lr"):
        seqforge.train(FORECAST, optim={"kind": "sgd", "lr": 1e30}, log=None)
    # After two good epochs the rate grows a billionfold or more: each trial diverges in epoch 3.
    study_config = dict(FORECAST, optim={"lr": 1e-3}, train=dict(
        FORECAST["train"], epochs=4, schedule="step", step_epochs=2), tune={
        "n_trials": 2, "sampler": {"kind": "random", "seed": 3},
        "space": {"train.gamma": {"type": "float", "low": 1e9, "high": 1e12, "log": True}}})
    config = config_file(tmp_path, study_config)
    tune = subprocess.run([SEQFORGE, "tune", config, "train.run_dir=tuned"], check=True,
                          capture_output=True, text=True)
    assert "trained anew, this config may diverge again" in tune.stdout, tune.stdout
    with open("tuned/best.yaml") as f:
        assert "diverged after its best epoch, whose checkpoint it kept" in f.readline()
    tuned = optuna.load_study(study_name=None, storage="sqlite:///tuned/study.db").trials
    assert [t.state for t in tuned] == [optuna.trial.TrialState.COMPLETE] * 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="python")
    for trial in tuned:
        study.enqueue_trial(trial.params)
    study.optimize(seqforge.optuna.objective(
        config, {"train.gamma": optuna.distributions.FloatDistribution(1e9, 1e12, log=True)}),
        n_trials=2)
    for mine, theirs in zip(study.trials, tuned):
        assert mine.state == optuna.trial.TrialState.COMPLETE
        assert mine.value == theirs.value
        assert "epoch 3" in mine.user_attrs["diverged"]
    # The kept epoch is the last one with its checkpoint; one that kept no number counts none.
    os.makedirs("kept")
    lines = ['{"epoch": 1, "val_loss": 0.5, "checkpoint": true}',
             '{"epoch": 2, "val_loss": null, "checkpoint": true}', '{"epoch": 3, "val_lo']
    with open("kept/metrics.jsonl", "w") as f:
        f.write("\n".join(lines))
    assert seqforge.optuna._kept_value("kept", "val_loss") is None
    with open("kept/metrics.jsonl", "w") as f:
        f.write("\n".join([lines[0], lines[2]]))
    assert seqforge.optuna._kept_value("kept", "val_loss") == 0.5


def test_a_progress_bar_through_tqdm(tmp_path, capsys):
    pytest.importorskip("tqdm", reason="tqdm is not installed (Debian's python3-tqdm)")
    os.chdir(tmp_path)
    seqforge.train(FORECAST, train={"epochs": 3, "max_batches": 5, "run_dir": "bar"},
                   progress=True)
    out, err = capsys.readouterr()
    assert "15/15" in err and "val_loss" in err, err
    assert "best val_loss" in out and "epoch 1/3" not in out


def test_strings_stay_text_and_a_resume_takes_settings(tmp_path):
    os.chdir(tmp_path)
    # " #" would start a YAML comment, "no" and "null" would read as a boolean and null.
    frame = pd.DataFrame({"no": np.sin(np.arange(300) / 5), "null": np.arange(300) % 7})
    config = {"data": {"features": ["no", "null"], "targets": ["no"], "lookback": 8},
              "model": {"hidden": 8}, "train": {"epochs": 1, "max_batches": 3, "threads": 1}}
    run = seqforge.train(config, data=frame, train={"run_dir": "exp #2"}, log=None)
    assert run.path == str(tmp_path / "exp #2") and run.config["data"]["targets"] == ["no"]
    assert run.config["data"]["features"] == ["no", "null"]
    assert not os.path.exists("exp")
    # A resume takes settings, and refuses those that shape the model.
    more = seqforge.train(resume="exp #2", train={"epochs": 3}, log=None)
    assert [row["epoch"] for row in more.metrics if "epoch" in row] == [1, 2, 3]
    with pytest.raises(seqforge.Error, match="model.hidden cannot change when a run resumes"):
        seqforge.train(resume="exp #2", model={"hidden": 16}, log=None)
    with pytest.raises(TypeError, match="on_epoch must return True, False or None, not str"):
        seqforge.train(config, data=frame, train={"run_dir": "cb"}, log=None,
                       on_epoch=lambda epoch, metrics: "yes")
    # Masked cells are missing values, never the numbers under the mask.
    masked = np.ma.masked_array(frame.to_numpy(), mask=np.zeros(frame.shape, bool))
    masked.mask[100, 0] = True
    with pytest.raises(seqforge.Error, match="the array's row 100"):
        seqforge.train(dict(config, data=dict(config["data"], features=["0", "1"],
                                              targets=["0"])),
                       data=masked, train={"run_dir": "masked"}, log=None)


def test_array_predictions_of_several_steps_have_a_steps_axis(tmp_path):
    os.chdir(tmp_path)
    series = np.sin(np.arange(200) / 4)[:, None]
    run = seqforge.train({"data": {"targets": ["0"], "lookback": 6, "horizon": 3},
                          "model": {"hidden": 8}, "train": {"epochs": 1, "threads": 1}},
                         data=series, train={"run_dir": "steps"}, log=None)
    table = run.predictions(series[:40])
    forecasts = run.predict(series[:40])
    assert forecasts.shape == (40 - 6 + 1, 3)  # the last windows forecast past the end
    np.testing.assert_array_equal(forecasts.ravel(), table["0"])


def test_estimators_guard_their_models(tmp_path):
    import pickle
    from sklearn.exceptions import NotFittedError
    from seqforge.sklearn import SeqForgeClassifier, SeqForgeRegressor
    rng = np.random.default_rng(1)
    X = rng.normal(size=(80, 6, 2))
    y = X.sum(axis=(1, 2))
    shared = str(tmp_path / "shared")
    a = SeqForgeRegressor(epochs=2, threads=1, run_dir=shared).fit(X, y)
    SeqForgeRegressor(epochs=2, threads=1, run_dir=shared).fit(X, -y)
    with pytest.raises(RuntimeError, match="holds another fit's model now"):
        a.predict(X)
    with pytest.raises(ValueError, match="data.lookback is the estimator's own"):
        SeqForgeRegressor(epochs=1, config={"data.lookback": 3}).fit(X, y)
    # A parameter given through config would hide from get_params, clone and searches.
    with pytest.raises(ValueError, match="model.hidden is the estimator's parameter hidden"):
        SeqForgeRegressor(epochs=1, config={"model": {"hidden": 4}}).fit(X, y)
    with pytest.raises(ValueError, match="train.loss quantile"):
        SeqForgeRegressor(epochs=1, config={"train.loss": "quantile"}).fit(X, y)
    with pytest.raises(ValueError, match="a differencing transform"):
        SeqForgeRegressor(epochs=1, config={"data.transform": {"y0": "diff"}}).fit(X, y)
    with pytest.raises(TypeError, match="config: a dict of settings"):
        SeqForgeRegressor(epochs=1, config="train.loss=mae").fit(X, y)

    single = SeqForgeClassifier(epochs=1).fit(X, ["a"] * len(X))
    with pytest.raises(ValueError, match=r"X has windows of shape \(6, 1\) \(2-D X: one feature "
                                         r"per step\), the estimator was fitted on \(6, 2\)"):
        single.predict(X[:, :, 0])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(single)).predict(X[:3]), ["a"] * 3)
    # A window of other steps is named as one, not as sklearn's "features".
    with pytest.raises(ValueError, match=r"X has windows of shape \(8, 2\), the estimator was "
                                         r"fitted on \(6, 2\)"):
        single.predict(rng.normal(size=(4, 8, 2)))
    # Keys a window per sample cannot serve: a scaler per series (each sample is one), values of
    # rows after the window.
    with pytest.raises(ValueError, match="data.normalize_per series keeps a scaler per series"):
        SeqForgeRegressor(epochs=1, config={"data.normalize_per": "series"}).fit(X, y)
    with pytest.raises(ValueError, match="data.known_future reads values of the rows after"):
        SeqForgeRegressor(epochs=1, config={"data.known_future": ["x0"]}).fit(X, y)
    # A refit refused half-way leaves no model: never the old one under the new classes.
    classifier = SeqForgeClassifier(epochs=1, threads=1).fit(X, np.where(y > 0, "cat", "dog"))
    with pytest.raises(ValueError, match="validation_fraction must be in"):
        classifier.set_params(validation_fraction=1.5).fit(X, np.where(y > 0, "x", "y"))
    with pytest.raises(NotFittedError, match="the last fit failed"):
        classifier.predict(X)
