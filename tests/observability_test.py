"""End to end: `seqforge train --profile` on the bundled forecasting and classification examples,
then checks
  - trace.json: trace-event JSON with complete events for each phase and LSTM layer, named
    threads (main, checkpoint writer) and resource counters;
  - metrics.jsonl: the resource monitor's fields on every epoch;
  - report.html, rendered by headless Chromium: the page loads without console errors and its DOM
    holds the drawn curves (SVG polylines with points), the predictions chart (forecast) and the
    confusion matrix (classification). A screenshot is left next to each report.
Chromium (Debian's `chromium`) missing: the report checks are skipped (exit 77).

usage: observability_test.py SEQFORGE SOURCE_DIR WORK_DIR
"""
import json
import os
import re
import shutil
import subprocess
import sys

seqforge, source, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def fail(message):
    raise SystemExit("FAIL: " + message)


def train(name, config, data, *extra):
    run = os.path.join(work, name)
    cmd = [seqforge, "train", os.path.join(source, "examples", "configs", config),
           "train.epochs=2", "train.max_batches=15", "train.run_dir=" + run,
           "data.path=" + os.path.join(source, "data", data), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        fail("%s exited %d:\n%s%s" % (" ".join(cmd), out.returncode, out.stdout, out.stderr))
    return run, out.stdout


def check_trace(run, stdout):
    with open(os.path.join(run, "trace.json")) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    complete = [e for e in events if e["ph"] == "X"]
    names = {e["name"] for e in complete}
    for phase in ["epoch", "train step", "data wait", "forward", "lstm forward L0",
                  "lstm forward L1", "lstm backward L0", "lstm weight gradients L1", "loss",
                  "backward", "head forward", "optimizer", "validation", "checkpoint submit",
                  "checkpoint write"]:
        if phase not in names:
            fail("trace.json has no '%s' event (has %s)" % (phase, sorted(names)))
    for e in complete:
        if not (e["dur"] >= 0 and e["ts"] >= 0 and e["tid"] in threads):
            fail("bad complete event %s" % e)
    writer = {e["tid"] for e in complete if e["name"] == "checkpoint write"}
    if {threads[t] for t in writer} != {"checkpoint writer"}:
        fail("checkpoint writes on threads %s" % [threads[t] for t in writer])
    if "main" not in threads.values():
        fail("no thread named main: %s" % threads)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    if "rss MB" not in counters or not any(c.startswith("cpu %") for c in counters):
        fail("trace.json counters: %s" % counters)
    # The summary table, sorted by total time.
    table = stdout[stdout.index("profile ("):].splitlines()[2:]
    totals = [float(line.split()[-4]) for line in table if re.search(r"%$", line)]
    if len(totals) < 10 or totals != sorted(totals, reverse=True):
        fail("summary table not sorted by total:\n" + "\n".join(table))


def check_metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        lines = [j for j in map(json.loads, filter(str.strip, f)) if "epoch" in j]
    if len(lines) != 2:
        fail("metrics.jsonl has %d lines" % len(lines))
    for j in lines:
        if not (j["cpu_percent"] > 0 and j["rss_mb"] > 1 and j["peak_rss_mb"] >= j["rss_mb"] * 0.99):
            fail("resource fields in %s" % j)


def render(run, chromium):
    page = "file://" + os.path.join(os.path.abspath(run), "report.html")
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--user-data-dir=" + os.path.join(work, "chromium-profile"),
            "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run(base + ["--dump-dom", page], capture_output=True, text=True, timeout=120)
    if dom.returncode != 0:
        fail("chromium --dump-dom exited %d:\n%s" % (dom.returncode, dom.stderr))
    problems = [line for line in dom.stderr.splitlines()
                if "CONSOLE" in line or "Uncaught" in line or "Failed to load" in line]
    if problems:
        fail("console errors while loading %s:\n%s" % (page, "\n".join(problems)))
    shot = os.path.join(run, "report.png")
    subprocess.run(base + ["--window-size=1000,2400", "--screenshot=" + shot, page],
                   capture_output=True, timeout=120)
    if not os.path.exists(shot) or os.path.getsize(shot) < 10000:
        fail("no screenshot of " + page)
    return dom.stdout


def check_curves(dom, run):
    lines = re.findall(r'<polyline class="series" data-series="([^"]*)"[^>]*points="([^"]*)"', dom)
    drawn = {name for name, points in lines if len(points.split()) >= 2}
    for series in ["train", "validation", "samples/s", "lr", "cpu %", "resident"]:
        if series not in drawn:
            fail("%s: no curve '%s' drawn (curves: %s)" % (run, series, sorted(drawn)))


forecast, out = train("forecast", "weather_forecast.yaml", "seattle-weather-hourly-normals.csv",
                      "--profile")
check_trace(forecast, out)
check_metrics(forecast)
classify, _ = train("classify", "weather_classify.yaml", "seattle-weather.csv")
check_metrics(classify)
print("trace.json and metrics.jsonl: ok")

chromium = shutil.which("chromium") or shutil.which("chromium-browser")
if not chromium:
    print("SKIP: chromium is not installed (apt-get install chromium; scripts/install-deps.sh)")
    sys.exit(77)
dom = render(forecast, chromium)
check_curves(dom, forecast)
if "temperature: predicted vs actual" not in dom or "val_rmse" not in dom:
    fail("forecast report without predictions or val_rmse")
dom = render(classify, chromium)
check_curves(dom, classify)
if '<table class="confusion">' not in dom or "val_accuracy" not in dom:
    fail("classification report without a confusion matrix or val_accuracy")
print("report.html in Chromium: ok (screenshots: %s, %s)" % (
    os.path.join(forecast, "report.png"), os.path.join(classify, "report.png")))
