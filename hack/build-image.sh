#!/usr/bin/env bash
# Build (or push) the webhook's image from the Containerfile with whichever OCI builder is here:
#   hack/build-image.sh IMAGE            (make image IMAGE=registry.example.com/team/koord-gpuquota:0.1.0)
#   hack/build-image.sh --push IMAGE     (make push IMAGE=...)
# Builders, first usable one wins: podman, buildah (both daemonless), docker (only when its daemon
# answers `docker info`; the client alone builds nothing). BUILDER=NAME picks one. With none usable
# it stops with one line saying what it needs: nothing is published from this repository, so a user
# who cannot build the image cannot install the webhook, and must know that before applying anything.
set -euo pipefail

readonly PROG="${0##*/}"
readonly CANDIDATES=(podman buildah docker)

push=false
if [[ "${1:-}" == "--push" ]]; then
  push=true
  shift
fi
if (($# != 1)) || [[ -z "$1" ]]; then
  echo "$PROG: usage: $PROG [--push] IMAGE (make image IMAGE=registry.example.com/team/koord-gpuquota:0.1.0)" >&2
  exit 2
fi
image="$1"

# Whether NAME can build here: on PATH, and for docker a daemon that answers.
usable() {
  command -v "$1" >/dev/null 2>&1 || return 1
  [[ "$1" != docker ]] || docker info >/dev/null 2>&1
}

builder="${BUILDER:-}"
if [[ -n "$builder" ]]; then
  usable "$builder" || { echo "$PROG: BUILDER=$builder cannot build here (not on PATH, or its daemon does not answer)" >&2; exit 1; }
else
  for candidate in "${CANDIDATES[@]}"; do
    if usable "$candidate"; then
      builder="$candidate"
      break
    fi
  done
fi
if [[ -z "$builder" ]]; then
  found=""
  command -v docker >/dev/null 2>&1 && found=" (docker is installed but its daemon does not answer 'docker info')"
  echo "$PROG: no OCI image builder to build $image: install podman or buildah, or docker with a running daemon$found; or set BUILDER" >&2
  exit 1
fi

cd "$(dirname "$0")/.."
if $push; then
  exec "$builder" push "$image"
fi
case "$builder" in
  # RUN --mount in the Containerfile needs BuildKit, docker's default builder since 23.0.
  docker) export DOCKER_BUILDKIT=1 ;;
esac
exec "$builder" build -f Containerfile -t "$image" .
