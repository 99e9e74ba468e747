#!/usr/bin/env bash
# Benchmarks; see bench/production_shape.py, bench/run.py and docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null || { echo "bench: installing wrk from Debian's packages" >&2; apt-get install -y wrk >/dev/null; }
command -v go >/dev/null || { echo "bench: Go not found (bench/go-reference and bench/loadgen are built with it)" >&2; exit 1; }
# The production shape first (its own control plane; flags in BENCH_PRODUCTION_ARGS, e.g.
# "--issue-sizes"), then the admission benchmarks. Unless those flags name --modes, it measures the
# shipped shape against native ResourceQuota, the two-webhook limit (go-both) and koord-manager x3 in
# one run, as the targets compare them; koord-manager is hack/build-koordinator.sh's (make koordinator).
read -ra production_args <<< "${BENCH_PRODUCTION_ARGS:-}"
if [[ " ${production_args[*]} " != *" --modes"* ]]; then
  production_args+=(--modes none,native,strict,koord3,go-both)
fi
.venv/bin/python bench/production_shape.py "${production_args[@]}"
exec .venv/bin/python bench/run.py "$@"
