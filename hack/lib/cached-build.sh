# Sourced by hack/build-*.sh: the cache, lock and log every Go build of the test cluster shares.
#
#   begin_cached_build NAME FILE...   # FILE...: the pins (go.mod, go.sum) the output depends on
#   ... build into "$tmp", log to "$log", set status=1 on any failure ...
#   finish_cached_build
#
# The caller defines all_built DIR (true when DIR holds everything it builds). The output directory
# is .cache/NAME/<key>, <key> hashing the FILEs, the calling script and this file: an unchanged pin
# reuses it, a changed one (or a fresh clone) rebuilds. When it is already built, begin_cached_build
# prints it and exits. make, pytest and people may start a build at the same moment: a flock lets
# one build while the others wait and then reuse it. A directory left by an earlier failed run is
# removed first, so it can never pass for this run's output.

begin_cached_build() {
  build_name=$1; shift
  local key cache
  key=$(cat "$@" "$0" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
  cache="$root/.cache/$build_name"
  out="$cache/$key"
  if all_built "$out"; then
    echo "$out"; exit 0
  fi
  if ! command -v go >/dev/null 2>&1; then
    echo "$(basename "$0" .sh): go is not installed; cannot build $build_name" >&2
    exit 1
  fi
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9
  if all_built "$out"; then
    echo "$out"; exit 0
  fi
  tmp="$out.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log="$cache/build-$key.log"
  status=0
}

finish_cached_build() {
  if [ "$status" -ne 0 ] || ! all_built "$tmp"; then
    echo "$(basename "$0" .sh): build failed, see $log:" >&2
    cat "$log" >&2
    exit 1
  fi
  rm -rf "$out"; mv "$tmp" "$out"
  cp "$log" "$out/build.log"
  echo "$out"
}
