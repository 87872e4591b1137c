"""End to end: `seqforge train --profile` on the bundled forecasting and classification examples,
then checks
  - trace.json: trace-event JSON with complete events for each phase and LSTM layer, named
    threads (main, checkpoint writer) and resource counters;
  - metrics.jsonl: the resource monitor's fields on every epoch;
  - every kind of HTML page (the run report of a forecaster, a classifier, a masked autoencoder
    and a character model, and a study's report), rendered by headless Chromium: each loads
    without console errors and without a single network request (Chromium's net log), refers to
    nothing outside itself, and its DOM holds the drawn curves (SVG polylines with points), the
    predictions chart (forecast), the confusion matrix (classification), the reconstructions
    (mae), the test split and the trials. A screenshot is left next to each page.
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


# Chromium's own traffic, which it starts whatever the page (clock, updates, accounts, the
# spelling dictionary); any other request in the net log is the page's.
CHROMIUM_SERVICES = {"clients2.google.com", "update.googleapis.com", "accounts.google.com",
                     "redirector.gvt1.com", "clientservices.googleapis.com",
                     "safebrowsingohttpgateway.googleapis.com", "optimizationguide-pa.googleapis.com",
                     "content-autofill.googleapis.com"}


def render(run, chromium):
    path = os.path.join(os.path.abspath(run), "report.html")
    with open(path) as f:
        html = f.read()
    for outside in ("<script", "src=", "href=", "url(", "@import", "<link", "<iframe"):
        if outside in html:
            fail("%s refers to something outside itself: %r" % (path, outside))
    page = "file://" + path
    net_log = os.path.join(run, "netlog.json")
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--user-data-dir=" + os.path.join(work, "chromium-profile"),
            "--enable-logging=stderr", "--v=0",
            # Chromium's own background traffic (updates, sync, spelling dictionaries) off, so
            # that any request left in the net log is the page's.
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--disable-default-apps", "--disable-client-side-phishing-detection",
            "--disable-features=SpellCheck,Translate,OptimizationHints,MediaRouter",
            "--disable-domain-reliability", "--no-pings"]
    dom = subprocess.run(base + ["--log-net-log=" + net_log, "--dump-dom", page],
                         capture_output=True, text=True, timeout=120)
    if dom.returncode != 0:
        fail("chromium --dump-dom exited %d:\n%s" % (dom.returncode, dom.stderr))
    problems = [line for line in dom.stderr.splitlines()
                if "CONSOLE" in line or "Uncaught" in line or "Failed to load" in line]
    if problems:
        fail("console errors while loading %s:\n%s" % (page, "\n".join(problems)))
    if os.path.exists(net_log):
        with open(net_log, errors="replace") as f:
            requested = {url for url, host in
                         re.findall(r'"url":"((?:https?|wss?|ftp)://([^/:"]*)[^"]*)"', f.read())
                         if host not in CHROMIUM_SERVICES}
        if requested:
            fail("network requests while showing %s: %s" % (page, sorted(requested)))
    else:
        fail("chromium wrote no net log for " + page)
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
if "<h2>Test split</h2>" not in dom or "<th>precision</th>" not in dom:
    fail("classification report without the test split or per-class precision")

mae, _ = train("mae", "sp500_pretrain.yaml", "sp500-2000.csv")
dom = render(mae, chromium)
if "Reconstructions (validation split)" not in dom:
    fail("mae report without reconstructions")
charlm, _ = train("charlm", "shakespeare_charlm.yaml", "tinyshakespeare.txt", "model.hidden=32",
                  "data.seq_len=32", "train.max_batches=5")
dom = render(charlm, chromium)
check_curves(dom, charlm)

study = os.path.join(work, "study")
cmd = [seqforge, "tune", os.path.join(source, "examples", "configs", "weather_tune.yaml"),
       "data.path=" + os.path.join(source, "data", "seattle-weather-hourly-normals.csv"),
       "train.run_dir=" + study, "train.epochs=2", "train.max_batches=3", "--n-trials", "3"]
out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
if out.returncode != 0:
    fail("%s exited %d:\n%s%s" % (" ".join(cmd), out.returncode, out.stdout, out.stderr))
dom = render(study, chromium)
if "Optimisation history" not in dom or "<h2>Trials</h2>" not in dom or "<circle" not in dom:
    fail("study report without history, points or trials")
print("every page in Chromium: ok, no network requests (screenshots: %s)" % ", ".join(
    os.path.join(r, "report.png") for r in (forecast, classify, mae, charlm, study)))
