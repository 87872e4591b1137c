"""scikit-learn estimators over seqforge's recurrent models.

X holds one window per sample:
  3-D (samples, steps, features): each sample a window of `steps` rows of `features` values;
  2-D (samples, steps): a univariate window per sample (one feature), as sktime reads 2-D input.
The regressor predicts y (samples,) or (samples, targets) after the window; the classifier the
sample's class. Samples are independent: they are dealt to the training and validation parts at
random (validation_fraction), and each fit trains a fresh model in a run directory of its own
(`run_dir`, else a temporary one removed with the estimator; pickling keeps the model).
"""
import hashlib
import os
import shutil
import tempfile
import weakref

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.exceptions import NotFittedError
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from . import _api

# The files a fitted estimator keeps when pickled: enough to predict.
_MODEL_FILES = ("config.resolved.yaml", "model.safetensors")

# Config keys the estimator's parameters set: config may not set them behind get_params' back.
_PARAMETER_KEYS = {"model.cell": "cell", "model.hidden": "hidden", "model.layers": "layers",
                   "model.dropout": "dropout", "optim.lr": "lr",
                   "optim.weight_decay": "weight_decay", "train.epochs": "epochs",
                   "train.batch_size": "batch_size", "train.early_stopping.patience": "patience",
                   "train.seed": "random_state", "train.threads": "threads"}
# Keys the estimator sets from X and y: another value would cut other windows than its samples.
_OWN_KEYS = ("data.path", "data.task", "data.series_column", "data.features", "data.targets",
             "data.class_column", "data.lookback", "data.horizon", "data.horizon_mode",
             "data.stride", "data.date_column", "data.split.mode", "data.split.train",
             "data.split.val", "train.run_dir")


def _fingerprint(run_dir):
    """What tells the model in `run_dir` from another fit's: its files' bytes."""
    digest = hashlib.sha256()
    for name in _MODEL_FILES:
        with open(os.path.join(run_dir, name), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def _as_windows(X):
    """(samples, steps, features) float64 from 2-D or 3-D X."""
    return X[:, :, None] if X.ndim == 2 else X


def _series_frame(windows, targets=None, classes=None):
    """The windows as one file of several series, one per sample (named so that their order is
    the samples' order): `steps` rows each, plus a row carrying a regression target."""
    import pandas as pd
    n, T, F = windows.shape
    extra = 1 if targets is not None else 0
    rows = np.empty((n, T + extra, F))
    rows[:, :T] = windows
    if extra:
        rows[:, T] = windows[:, T - 1]  # the target's row: its features are no window's input
    columns = {"series": np.repeat([f"s{i:09d}" for i in range(n)], T + extra)}
    for f in range(F):
        columns[f"x{f}"] = rows[:, :, f].ravel()
    if targets is not None:
        for j in range(targets.shape[1]):
            columns[f"y{j}"] = np.repeat(targets[:, j], T + extra)
    if classes is not None:
        columns["label"] = np.repeat([f"c{k:09d}" for k in classes], T)
    return pd.DataFrame(columns)


class _Estimator(BaseEstimator):
    def __init__(self, cell="lstm", hidden=64, layers=1, dropout=0.0, epochs=30, batch_size=32,
                 lr=0.003, weight_decay=0.0, validation_fraction=0.0, patience=0,
                 random_state=0, threads=0, config=None, run_dir=None, verbose=False):
        self.cell = cell
        self.hidden = hidden
        self.layers = layers
        self.dropout = dropout
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.validation_fraction = validation_fraction
        self.patience = patience
        self.random_state = random_state
        self.threads = threads
        self.config = config
        self.run_dir = run_dir
        self.verbose = verbose

    def _settings(self, n, T, F):
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got "
                             f"{self.validation_fraction}")
        val = self.validation_fraction if round(n * self.validation_fraction) >= 1 else 0.0
        if self.validation_fraction and not val:
            _api._warn(f"validation_fraction={self.validation_fraction} of {n} samples holds "
                       f"no sample: training without validation (patience does nothing)")
        # An int is the seed; a RandomState (or None: numpy's global one) draws it.
        seed = (self.random_state if isinstance(self.random_state, (int, np.integer)) else
                check_random_state(self.random_state).randint(2**31))
        settings = {
            "data.series_column": "series",
            "data.features": [f"x{f}" for f in range(F)], "data.lookback": T,
            "data.split.mode": "random", "data.split.train": 1.0 - val,
            "data.split.val": val,
            "model.cell": self.cell, "model.hidden": self.hidden, "model.layers": self.layers,
            "model.dropout": self.dropout,
            "optim.lr": self.lr, "optim.weight_decay": self.weight_decay,
            "train.epochs": self.epochs, "train.batch_size": self.batch_size,
            "train.early_stopping.patience": self.patience if val else 0,
            "train.save": "best" if val else "last", "train.test_after": False,
            "train.seed": int(seed), "train.threads": self.threads, "train.progress_seconds": 0,
        }
        config = self.config or {}
        if not isinstance(config, dict):
            raise TypeError(f"config: a dict of settings ({{\"train.loss\": \"mae\"}}, or sections "
                            f"{{\"train\": {{\"loss\": \"mae\"}}}}), not {type(config).__name__}")
        flat = _api._overrides(config, set(_api._native.config_keys()))
        for key, value in (o.split("=", 1) for o in flat):
            if key in _OWN_KEYS:
                raise ValueError(f"config: {key} is the estimator's own (set from X and y: one "
                                 f"window per sample); leave it out")
            if key in _PARAMETER_KEYS:
                raise ValueError(f"config: {key} is the estimator's parameter "
                                 f"{_PARAMETER_KEYS[key]}; set it there (so that get_params, "
                                 f"clone and searches see it)")
            if key == "train.loss" and value.strip().strip("\"'") == "quantile":
                raise ValueError("config: train.loss quantile forecasts several values per "
                                 "target; the estimator predicts one (train quantile models with "
                                 "seqforge.train)")
            if key.startswith("data.transform") and any(
                    kind in value for kind in ("diff", "log_return", "pct_change")):
                raise ValueError(f"config: {key}={value}: a differencing transform reads a "
                                 f"series' earlier rows; each sample here is a window of its own")
            if key == "data.normalize_per" and value.strip().strip("\"'") == "series":
                raise ValueError("config: data.normalize_per series keeps a scaler per series, "
                                 "and each sample here is one: a new sample would be scaled by "
                                 "the scaler of the training sample at its position")
            if key == "data.known_future" and value.strip() not in ("[]", ""):
                raise ValueError("config: data.known_future reads values of the rows after a "
                                 "window; a sample here is the window alone")
        settings.update(config)
        return settings

    def _train(self, frame, settings):
        run_dir = self.run_dir
        if run_dir is None:
            if getattr(self, "_cleanup", None) is not None:
                self._cleanup()  # the last fit's model: this fit replaces it
            run_dir = tempfile.mkdtemp(prefix="seqforge-estimator-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, run_dir, True)
        settings["train.run_dir"] = run_dir
        log = _api._print_line if self.verbose else None
        self.run_ = _api.train({}, data=frame, overrides=settings, overwrite=True, log=log)
        self._model_fingerprint = _fingerprint(self.run_.path)

    def _forget(self):
        """Before a fit: the last fit's model is no longer this estimator's, whether or not this
        one succeeds (a fit refused half-way leaves no model under new data's classes)."""
        self.run_ = None
        self._single = False

    def _check_X(self, X):
        try:
            X = self._validate_data(X, reset=False, allow_nd=True, dtype=np.float64)
        except ValueError as e:
            # sklearn's check counts a window's steps as "features": name the window instead.
            shape = np.asarray(X).shape if "features, but" in str(e) else ()
            if len(shape) not in (2, 3):
                raise
            self._check_window(shape)
            raise
        if X.ndim not in (2, 3):
            raise ValueError(f"expected X of 2 dimensions (samples, steps) or 3 (samples, steps, "
                             f"features), got {X.ndim}")
        self._check_window(X.shape)
        return _as_windows(X)

    def _check_window(self, shape):
        window = tuple(shape[1:]) + ((1,) if len(shape) == 2 else ())
        if window != tuple(self.window_shape_):
            one = " (2-D X: one feature per step)" if len(shape) == 2 else ""
            raise ValueError(f"X has windows of shape {window}{one}, the estimator was fitted "
                             f"on {tuple(self.window_shape_)}") from None

    def _check_X_y(self, X, y, **kwargs):
        X, y = self._validate_data(X, y, allow_nd=True, dtype=np.float64, **kwargs)
        if X.ndim not in (2, 3):
            raise ValueError(f"expected X of 2 dimensions (samples, steps) or 3 (samples, steps, "
                             f"features), got {X.ndim}")
        return _as_windows(X), y

    def _table(self, X):
        check_is_fitted(self, "run_")
        if self.run_ is None:
            raise NotFittedError("the last fit failed: fit again")
        if _fingerprint(self.run_.path) != self._model_fingerprint:
            raise RuntimeError(f"{self.run_.path} holds another fit's model now (estimators "
                               f"given one run_dir?): fit again, or give each its own run_dir")
        windows = self._check_X(X)
        with tempfile.TemporaryDirectory(prefix="seqforge-") as scratch:
            path = _api._data_file(_series_frame(windows), scratch)
            return self.run_.predictions(path)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_cleanup", None)
        if state.get("run_") is not None:
            files = {}
            for name in _MODEL_FILES:
                with open(os.path.join(self.run_.path, name), "rb") as f:
                    files[name] = f.read()
            state["run_"] = files
        return state

    def __setstate__(self, state):
        files = state.pop("run_", None)
        self.__dict__.update(state)
        if files is not None:
            run_dir = tempfile.mkdtemp(prefix="seqforge-estimator-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, run_dir, True)
            for name, content in files.items():
                with open(os.path.join(run_dir, name), "wb") as f:
                    f.write(content)
            self.run_ = _api.Run(run_dir)
            self._model_fingerprint = _fingerprint(run_dir)

    def _more_tags(self):
        return {"allow_nan": False, "poor_score": True, "non_deterministic": False}


class SeqForgeRegressor(RegressorMixin, _Estimator):
    """A recurrent regressor: y (samples,) or (samples, targets) from a window per sample."""

    def _more_tags(self):
        return {**super()._more_tags(), "multioutput": True}

    def fit(self, X, y):
        self._forget()
        windows, y = self._check_X_y(X, y, multi_output=True, y_numeric=True)
        settings = self._settings(*windows.shape)
        self.window_shape_ = windows.shape[1:]
        self._y_shape = y.shape[1:]
        targets = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
        settings.update({"data.task": "forecast", "data.horizon": 1,
                         "data.targets": [f"y{j}" for j in range(targets.shape[1])]})
        self._train(_series_frame(windows, targets=targets), settings)
        return self

    def predict(self, X):
        table = self._table(X)
        order = np.argsort(table["series"])
        n_targets = int(np.prod(self._y_shape)) if self._y_shape else 1
        out = np.stack([table[f"y{j}"][order] for j in range(n_targets)], axis=1)
        return out.reshape((-1,) + tuple(self._y_shape))


class SeqForgeClassifier(ClassifierMixin, _Estimator):
    """A recurrent classifier: a class per window (classes_ as y gave them, sorted)."""

    def fit(self, X, y):
        self._forget()
        windows, y = self._check_X_y(X, y)
        check_classification_targets(y)
        settings = self._settings(*windows.shape)
        self.classes_, codes = np.unique(y, return_inverse=True)
        self.window_shape_ = windows.shape[1:]
        settings.update({"data.task": "classify", "data.horizon": 0,
                         "data.class_column": "label"})
        self._single = len(self.classes_) == 1
        if self._single:  # nothing to learn: that class, always
            self.run_ = None
            return self
        self._train(_series_frame(windows, classes=codes), settings)
        return self

    def predict_proba(self, X):
        check_is_fitted(self, "classes_")
        if self._single:
            windows = self._check_X(X)
            return np.ones((windows.shape[0], 1))
        table = self._table(X)
        order = np.argsort(table["series"])
        # Classes the training part lacked have no column: probability 0.
        proba = np.zeros((len(order), len(self.classes_)))
        for k in range(len(self.classes_)):
            name = f"p_c{k:09d}"
            if name in table:
                proba[:, k] = table[name][order]
        return proba

    def predict(self, X):
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]
