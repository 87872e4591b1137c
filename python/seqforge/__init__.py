"""seqforge from Python: train, evaluate, predict and generate with the same engine, configs and
run directories as the `seqforge` command.

    import seqforge
    run = seqforge.train("examples/configs/weather_forecast.yaml", train={"epochs": 3})
    run.metrics[-1]["val_loss"]
    frame = run.predict("data/seattle_weather.csv")

Errors are `seqforge.Error` with the command's one-line message (`seqforge.Diverged`, one of them,
when the training loss, gradient or model stops being finite); Ctrl-C during training saves the
run's state and raises KeyboardInterrupt (resume with `seqforge.train(resume=run_dir)`).
"""
import os

# OpenMP threads spin only briefly before they sleep, as under the command (which sets this for
# itself): libgomp reads it when it loads, with the native module.
if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "1000"

from . import _native  # noqa: E402
from ._api import Run, load, train  # noqa: E402

Error = _native.Error
Diverged = _native.Diverged
__version__ = _native.version()
__all__ = ["Diverged", "Error", "Run", "load", "train", "__version__"]
