#!/usr/bin/env bash
# Tools the e2e suite runs as real processes besides the control plane: HAProxy, the load
# balancer in front of three webhook replicas (tests/e2e/test_replicas.py). From Debian's packages,
# installed only when missing, so a warm machine pays nothing.
set -euo pipefail

if command -v haproxy >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-tools: haproxy is missing and there is no apt-get to install it; install HAProxy 2.x" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
  SUDO="sudo"
fi
echo "install-test-tools: installing haproxy from Debian's packages" >&2
$SUDO apt-get install -y --no-install-recommends haproxy >/dev/null 2>&1 || {
  $SUDO apt-get update >/dev/null && $SUDO apt-get install -y --no-install-recommends haproxy >/dev/null
}
command -v haproxy >/dev/null
