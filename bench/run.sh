#!/usr/bin/env bash
# Admission benchmarks; see bench/run.py and docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "bench: installing wrk from Debian's packages" >&2; apt-get install -y wrk >/dev/null; }
command -v go >/dev/null || { echo "bench: Go not found (bench/go-reference and bench/loadgen are built with it)" >&2; exit 1; }
exec .venv/bin/python bench/run.py "$@"
