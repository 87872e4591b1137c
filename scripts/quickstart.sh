#!/usr/bin/env bash
# Builds seqforge (installing what is missing) and trains the bundled example: an LSTM that
# forecasts Seattle's next-hour temperature from the previous two days, then evaluates it on the
# held-out test split.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh" "$root/build" >/dev/null
cd "$root"
build/seqforge train examples/configs/weather_forecast.yaml "$@"
echo "== test split"
build/seqforge eval runs/weather_forecast
