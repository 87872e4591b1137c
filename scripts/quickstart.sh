#!/usr/bin/env bash
# Builds seqforge (installing what is missing) and trains the bundled example: an LSTM that
# forecasts Seattle's next-hour temperature from the previous two days (replacing the example's
# earlier run, if any), evaluates it on the held-out test split, and forecasts the hour after the
# data's last one.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh" "$root/build" >/dev/null
cd "$root"
build/seqforge train --overwrite examples/configs/weather_forecast.yaml "$@"
echo "== test split"
build/seqforge eval runs/weather_forecast
echo "== the forecast after the last row"
build/seqforge predict runs/weather_forecast --input data/seattle-weather-hourly-normals.csv \
  --output - --last
