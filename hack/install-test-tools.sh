#!/usr/bin/env bash
# Tools the e2e suite runs as real processes besides the control plane, from Debian's packages,
# installed only when missing, so a warm machine pays nothing:
# - HAProxy, the load balancer in front of three webhook replicas (tests/e2e/test_replicas.py);
# - wrk, the load generator of `make bench`, which tests/e2e/test_bench_scripts.py runs at toy size;
# - promtool (Debian's prometheus package), which checks the alert rules (tests/webhook/serving/test_monitoring.py).
set -euo pipefail

missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-tools: missing ${missing[*]} and there is no apt-get to install them; install HAProxy 2.x, wrk 4.x and promtool (Prometheus 2.x or later)" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  SUDO="sudo"
fi
echo "install-test-tools: installing ${missing[*]} from Debian's packages" >&2
$SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
  $SUDO apt-get update >/dev/null && $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
}
command -v haproxy >/dev/null && command -v wrk >/dev/null && command -v promtool >/dev/null
