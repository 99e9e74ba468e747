#!/usr/bin/env bash
# Builds kube-apiserver and etcd from the Go module proxy into .cache/control-plane/<key>/,
# where <key> hashes the tools modules' go.mod + go.sum: an unchanged pin reuses the binaries,
# a changed one (or a fresh clone) rebuilds. Prints the directory holding the binaries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export GOTOOLCHAIN=local CGO_ENABLED=0
K8S_VERSION=v1.36.3

key=$(cat "$root"/tools/kube-apiserver/go.mod "$root"/tools/kube-apiserver/go.sum \
          "$root"/tools/etcd/go.mod "$root"/tools/etcd/go.sum "$0" | sha256sum | cut -c1-16)
cache="$root/.cache/control-plane"
out="$cache/$key"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ]; then
  echo "$out"; exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-control-plane: go is not installed; cannot build kube-apiserver/etcd" >&2
  exit 1
fi
mkdir -p "$cache"
# make, pytest and people may start this at the same moment; one builds, the others then reuse it.
exec 9>"$cache/.lock"
flock 9
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ]; then
  echo "$out"; exit 0
fi
# A binary left over from an earlier failed run must not pass for this run's output.
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
log="$cache/build-$key.log"
status=0
{
  echo "# $(date -u +%FT%TZ) $(go version) on $(nproc) cores"
  cd "$root/tools/etcd"
  echo "## etcd"
  # Full compiler output stays in the log: Go's diagnostics ("file.go:1:2: undefined: x") do not
  # contain a fixed word that a filter could keep.
  /usr/bin/time -v go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3 || status=1
  cd "$root/tools/kube-apiserver"
  echo "## kube-apiserver"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
  ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags="$ldflags -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  /usr/bin/time -v go build -trimpath -ldflags "$ldflags" -o "$out.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver || status=1
  ls -l "$out.tmp"
  if [ "$status" -eq 0 ]; then
    "$out.tmp/etcd" --version && "$out.tmp/kube-apiserver" --version || status=1
  fi
} >"$log" 2>&1 || status=1
if [ "$status" -ne 0 ] || [ ! -x "$out.tmp/kube-apiserver" ] || [ ! -x "$out.tmp/etcd" ]; then
  echo "build-control-plane: build failed, see $log:" >&2
  cat "$log" >&2
  exit 1
fi
rm -rf "$out"; mv "$out.tmp" "$out"
cp "$log" "$out/build.log"
echo "$out"
