#!/usr/bin/env bash
# Installs the Debian packages seqforge builds and tests with. Idempotent: installs only what is missing.
#   scripts/install-deps.sh          build + test dependencies
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev libhwy-dev libomp-dev
  libopenblas-openmp-dev libblis4-openmp  # more f32 GEMM providers, on oneDNN's OpenMP runtime
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3-torch python3-numpy python3-yaml libopenblas0-pthread
  libsqlite3-dev libpq-dev postgresql python3-optuna
  libonig-dev libicu-dev  # tokenizers: Oniguruma regexes (as Hugging Face's), ICU normalisation
  python3-pandas python3-sklearn python3-psycopg2 python3-plotly  # optuna's dataframe, importances, PostgreSQL, plots (tests)
  pybind11-dev python3-dev python3-pytest python3-tqdm  # the Python module and its tests
  chromium  # renders report.html in the report test
  locales  # a decimal-comma locale (de_DE) for the Python locale test
  libopenmpi-dev openmpi-bin  # data-parallel training (mpirun) and its test
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "seqforge: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
