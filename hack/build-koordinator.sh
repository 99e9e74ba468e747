#!/usr/bin/env bash
# Builds koord-scheduler and koord-manager from Koordinator's Go module (tools/koordinator pins
# github.com/koordinator-sh/koordinator) into .cache/koordinator/<key>/, keyed like
# hack/build-control-plane.sh: <key> hashes tools/koordinator's go.mod + go.sum and this script, so an
# unchanged pin reuses the binaries and a changed one (or a fresh clone) rebuilds. Next to the
# binaries it copies, unedited, the files of the same module a cluster needs: the CRDs
# (config/crd/bases), the scheduler profile Koordinator ships (config/manager/scheduler-config.yaml)
# and its webhook configurations (config/webhook). The tests read those copies, so what they install
# is what the built module holds. Prints the directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export GOTOOLCHAIN=local CGO_ENABLED=0
KOORD_MODULE=github.com/koordinator-sh/koordinator
BINARIES=(koord-scheduler koord-manager)

key=$(cat "$root"/tools/koordinator/go.mod "$root"/tools/koordinator/go.sum "$0" | sha256sum | cut -c1-16)
cache="$root/.cache/koordinator"
out="$cache/$key"

all_built() {
  local binary
  for binary in "${BINARIES[@]}"; do
    [ -x "$1/$binary" ] || return 1
  done
  [ -f "$1/config/manager/scheduler-config.yaml" ] && [ -d "$1/config/crd/bases" ]
}

if all_built "$out"; then
  echo "$out"; exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-koordinator: go is not installed; cannot build ${BINARIES[*]}" >&2
  exit 1
fi
mkdir -p "$cache"
# make, pytest and people may start this at the same moment; one builds, the others then reuse it.
exec 9>"$cache/.lock"
flock 9
if all_built "$out"; then
  echo "$out"; exit 0
fi
# A binary left over from an earlier failed run must not pass for this run's output.
rm -rf "$out.tmp"
mkdir -p "$out.tmp"
log="$cache/build-$key.log"
status=0
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
    /usr/bin/time -v go build -trimpath -ldflags "-s -w" -o "$out.tmp/$binary" "$KOORD_MODULE/cmd/$binary" || status=1
  done
  mkdir -p "$out.tmp/config/manager"
  cp -r "$module_dir/config/crd" "$module_dir/config/webhook" "$out.tmp/config/" || status=1
  cp "$module_dir/config/manager/scheduler-config.yaml" "$out.tmp/config/manager/" || status=1
  chmod -R u+w "$out.tmp/config"
  echo "$version" > "$out.tmp/VERSION"
  ls -l "$out.tmp"
  if [ "$status" -eq 0 ]; then
    for binary in "${BINARIES[@]}"; do
      # Both accept --help from the embedded cobra/pflag set; a binary that cannot start fails here.
      "$out.tmp/$binary" --help >/dev/null 2>&1 || { echo "$binary --help failed"; status=1; }
    done
  fi
} >"$log" 2>&1 || status=1
if [ "$status" -ne 0 ] || ! all_built "$out.tmp"; then
  echo "build-koordinator: build failed, see $log:" >&2
  cat "$log" >&2
  exit 1
fi
rm -rf "$out"; mv "$out.tmp" "$out"
cp "$log" "$out/build.log"
echo "$out"
