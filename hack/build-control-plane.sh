#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-scheduler and kube-controller-manager from the Go module proxy
# into .cache/control-plane/<key>/ (hack/lib/cached-build.sh: <key> hashes the tools modules' go.mod
# + go.sum and the scripts). The three kube-* binaries come from the one k8s.io/kubernetes pin in
# tools/kube, so they are the same release. Prints the directory holding the binaries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/cached-build.sh"
export GOTOOLCHAIN=local CGO_ENABLED=0
K8S_VERSION=v1.36.3
KUBE_BINARIES=(kube-apiserver kube-scheduler kube-controller-manager)
BINARIES=(etcd "${KUBE_BINARIES[@]}")

all_built() {
  local binary
  for binary in "${BINARIES[@]}"; do
    [ -x "$1/$binary" ] || return 1
  done
}

begin_cached_build control-plane "$root"/tools/kube/go.mod "$root"/tools/kube/go.sum \
  "$root"/tools/etcd/go.mod "$root"/tools/etcd/go.sum
{
  echo "# $(date -u +%FT%TZ) $(go version) on $(nproc) cores"
  cd "$root/tools/etcd"
  echo "## etcd"
  # Full compiler output stays in the log: Go's diagnostics ("file.go:1:2: undefined: x") do not
  # contain a fixed word that a filter could keep.
  /usr/bin/time -v go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3 || status=1
  cd "$root/tools/kube"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
  ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=36 -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags="$ldflags -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  # One go build per binary, so the log records each one's time and memory; the packages they share
  # are compiled once and come from the build cache for the next.
  for binary in "${KUBE_BINARIES[@]}"; do
    echo "## $binary"
    /usr/bin/time -v go build -trimpath -ldflags "$ldflags" -o "$tmp/$binary" "k8s.io/kubernetes/cmd/$binary" || status=1
  done
  ls -l "$tmp"
  if [ "$status" -eq 0 ]; then
    for binary in "${BINARIES[@]}"; do
      "$tmp/$binary" --version || status=1
    done
  fi
} >"$log" 2>&1 || status=1
finish_cached_build
