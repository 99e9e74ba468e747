#!/usr/bin/env bash
# Builds koord-scheduler and koord-manager from Koordinator's Go module (tools/koordinator pins
# github.com/koordinator-sh/koordinator) into .cache/koordinator/<key>/ (hack/lib/cached-build.sh:
# <key> hashes tools/koordinator's go.mod + go.sum and the scripts). Next to the binaries it copies, unedited, the files of the same module a cluster needs: the CRDs
# (config/crd/bases), the scheduler profile Koordinator ships (config/manager/scheduler-config.yaml)
# and its webhook configurations (config/webhook). The tests read those copies, so what they install
# is what the built module holds. Prints the directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/cached-build.sh"
export GOTOOLCHAIN=local CGO_ENABLED=0
KOORD_MODULE=github.com/koordinator-sh/koordinator
BINARIES=(koord-scheduler koord-manager)

all_built() {
  local binary
  for binary in "${BINARIES[@]}"; do
    [ -x "$1/$binary" ] || return 1
  done
  [ -f "$1/config/manager/scheduler-config.yaml" ] && [ -d "$1/config/crd/bases" ]
}

begin_cached_build koordinator "$root"/tools/koordinator/go.mod "$root"/tools/koordinator/go.sum
{
  echo "# $(date -u +%FT%TZ) $(go version) on $(nproc) cores"
  cd "$root/tools/koordinator"
  version=$(go list -m -f '{{.Version}}' "$KOORD_MODULE")
  module_dir=$(go mod download -json "$KOORD_MODULE@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  echo "# $KOORD_MODULE $version from $module_dir"
  # One go build per binary, so the log records each one's time and memory; the Kubernetes packages
  # they share are compiled once and come from the build cache for the second.
  for binary in "${BINARIES[@]}"; do
    echo "## $binary"
    /usr/bin/time -v go build -trimpath -ldflags "-s -w" -o "$tmp/$binary" "$KOORD_MODULE/cmd/$binary" || status=1
  done
  mkdir -p "$tmp/config/manager"
  cp -r "$module_dir/config/crd" "$module_dir/config/webhook" "$tmp/config/" || status=1
  cp "$module_dir/config/manager/scheduler-config.yaml" "$tmp/config/manager/" || status=1
  chmod -R u+w "$tmp/config"
  echo "$version" > "$tmp/VERSION"
  ls -l "$tmp"
  if [ "$status" -eq 0 ]; then
    for binary in "${BINARIES[@]}"; do
      # Both accept --help from the embedded cobra/pflag set; a binary that cannot start fails here.
      "$tmp/$binary" --help >/dev/null 2>&1 || { echo "$binary --help failed"; status=1; }
    done
  fi
} >"$log" 2>&1 || status=1
finish_cached_build
