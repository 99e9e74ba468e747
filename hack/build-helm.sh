#!/usr/bin/env bash
# Builds helm from the Go module proxy into .cache/helm/<key>/ (hack/lib/cached-build.sh: <key>
# hashes tools/helm's go.mod + go.sum and the scripts). Prints the directory holding the binary.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/cached-build.sh"
export GOTOOLCHAIN=local CGO_ENABLED=0
# The version helm reports is the one pinned in tools/helm/go.mod, so the two cannot disagree.
HELM_VERSION=$(awk '$1 == "helm.sh/helm/v4" { print $2 }' "$root/tools/helm/go.mod")

all_built() {
  [ -x "$1/helm" ]
}

begin_cached_build helm "$root"/tools/helm/go.mod "$root"/tools/helm/go.sum
{
  echo "# $(date -u +%FT%TZ) $(go version) on $(nproc) cores"
  cd "$root/tools/helm"
  # helm's own release build stamps its version through these variables; without them
  # `helm version` reports only the minor line.
  ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
  ldflags="$ldflags -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  echo "## helm"
  /usr/bin/time -v go build -trimpath -ldflags "$ldflags" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm || status=1
  ls -l "$tmp"
  if [ "$status" -eq 0 ]; then
    "$tmp/helm" version || status=1
  fi
} >"$log" 2>&1 || status=1
finish_cached_build
