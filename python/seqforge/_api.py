"""train, load and Run: the command's train, eval, predict and generate on run directories."""
import contextlib
import csv
import fcntl
import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import warnings

import numpy as np
import yaml

from . import _native


def _json_text(value):
    """JSON text with every character as itself (an escaped character beyond U+FFFF would be a
    pair of surrogates, which YAML does not read)."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"seqforge: the config value {text[:80]} is not Unicode text (a lone "
                         f"surrogate {text[e.start]!r})") from None
    return text


def _yaml_value(value):
    """A Python value as the YAML text of an override (JSON is YAML's flow style)."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, float, np.integer, np.floating)):
        return repr(value.item() if hasattr(value, "item") else value)
    if isinstance(value, (str, os.PathLike)):  # quoted: "exp #2", "null" and "on" stay text
        return _json_text(os.fspath(value))
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return _json_text([v.item() if hasattr(v, "item") else v for v in value])
    if isinstance(value, dict):
        return _json_text({str(k): v for k, v in value.items()})
    shown = (f"an array of shape {value.shape}" if isinstance(value, np.ndarray) else
             f"{type(value).__name__} {value!r}"[:80])
    raise TypeError(f"seqforge: cannot give {shown} as a config value")


def _warn(message):
    """A warning shown at the line that called into this package (predict() calls
    predictions(), which warns: the warning is the caller of predict()'s)."""
    frame, level = sys._getframe(1), 2
    here = os.path.dirname(os.path.abspath(__file__))
    while frame is not None and \
            os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level)


class _CoreSchemaLoader(yaml.SafeLoader):
    """YAML 1.2's core schema, as the library reads a config: only true and false are booleans
    (a column named no stays text) and 12:30 is no number."""


_CoreSchemaLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                           "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_CoreSchemaLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_CoreSchemaLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"))
_CoreSchemaLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))
_CoreSchemaLoader.add_constructor(
    "tag:yaml.org,2002:int",
    lambda loader, node: int(loader.construct_scalar(node), 0 if "o" in node.value or "x" in
                             node.value else 10))


def _load_yaml(text):
    return yaml.load(text, Loader=_CoreSchemaLoader)


def _overrides(values, keys, prefix=""):
    """Overrides "key.path=value" from nested dicts ({"train": {"epochs": 3}}) or dotted keys
    ({"train.epochs": 3}); a dict is a value where its key is a config key (data.transform)."""
    out = []
    for key, value in values.items():
        path = prefix + str(key)
        if isinstance(value, dict) and path not in keys:
            out += _overrides(value, keys, path + ".")
        elif path not in keys and any(k.startswith(path + ".") for k in keys):
            raise TypeError(f"seqforge: {path} takes a dict of its keys ({path}={{...}}), not "
                            f"{type(value).__name__} {value!r}"[:200])
        else:
            try:
                out.append(f"{path}={_yaml_value(value)}")
            except TypeError as e:
                raise TypeError(f"{e} (given as {path})") from None
    return out


def _config_source(config):
    """(YAML text or None for a file, its name): a path, YAML text or a dict."""
    if isinstance(config, dict):
        return "", "python"
    if isinstance(config, os.PathLike) or (
            isinstance(config, str) and "\n" not in config and (
                os.path.exists(config) or config.endswith((".yaml", ".yml")))):
        return None, os.fspath(config)
    if isinstance(config, str):
        if ":" not in config and "\n" not in config:
            raise _native.Error(f"{config}: no such config file")
        return config, "python"
    raise TypeError(f"seqforge.train: config is a path, YAML text or a dict, not "
                    f"{type(config).__name__}")


def _sets(text, source, values, key):
    """Whether a config (its YAML text, or its file where text is None) or a setting gives `key`."""
    if any(v.startswith(key + "=") for v in values):
        return True
    try:
        if text is None:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        node = yaml.safe_load(text or "")
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False  # the native side says what is wrong with it
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _holds_a_run(directory):
    metrics = os.path.join(directory, "metrics.jsonl")
    return ((os.path.exists(metrics) and os.path.getsize(metrics) > 0) or
            os.path.exists(os.path.join(directory, "model.safetensors")) or
            os.path.exists(os.path.join(directory, "training_state.safetensors")))


def _training_in(directory):
    """The pid of another process training in `directory` (holding its .lock; 0 before it wrote
    its pid), or None."""
    try:
        fd = os.open(os.path.join(directory, ".lock"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    except BlockingIOError:
        text = os.read(fd, 31).decode(errors="replace").strip()
        return int(text) if text.isdigit() else 0
    finally:
        os.close(fd)


def _new_run_dir(source):
    """runs/<config name>, or the first of runs/<name>-2, -3, ... that holds no run and that no
    other process trains in (as the command line picks it)."""
    stem = os.path.splitext(os.path.basename(source))[0]
    base = os.path.join("runs", stem)
    version = 1
    while True:
        path = base if version == 1 else f"{base}-{version}"
        if not _holds_a_run(path) and _training_in(path) is None:
            return path
        version += 1


def _check_missing(function, missing):
    if missing not in (None, "", "error", "ffill", "interpolate"):
        raise ValueError(f"{function}: missing is \"ffill\", \"interpolate\" or \"error\" (None: "
                         f"as the run trained), got {missing!r}")


def _check_date_order(function, date_order):
    if date_order not in (None, "", "dmy", "mdy"):
        raise ValueError(f"{function}: date_order is \"dmy\" (day first) or \"mdy\" (month first) "
                         f"(None: as the run trained), got {date_order!r}")


def _missing_codes(values):
    """missing_values as the texts --missing-values takes: numbers or strings, one or a list."""
    if values is None:
        return []
    if isinstance(values, (str, bytes, int, float, np.number)):
        values = [values]
    codes = []
    for v in values:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (str, int, float, np.number)):
            raise TypeError(f"missing_values: expected numbers or texts, got {v!r}")
        codes.append(str(v))
    return codes


def _unmasked(array):
    """A numpy masked array's masked cells as NaN: missing values (data.missing says what to do
    with them), never the numbers the mask hides."""
    if isinstance(array, np.ma.MaskedArray):
        if array.dtype.kind not in "iuf":
            return np.asarray(array)  # refused as it is
        return np.ma.filled(array.astype(np.float64), np.nan)
    return array


def _strings_in(value):
    """Every text in a config's section: the column names it mentions, among others."""
    if isinstance(value, dict):
        return {t for v in value.values() for t in _strings_in(v)}
    if isinstance(value, (list, tuple)):
        return {t for v in value for t in _strings_in(v)}
    return {value} if isinstance(value, str) else set()


def _columns_the_run_reads(config):
    """The column names a run's config names, and where it names no features (every column
    is one), those of the file it trained on."""
    settings = config.get("data") or {}
    names = _strings_in(settings)
    path = settings.get("path") or ""
    if not settings.get("features") and path.endswith(".csv") and os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            names |= set(next(csv.reader(f), []))
    return names


def _index_is_data(frame, config):
    """Whether a frame's index is written as a column: a date index, or one the config names
    (a date, series or feature column); other row labels are no data. Without a config, any
    named or non-default index."""
    index = frame.index
    if type(index).__name__ == "RangeIndex" and index.name is None:
        return False
    if config is None:
        return True
    import pandas as pd
    for level in range(index.nlevels):
        values = index.get_level_values(level)
        if pd.api.types.is_datetime64_any_dtype(values) or type(values).__name__ == "PeriodIndex":
            return True
    named = _columns_the_run_reads(config)
    return any(name is not None and str(name) in named for name in index.names)


def _frame_csv(frame, config):
    """A frame as CSV text that reads back as the frame: floats narrower than float64 written
    at their exact values (float16's 315.75, not its shortest text 315.8), a cell with a line
    break quoted (line ends \r\n, so a lone \r is one too), the index where it is data."""
    import pandas as pd
    wider = {}
    for name, dtype in frame.dtypes.items():
        if isinstance(dtype, np.dtype) and dtype.kind == "f" and dtype.itemsize < 8:
            wider[name] = np.float64
        elif isinstance(dtype, pd.api.extensions.ExtensionDtype) and str(dtype) == "Float32":
            wider[name] = "Float64"
    if wider:
        frame = frame.astype(wider)
    index = _index_is_data(frame, config)
    if index:
        columns = {str(c) for c in frame.columns}
        for name in frame.index.names:
            if name is not None and str(name) in columns:
                if frame.index.nlevels == 1 and frame.index.equals(pd.Index(frame[name])):
                    index = False  # set_index(column, drop=False): the column is there already
                    break
                raise _native.Error(f"data: the DataFrame's index '{name}' has the name of one of "
                                    f"its columns: rename one (frame.rename_axis(...)) or drop "
                                    f"the index (frame.reset_index(drop=True))")
    try:
        return frame.to_csv(index=index, lineterminator="\r\n")
    except TypeError:  # pandas before 1.5
        return frame.to_csv(index=index, line_terminator="\r\n")


def _data_payload(data, config=None):
    """(suffix, bytes or a C-contiguous array) of in-memory data; errors for what cannot be.
    `config` (the resolved config, or the run's) tells which of a frame's index is data."""
    data = _unmasked(data)
    if isinstance(data, np.ndarray):
        if data.ndim != 2 or data.dtype.kind not in "iuf":
            cut = (" (windows cut already? pass the series itself, a row per time step: "
                   "seqforge cuts the windows, data.lookback)") if data.ndim == 3 else ""
            dims = f"{data.ndim} dimension{'' if data.ndim == 1 else 's'}"
            raise _native.Error(f"data: expected a 2-D numeric array (rows, columns), got "
                                f"{dims} of {data.dtype}{cut}")
        if data.shape[1] == 0:
            raise _native.Error("data: the array has no columns")
        dtype = np.float32 if data.dtype == np.float32 else np.float64
        return ".npy", np.ascontiguousarray(data, dtype=dtype)
    if type(data).__name__ == "DataFrame":
        if type(data.columns).__name__ == "MultiIndex":
            raise _native.Error(f"data: the DataFrame's columns have {data.columns.nlevels} levels "
                                f"(a MultiIndex): give each column one name, e.g. data.columns = "
                                f"['_'.join(map(str, c)) for c in data.columns]")
        names = [str(c) for c in data.columns]
        twice = next((c for i, c in enumerate(names) if c in names[:i]), None)
        if twice is not None:
            raise _native.Error(f"data: the DataFrame has the column '{twice}' more than once")
        return ".csv", _frame_csv(data, config).encode()
    if isinstance(data, (list, tuple)) and all(isinstance(t, str) for t in data):
        return ".txt", "\n".join(data).encode()
    what = type(data).__name__
    if isinstance(data, (list, tuple)):
        what = (f"a {what} whose item {next(i for i, t in enumerate(data) if not isinstance(t, str))}"
                f" is not a text (rows of numbers: pass np.asarray(rows))")
    raise TypeError(f"seqforge: data is a path, a 2-D numpy array, a pandas DataFrame or a list "
                    f"of texts, not {what}")


def _as_the_run_reads(data, config):
    """`data` as the config's text task reads it. A text model (charlm, or lm on plain text)
    reads texts: a frame of one column or a Series is its texts, not a CSV with a header. A
    text classifier (or lm on data.text_columns) reads a table: a list of texts is its one text
    column."""
    settings = config.get("data") or {}
    task = settings.get("task")
    columns = settings.get("text_columns") or []
    reads_texts = task == "charlm" or (task == "lm" and not columns)
    reads_table = task == "text_classify" or (task == "lm" and bool(columns))
    if not (reads_texts or reads_table) or isinstance(data, (str, os.PathLike)):
        return data
    kind = type(data).__name__
    if isinstance(data, np.ndarray):
        wanted = ("texts (a list of texts or a path)" if reads_texts else
                  f"a table of texts (a DataFrame with the column{'s' if len(columns) > 1 else ''}"
                  f" {', '.join(columns)}, or a path)")
        raise _native.Error(f"data: a {task} run reads {wanted}, not an array")
    if reads_texts and kind in ("DataFrame", "Series"):
        frame = data.to_frame() if kind == "Series" else data
        if frame.shape[1] != 1:
            raise _native.Error(f"data: a {task} run reads texts, and the DataFrame has "
                                f"{frame.shape[1]} columns: give one of them (a Series) or a "
                                f"list of texts")
        texts = frame.iloc[:, 0].tolist()
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise _native.Error(f"data: the {kind}'s row {i} (index {frame.index[i]}) is "
                                    f"{type(text).__name__} {text!r}"[:200] + ", not a text")
        return texts
    if reads_table and isinstance(data, (list, tuple)) and all(isinstance(t, str) for t in data):
        if len(columns) != 1:
            raise _native.Error(f"data: a {task} run reads pairs of texts (the columns "
                                f"{' and '.join(columns)}): give a DataFrame with them")
        import pandas as pd
        return pd.DataFrame({columns[0]: list(data)})
    return data


def _data_file(data, directory, payload=None, config=None):
    """`data` (an array, a data frame or texts) written once into `directory` under a name of its
    content's hash; its path. A path is returned as it is."""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    suffix, content = payload or _data_payload(data, config)
    hashed = content if isinstance(content, bytes) else (
        content.tobytes() + str((content.dtype, content.shape)).encode())
    digest = hashlib.sha256(hashed).hexdigest()[:16]
    os.makedirs(directory, exist_ok=True)
    path = os.path.abspath(os.path.join(directory, f"data-{digest}{suffix}"))
    if not os.path.exists(path):
        partial = f"{path}.tmp.{os.getpid()}-{threading.get_ident()}"  # one per writer
        with open(partial, "wb") as f:
            if isinstance(content, bytes):
                f.write(content)
            else:
                np.save(f, content)
        os.replace(partial, path)
    return path


def _where_in_data(message, path, data):
    """`message` naming the data instead of the file `path` it was written to: a frame's row by
    its position and index label, an array's row."""
    if type(data).__name__ == "DataFrame":
        lines_are_rows = _lines_are_rows(data)

        def row(match, said="the DataFrame's row"):
            r = int(match.group(1)) - 2  # line 1: the header
            if not lines_are_rows or not 0 <= r < len(data):
                return match.group(0)
            return f"{said} {r} (index {data.index[r]})"

        message = re.sub(re.escape(path) + r":(\d+)", row, message)
        message = re.sub(r"at line (\d+)", lambda m: row(m, "at the DataFrame's row"), message)
        return message.replace(path, "the DataFrame")
    if isinstance(data, np.ndarray):
        at_row = re.escape(path) + r": row \d+ \(index (\d+)\)"
        message = re.sub(at_row, r"the array's row \1", message)
        return message.replace(path, "the array").replace("a .npy array's columns", "its columns")
    if isinstance(data, (list, tuple)):
        if not any("\n" in t for t in data):  # line n is the text at n - 1
            message = re.sub(r"at line (\d+)", lambda m: f"in texts[{int(m.group(1)) - 1}]",
                             message)
        return message.replace(path, "the texts")
    return message


def _labels_of_rows(index, rows):
    """A frame's index labels of 1-based row numbers; past its end, a RangeIndex's continued
    (the forecast after the last row), else None; None where the row is none (empty: the time
    after a series' last row, within a frame of several)."""
    positions = rows - 1
    known = ~np.isnan(positions) if positions.dtype.kind == "f" else np.ones(len(positions), bool)
    if type(index).__name__ == "RangeIndex":
        labels = index.start + index.step * np.where(known, positions, 0).astype(np.int64)
        if known.all():
            return labels
        labels = labels.astype(object)
        labels[~known] = None
        return labels
    labels = np.full(len(positions), None, dtype=object)
    at = np.where(known, positions, -1)
    inside = (at >= 0) & (at < len(index))
    labels[inside] = index[at[inside].astype(np.int64)]
    return labels


def _lines_are_rows(frame):
    """Whether each line of the frame's CSV after the header is one row: no text spans lines."""
    texts = [frame[c] for c in frame.columns if frame[c].dtype == object]
    return not any(t.astype(str).str.contains("[\r\n]").any() for t in texts)


def _reworded(error, message):
    """A native error with `message`, of its own type (Diverged stays Diverged); an exception a
    callback raised (a subclass of Error too, maybe) as it is."""
    if type(error) in (_native.Error, _native.Diverged):
        return type(error)(message)
    return error


@contextlib.contextmanager
def _naming_the_data(data, path):
    """Errors raised inside name `data` where they would name the file it was written to."""
    try:
        yield
    except _native.Error as e:
        if isinstance(data, (str, os.PathLike)):
            raise
        raise _reworded(e, _where_in_data(str(e), path, data)) from None


@contextlib.contextmanager
def _naming_the_array(array):
    """Errors raised inside name `array`, read where it is, where they would name the stand-in
    path the library gave it."""
    try:
        yield
    except _native.Error as e:
        message = str(e)
        stand_in = re.search(r"<numpy array \d+>\.npy", message)
        if not stand_in:
            raise
        raise _reworded(e, _where_in_data(message, stand_in.group(0), array)) from None


def _config_parts(config, overrides, sections):
    """(YAML text or None, source, overrides) for the native calls."""
    keys = set(_native.config_keys())
    values = _overrides(sections or {}, keys) + _overrides(overrides or {}, keys)
    text, source = _config_source({} if config is None else config)
    if isinstance(config, dict):
        values = _overrides(config, keys) + values
    return text, source, values


@contextlib.contextmanager
def _settings_named():
    """The library names a value set beside a config file an "override" (the command line's
    word); here it may be a dict's entry, a keyword section or overrides=: a setting."""
    try:
        yield
    except _native.Error as e:
        message = str(e)
        if message.startswith("override '"):
            raise _native.Error("setting '" + message[len("override '"):]) from None
        raise


def resolved_config(config, overrides=None, sections=None):
    """The config train would run (every key, defaults filled in) as nested dicts."""
    with _settings_named():
        return _load_yaml(_native.resolved_config(*_config_parts(config, overrides, sections)))


def _print_line(line):
    sys.stdout.write(line)
    sys.stdout.flush()


class _ProgressBar:
    """A tqdm bar over a run's steps (every epoch's), its postfix the last epoch's losses; the
    run's other lines are written above it."""

    def __init__(self, tqdm, epochs):
        self.tqdm = tqdm
        self.epochs = epochs
        self.bar = None

    def step(self, epoch, done, per_epoch):
        if self.bar is None:
            self.bar = self.tqdm(total=self.epochs * per_epoch, unit="step", dynamic_ncols=True)
        self.bar.n = (epoch - 1) * per_epoch + done
        self.bar.set_description(f"epoch {epoch}", refresh=False)
        self.bar.refresh()

    def log(self, line):
        if line.startswith("epoch ") and self.bar is not None:
            shown = [part for part in line.split("  ") if part.startswith(("train_loss", "val_"))]
            self.bar.set_postfix_str("  ".join(shown[:3]))
        else:
            self.tqdm.write(line.rstrip("\n"), file=sys.stdout)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _progress_bar(progress, log, epochs):
    """A tqdm bar when asked for (progress=True), or by default on a terminal where tqdm is
    installed and the lines go to standard output."""
    if progress == "auto" and not sys.stdout.isatty():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return _ProgressBar(tqdm, epochs)


def train(config=None, data=None, *, overrides=None, resume=None, overwrite=False,
          on_epoch=None, log=_print_line, progress="auto", **sections):
    """Trains as `seqforge train` does and returns the Run.

    config: a YAML file's path, YAML text or a dict ({"data": {"path": ...}, "model": ...}).
    data: the data instead of data.path: a path, a 2-D numpy array (columns "0", "1", ...), a
      pandas DataFrame (named columns; a named or date index is written as a column) or a list
      of texts (charlm, lm); arrays and frames are written once into the run directory.
    overrides / sections: settings over the config, {"train.epochs": 3} or train={"epochs": 3}.
    resume: a run directory to continue from its last saved state.
    on_epoch(epoch, metrics) -> bool: after each epoch; returning False ends the run there.
    log(text): each line the run prints (default: standard output; None: silent).
    progress: a tqdm progress bar (where tqdm is installed) instead of the lines a run prints
      during and after each epoch: True, False, or "auto" (on a terminal).
    """
    if log is not None and not callable(log):
        raise TypeError(f"seqforge.train: log is a function of a line, or None, not "
                        f"{type(log).__name__}")
    if on_epoch is not None and not callable(on_epoch):
        raise TypeError(f"seqforge.train: on_epoch is a function of (epoch, metrics), or None, "
                        f"not {type(on_epoch).__name__}")
    if overrides is not None and not isinstance(overrides, dict):
        raise TypeError(f"seqforge.train: overrides is a dict of keys and values "
                        f"({{\"train.epochs\": 3}}), not {type(overrides).__name__}")
    if progress not in (True, False, "auto"):
        raise ValueError(f"seqforge.train: progress is True, False or \"auto\", not {progress!r}")
    bar = None
    if progress is not False and log is _print_line:
        resolved = resolved_config(
            os.path.join(os.fspath(resume), "config.resolved.yaml") if resume is not None
            else config, overrides, sections)
        bar = _progress_bar(progress, log, resolved["train"]["epochs"])
    with _settings_named():
        if bar is None:
            return _train(config, data, overrides, resume, overwrite, on_epoch, log, None,
                          sections)
        try:
            return _train(config, data, overrides, resume, overwrite, on_epoch, bar.log, bar.step,
                          sections)
        finally:
            bar.close()


def _train(config, data, overrides, resume, overwrite, on_epoch, log, on_step, sections):
    if resume is not None:
        if config is not None or data is not None:
            raise _native.Error(f"resume={resume} continues that run with its own config; drop "
                                "config and data")
        values = _config_parts(None, overrides, sections)[2]
        with _python_words():
            summary = _native.train(None, "", values, resume=os.fspath(resume), log=log,
                                    on_epoch=on_epoch, on_step=on_step)
        return Run(summary["run_dir"], summary)
    text, source, values = _config_parts(config, overrides, sections)
    if data is not None:
        resolved = _load_yaml(_native.resolved_config(text, source, values))
        data = _as_the_run_reads(data, resolved)
        payload = None if isinstance(data, (str, os.PathLike)) else _data_payload(data, resolved)
        run_dir = resolved["train"]["run_dir"] or _new_run_dir(source)
        holder = _training_in(run_dir)  # checked before the data file is written into it
        if holder is not None and holder == os.getpid():
            raise _native.Error(
                f"{run_dir}: in use: another training of this process (pid {holder}, another of "
                "its threads) is training in it; wait for it to end, or give this one another "
                "directory. Nothing in the directory was changed")
        if holder is not None:
            raise _native.Error(
                f"{run_dir}: in use: another seqforge process is training in it ("
                f"{f'pid {holder}' if holder else 'its pid not yet written'} holds "
                f"{os.path.join(run_dir, '.lock')}); wait for it to end or stop it. Nothing in "
                "the directory was changed")
        if _holds_a_run(run_dir) and not overwrite:
            raise _native.Error(f"{run_dir}: holds another run's files; pass overwrite=True to "
                                f"replace them, or resume='{run_dir}' to continue that run")
        path = _data_file(data, run_dir, payload)
        # A frame's missing cells are empty, its text "None" a value (unless the config says).
        if type(data).__name__ == "DataFrame" and not _sets(text, source, values,
                                                              "data.missing_words"):
            values = ["data.missing_words=false"] + values
        values += [f"data.path={_yaml_value(path)}", f"train.run_dir={_yaml_value(run_dir)}"]
        try:
            with _naming_the_data(data, path):
                summary = _native.train(text, source, values, overwrite=overwrite, log=log,
                                        on_epoch=on_epoch, on_step=on_step)
        except _native.Error as e:
            raise _reworded(e, _in_python_words(str(e))) from None
        return Run(summary["run_dir"], summary)
    try:
        summary = _native.train(text, source, values, overwrite=overwrite, log=log,
                                on_epoch=on_epoch, on_step=on_step)
    except _native.Error as e:
        raise _reworded(e, _in_python_words(str(e))) from None
    return Run(summary["run_dir"], summary)


def _in_python_words(message):
    """The command's options in an error as the package's arguments."""
    message = re.sub(r"or --resume (.+) to continue that run",
                     lambda m: f"or resume='{m.group(1)}' to continue that run", message)
    message = message.replace("pass --overwrite", "pass overwrite=True")
    message = message.replace("anew with --overwrite", "anew with overwrite=True")
    message = re.sub(r"^--missing-values:", "missing_values:", message)
    message = re.sub(r"^--(missing|data|split|prompt):", r"\1:", message)
    message = message.replace("(eval and predict: --date-order)", "(evaluate and predict: date_order=)")
    message = re.sub(r"--missing (\w+) or (\w+)", r"missing='\1' or '\2'", message)
    return message.replace("; use --split", "; leave data out and name a split")


@contextlib.contextmanager
def _python_words():
    """Errors raised inside in the package's words (_in_python_words)."""
    try:
        yield
    except _native.Error as e:
        raise _reworded(e, _in_python_words(str(e))) from None


def load(run_dir):
    """The Run in a run directory (as written by train)."""
    if not os.path.exists(os.path.join(run_dir, "config.resolved.yaml")):
        raise _native.Error(f"{run_dir}: not a run directory (no config.resolved.yaml)")
    return Run(run_dir)


class Run:
    """A trained run: its directory, config and metrics, and what can be done with its model."""

    def __init__(self, path, summary=None):
        self.path = os.fspath(path)
        self.summary = summary

    def __repr__(self):
        return f"seqforge.Run({self.path!r})"

    @property
    def config(self):
        """The resolved config (every key, defaults filled in) as nested dicts."""
        with open(os.path.join(self.path, "config.resolved.yaml"), encoding="utf-8") as f:
            return _load_yaml(f)

    @property
    def metrics(self):
        """metrics.jsonl's rows: one dict per epoch."""
        path = os.path.join(self.path, "metrics.jsonl")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        rows = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines):  # the last, with no newline: being written, or cut short
                    continue
                raise _native.Error(f"{path}:{number}: not a line of metrics (one JSON object): "
                                    f"{line[:60]!r}") from None
        return rows

    def evaluate(self, split="test", data=None, missing=None, missing_values=None,
                 date_order=None):
        """Metrics on a split of the run's data ("val" or "test"), or on every window of `data`
        (a path, array or data frame of the training data's layout; for a language model, a
        path or a list of texts, scored a whole sequence at a time); `missing` ("ffill" or
        "interpolate") fills that data's missing cells, as eval's --missing,
        `missing_values` (a list of numbers or texts) marks more cells missing, as
        --missing-values, and `date_order` ("dmy" or "mdy") reads its dates as --date-order."""
        if split not in ("val", "test"):
            raise ValueError(f"evaluate: split is \"val\" or \"test\", got {split!r}")
        codes = _missing_codes(missing_values)
        _check_missing("evaluate", missing)
        _check_date_order("evaluate", date_order)
        if data is None:
            if missing or codes or date_order:
                raise ValueError("evaluate: missing, missing_values and date_order read `data`; "
                                 "a split of the run's own data is read as it trained")
            metrics, notes = _native.evaluate(self.path, split, "", "", [])
        elif isinstance(data := _as_the_run_reads(_unmasked(data), config := self.config),
                        np.ndarray):
            with _python_words(), _naming_the_array(data):
                metrics, notes = _native.evaluate_array(self.path, data, missing or "", codes)
            notes = [re.sub(r"<numpy array \d+>\.npy", "the array", n) for n in notes]
        else:
            with tempfile.TemporaryDirectory(prefix="seqforge-") as scratch:
                path = _data_file(data, scratch, config=config)
                with _python_words(), _naming_the_data(data, path):
                    metrics, notes = _native.evaluate(self.path, split, path, missing or "",
                                                      codes, date_order or "")
            notes = [_where_in_data(n, path, data) for n in notes]
        for note in notes:  # what eval prints as "note:" lines
            _warn(_in_python_words(note))
        return metrics

    def predictions(self, X, last=False, missing=None, missing_values=None, date_order=None):
        """predict's table for the windows of `X` (a path, array or data frame of the training
        data's layout): {column: values}, numbers as float64 arrays over the library's own
        buffers (NaN: empty), text as object arrays, in the command's column order. A float32
        or float64 array in C order is read where it is. `missing` ("ffill" or "interpolate")
        fills X's missing cells, as predict's --missing; `missing_values` (a list of numbers
        or texts) marks more cells missing, as --missing-values; `date_order` ("dmy" or "mdy")
        reads X's dates as --date-order."""
        if not isinstance(last, (bool, np.bool_)):
            raise TypeError(f"predictions: last is True or False, not {type(last).__name__} "
                            f"{last!r}"[:120])
        codes = _missing_codes(missing_values)
        _check_missing("predictions", missing)
        _check_date_order("predictions", date_order)
        config = self.config
        X = _as_the_run_reads(_unmasked(X), config)
        if isinstance(X, np.ndarray):  # read where it is, not copied
            with _python_words(), _naming_the_array(X):
                table = _native.predictions_of_array(self.path, X, last, missing or "", codes)
            notes = [re.sub(r"<numpy array \d+>\.npy", "the array", n) for n in table["notes"]]
        else:
            with tempfile.TemporaryDirectory(prefix="seqforge-") as scratch:
                path = _data_file(X, scratch, config=config)
                with _python_words(), _naming_the_data(X, path):
                    table = _native.predictions(self.path, path, last, missing or "", codes,
                                                date_order or "")
            notes = [_where_in_data(n, path, X) for n in table["notes"]]
        for note in notes:  # what predict prints as "note:" lines
            _warn(_in_python_words(note))
        return {name: values if kind != "text" else np.array(values, dtype=object)
                for name, kind, values in table["columns"]}

    def predict(self, X, last=False, missing=None, missing_values=None, date_order=None):
        """Predictions for every window of `X` (or only each series' last with last=True); see
        predictions() for `missing`, `missing_values` and `date_order`.

        A data frame or a path gives a pandas DataFrame with the command's columns. An array
        gives an array: a forecast's values (windows, outputs), or (windows, steps, outputs)
        for several steps ahead (data.horizon, direct), an axis of one output squeezed away; or
        a classifier's classes."""
        X = _as_the_run_reads(_unmasked(X), self.config)
        table = self.predictions(X, last, missing, missing_values, date_order)
        if isinstance(X, np.ndarray):
            return self._as_array(table)
        import pandas as pd
        frame = pd.DataFrame(table)
        if type(X).__name__ == "DataFrame":
            # A text classifier's rows by the file's line: the frame's own index instead.
            if "line" in frame and _lines_are_rows(X):
                frame.index = X.index[frame.pop("line").to_numpy().astype(np.int64) - 2]
            # Windows without dates are named by their 1-based rows: the frame's labels instead.
            for column in ("window_end", "forecast_for"):
                if column in frame and frame[column].dtype.kind in "if":
                    frame[column] = _labels_of_rows(X.index, frame[column].to_numpy())
        return frame

    def predict_last(self, X):
        """The forecast after the last row of each series of `X`."""
        return self.predict(X, last=True)

    def predict_proba(self, X):
        """A classifier's probabilities per window of `X`: (windows, classes), in the order of
        predict's p_<class> columns (the run's order of its classes)."""
        table = self.predictions(X)
        columns = [name for name in table if name.startswith("p_")]
        if not columns:
            raise _native.Error(f"{self.path}: predict_proba needs a classifier")
        return np.stack([table[name] for name in columns], axis=1)

    @staticmethod
    def _as_array(table):
        if "class" in table:
            return table["class"]
        skip = {"series", "window_end", "forecast_for", "step", "line"}
        columns = [name for name in table if name not in skip and not name.endswith("_actual")]
        values = (table[columns[0]] if len(columns) == 1 else
                  np.stack([table[name] for name in columns], axis=1))
        if "step" in table:  # a row per window and step ahead, the steps of a window together
            steps = int(table["step"].max()) if len(table["step"]) else 1
            values = values.reshape((-1, steps) + values.shape[1:])
        return values

    def merge(self, output):
        """Folds the run's LoRA or DoRA adapters into its weights (as `seqforge merge`): a plain
        checkpoint at `output` (a decoder run: a Hugging Face folder). Returns the Linears
        merged."""
        return _native.merge(self.path, os.fspath(output))

    def generate(self, prompt="", length=200, temperature=1.0, top_k=None, top_p=1.0, seed=0,
                 stream=None):
        """Text sampled from a language model after `prompt` (as `seqforge generate`).
        stream(text), where given, sees the text as it is made (the prompt first): the pieces
        join into the returned text; an exception it raises ends the sampling."""
        if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
            raise ValueError(f"generate: seed must be a whole number from 0 to 2**64 - 1, got "
                             f"{seed!r}")
        if not isinstance(prompt, str):
            raise TypeError(f"generate: prompt is text (str), not {type(prompt).__name__}")
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"generate: the prompt is not Unicode text at character {e.start} "
                             f"(a lone surrogate {prompt[e.start]!r})") from None
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) \
                or not 0 <= length <= 2**40:
            raise ValueError(f"generate: length must be a whole number from 0 to 2**40, got "
                             f"{length!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                                  or not 0 < top_k < 2**63):
            raise ValueError(f"generate: top_k must be a positive whole number (None: sample among "
                             f"all), got {top_k!r}")
        for name, value in (("temperature", temperature), ("top_p", top_p)):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                                 np.floating)):
                raise TypeError(f"generate: {name} is a number, not {type(value).__name__}")
        if stream is not None and not callable(stream):
            raise TypeError(f"generate: stream is a function of the text, or None, not "
                            f"{type(stream).__name__}")
        with _python_words():
            return _native.generate(self.path, prompt, int(length), float(temperature),
                                    int(top_k or 0), int(seed), float(top_p), stream)
