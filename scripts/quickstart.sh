#!/usr/bin/env bash
# Builds seqforge (installing what is missing) and trains the bundled example: an LSTM that
# forecasts next month's Mauna Loa CO2 from the previous 24 months.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/build.sh" "$root/build"
"$root/build/seqforge_example" "$root/data/co2-concentration.csv" "${1:-20}"
