#!/usr/bin/env bash
# Builds helm from the Go module proxy into .cache/helm/<key>/, where <key> hashes tools/helm's
# go.mod + go.sum and this script: an unchanged pin reuses the binary, a changed one (or a fresh
# clone) rebuilds. Same pattern as hack/build-control-plane.sh (flock, .tmp directory, build log).
# Prints the directory holding the binary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export GOTOOLCHAIN=local CGO_ENABLED=0
# The version helm reports is the one pinned in tools/helm/go.mod, so the two cannot disagree.
HELM_VERSION=$(awk '$1 == "helm.sh/helm/v4" { print $2 }' "$root/tools/helm/go.mod")

key=$(cat "$root"/tools/helm/go.mod "$root"/tools/helm/go.sum "$0" | sha256sum | cut -c1-16)
cache="$root/.cache/helm"
out="$cache/$key"

if [ -x "$out/helm" ]; then
  echo "$out"; exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-helm: go is not installed; cannot build helm" >&2
  exit 1
fi
mkdir -p "$cache"
# make, pytest and people may start this at the same moment; one builds, the others then reuse it.
exec 9>"$cache/.lock"
flock 9
if [ -x "$out/helm" ]; then
  echo "$out"; exit 0
fi
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
log="$cache/build-$key.log"
status=0
{
  echo "# $(date -u +%FT%TZ) $(go version) on $(nproc) cores"
  cd "$root/tools/helm"
  # helm's own release build stamps its version through these variables; without them
  # `helm version` reports only the minor line.
  ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
  ldflags="$ldflags -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  echo "## helm"
  /usr/bin/time -v go build -trimpath -ldflags "$ldflags" -o "$out.tmp/helm" helm.sh/helm/v4/cmd/helm || status=1
  ls -l "$out.tmp"
  if [ "$status" -eq 0 ]; then
    "$out.tmp/helm" version || status=1
  fi
} >"$log" 2>&1 || status=1
if [ "$status" -ne 0 ] || [ ! -x "$out.tmp/helm" ]; then
  echo "build-helm: build failed, see $log:" >&2
  cat "$log" >&2
  exit 1
fi
rm -rf "$out"; mv "$out.tmp" "$out"
cp "$log" "$out/build.log"
echo "$out"
