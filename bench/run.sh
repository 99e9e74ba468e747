#!/usr/bin/env bash
# Admission benchmarks; see bench/run.py and docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "bench: installing wrk from Debian's packages" >&2; apt-get install -y wrk >/dev/null; }
exec .venv/bin/python bench/run.py "$@"
