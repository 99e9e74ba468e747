#!/usr/bin/env bash
# Benchmarks; see bench/production_shape.py, bench/run.py and docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "bench: installing wrk from Debian's packages" >&2; apt-get install -y wrk >/dev/null; }
command -v go >/dev/null || { echo "bench: Go not found (bench/go-reference and bench/loadgen are built with it)" >&2; exit 1; }
# The production shape against native ResourceQuota first (its own control plane, ~10 min; flags in
# BENCH_PRODUCTION_ARGS, e.g. "--issue-sizes"), then the admission benchmarks.
read -ra production_args <<< "${BENCH_PRODUCTION_ARGS:-}"
.venv/bin/python bench/production_shape.py "${production_args[@]}"
exec .venv/bin/python bench/run.py "$@"
