#!/usr/bin/env bash
# make dist: what a user installs the CLI from, as kubectl plugins are installed (nothing of it is
# published anywhere; README "Installing the CLI" says so).
#   DIST_DIR/koord_gpuquota-VERSION-py3-none-any.whl     the package (pip install it into any venv)
#   DIST_DIR/kubectl-gpuquota                            a shiv zipapp: the package and every runtime
#                                                        dependency in one executable file
#   DIST_DIR/kubectl-gpuquota_linux_amd64.tar.gz         that file, as krew downloads plugins
#   DIST_DIR/gpuquota.yaml                               the krew manifest (manifests/krew/gpuquota.yaml
#                                                        with the archive's URL and sha256 filled in)
#   DIST_DIR/SHA256SUMS                                  sha256sum -c checks all of the above
#
# shiv rather than the stdlib zipapp: cryptography, orjson and PyYAML are compiled
# extensions, which Python cannot import from inside a zip; shiv's bootstrap unpacks the
# dependencies once into SHIV_ROOT (default ~/.shiv) and runs from there. The wheels are those pip
# picks for the interpreter that builds, so the zipapp runs on that platform with that CPython
# minor version: linux/amd64 and python3.11 on PATH, as the krew manifest's selector and caveats say.
set -euo pipefail

readonly PROG="${0##*/}"
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
dist="${DIST_DIR:-$root/dist}"
dist_url="${DIST_URL:-}"
# Timestamps inside the zipapp and the archive (shiv --reproducible reads it too).
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-1700000000}"

version="$("$python" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' \
  "$root/pyproject.toml")"
[[ -n "$dist_url" ]] || dist_url="https://github.com/koord-gpuquota/koord-gpuquota/releases/download/v$version"
"$python" -c 'import shiv' 2>/dev/null || { echo "$PROG: shiv is missing from $python (make .venv/.installed)" >&2; exit 1; }
python_minor="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"

mkdir -p "$dist"
work="$(mktemp -d)"
trap 'rm -rf -- "$work"' EXIT

wheel_name="koord_gpuquota-$version-py3-none-any.whl"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/wheel" "$root"
cp "$work/wheel/$wheel_name" "$dist/$wheel_name"

# -c: the console script; the shebang names the interpreter the extensions were built for.
"$python" -m shiv --quiet --reproducible --compressed -c kubectl-gpuquota -p "/usr/bin/env python$python_minor" \
  -o "$dist/kubectl-gpuquota" "$dist/$wheel_name"

archive="kubectl-gpuquota_linux_amd64.tar.gz"
mkdir "$work/archive"
cp "$dist/kubectl-gpuquota" "$work/archive/kubectl-gpuquota"
chmod 0755 "$work/archive/kubectl-gpuquota"
# Fixed order, owner and times, gzip without a name or time: the same inputs give the same digest.
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner -C "$work/archive" -cf - \
  kubectl-gpuquota | gzip -n -9 >"$dist/$archive"

sha256="$(sha256sum "$dist/$archive" | cut -d' ' -f1)"
# The template's header comment explains the placeholders; filled in, its sentences would read as
# nonsense ("https://... becomes where the archive is served"), so the built manifest gets a header
# of its own and the template's is left out (everything before its first line that is not a comment).
{
  echo "# krew plugin manifest for \`kubectl gpuquota\`, made by \`make dist\` (hack/dist.sh) from the template"
  echo "# manifests/krew/gpuquota.yaml for the archive beside it, $archive: a zipapp for"
  echo "# linux/amd64 with CPython $python_minor (its compiled dependencies are those of the machine that built it)."
  echo "# Install: kubectl krew install --manifest=gpuquota.yaml --archive=$archive"
  sed -e '/^[^#]/,$!d' -e "s|\${DIST_URL}|$dist_url|g" -e "s|\${SHA256_LINUX_AMD64}|$sha256|g" \
    -e "s|\${PYTHON_MINOR}|$python_minor|g" "$root/manifests/krew/gpuquota.yaml"
} >"$dist/gpuquota.yaml"
if grep -n '\${' "$dist/gpuquota.yaml" >&2; then
  echo "$PROG: placeholders left in $dist/gpuquota.yaml" >&2
  exit 1
fi

(cd "$dist" && sha256sum "$wheel_name" kubectl-gpuquota "$archive" gpuquota.yaml >SHA256SUMS)
echo "$PROG: wrote $dist: $wheel_name, kubectl-gpuquota (python$python_minor), $archive (sha256 $sha256), gpuquota.yaml, SHA256SUMS" >&2
