#!/usr/bin/env bash
# Build the project's Horovod: the pinned Horovod sdist, checked by sha256, with the patch series
# in make/horovod/patches applied in order, compiled against the TensorFlow that PYTHON has
# installed, with the MPI and Gloo controllers (and NCCL when HOROVOD_GPU_OPERATIONS=NCCL). The
# wheel records the controllers it has (horovod/metadata.json, patch 0004: what the launcher reads).
#
#   make/horovod/build.sh PYTHON CACHE_DIR
#
# The wheel lands in CACHE_DIR/<key>/, the key naming the Horovod version, the TF version, the
# controllers, the patch series' hash and the Python (cp311); a wheel already there is reused. The last line printed
# is the wheel's path. `make install` and the trainer image's build stage both build with this
# script (docs/versions.md). Build tools (setuptools<70, wheel, cmake) must be installed in
# PYTHON's environment: the build runs with --no-build-isolation against its TensorFlow.
# HOROVOD_SDIST=PATH takes the sdist from PATH instead of downloading it from PyPI (offline
# builds, and the tests of this script's errors); it is sha256-checked all the same.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 2 ] || { echo "usage: $0 PYTHON CACHE_DIR" >&2; exit 2; }
py=$1 cache=$2
# shellcheck source=make/horovod/SOURCE
. "$here/SOURCE"
fail() { echo "horovod build: $*" >&2; exit 1; }

tf=$("$py" -c 'import importlib.metadata as m; print(m.version("tensorflow"))' 2>/dev/null) \
  || fail "$py has no tensorflow installed: install the lock first (make install)"
supported=false
for minor in $HOROVOD_TENSORFLOW; do [[ $tf == "$minor" || $tf == "$minor".* ]] && supported=true; done
$supported || fail "the patch series in make/horovod/patches was made for TensorFlow" \
  "$HOROVOD_TENSORFLOW; $py has TensorFlow $tf"

controllers=mpi-gloo
[ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && controllers=mpi-gloo-nccl
series=$(cat "$here"/patches/*.patch | sha256sum | cut -c1-12)
cp=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
out="$cache/horovod-$HOROVOD_VERSION-tf-$tf-$controllers-patches-$series-$cp"
# One build of a key at a time: a second install of the same key (another checkout) waits for
# the first and takes its wheel.
mkdir -p "$cache"
exec 9>"$out.lock"
flock 9
wheel=$(ls "$out"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$wheel" ]; then echo "$wheel"; exit 0; fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sdist="horovod-$HOROVOD_VERSION.tar.gz"
if [ -n "${HOROVOD_SDIST:-}" ]; then
  cp "$HOROVOD_SDIST" "$work/$sdist" 2>/dev/null || fail "HOROVOD_SDIST=$HOROVOD_SDIST: no such file"
else
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    --dest "$work" "horovod==$HOROVOD_VERSION" >/dev/null || fail "pip could not download and read $sdist (above)"
fi
got=$(sha256sum "$work/$sdist" | cut -d' ' -f1)
[ "$got" = "$HOROVOD_SHA256" ] || fail "$sdist has sha256 $got, expected $HOROVOD_SHA256 (make/horovod/SOURCE)"
tar -xzf "$work/$sdist" -C "$work"
src="$work/horovod-$HOROVOD_VERSION"

# Where patch $1 does not apply to $src: each file it changes that the sdist lacks, and each
# file with a hunk that fails (or is applied already), with patch's own words.
misfits() {
  local f
  for f in $(sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$1"); do
    [ -e "$src/$f" ] || printf '%s (not in the sdist); ' "$f"
  done
  patch --batch --forward --dry-run -p1 -d "$src" <"$1" 2>&1 | awk '
    /^checking file / { file = $3 }
    /^Hunk #[0-9]+ FAILED/ { why[file] = why[file] (why[file] ? ", " : "") $1 " " $2 " " $3 " " $4 " " $5 }
    /previously applied/ { why[file] = "applied already" }
    END { for (f in why) printf "%s (%s); ", f, why[f] }'
}

for p in "$here"/patches/*.patch; do
  if ! patch --quiet --batch --forward --dry-run -p1 -d "$src" <"$p" >/dev/null 2>&1; then
    where=$(misfits "$p" || true)
    [ -n "$where" ] || where="$(sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$p" | tr '\n' ' ')"
    fail "patch $(basename "$p") does not apply to $sdist: ${where%; }"
  fi
  patch --quiet --batch --forward -p1 -d "$src" <"$p" >/dev/null
done

echo "horovod build: Horovod $HOROVOD_VERSION + $(ls "$here"/patches | wc -l) patch(es)" \
  "for TensorFlow $tf, $controllers (5-12 minutes on 2 cores)" >&2
mkdir -p "$out"
HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 \
  HOROVOD_WITHOUT_MXNET=1 CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
  PIP_NO_CACHE_DIR=1 PATH="$(dirname "$py"):$PATH" \
  "$py" -m pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  --wheel-dir "$work/wheel" "$src" >&2 || fail "compiling Horovod $HOROVOD_VERSION failed (above)"
mv "$work"/wheel/horovod-"$HOROVOD_VERSION"-*.whl "$out"/
ls "$out"/horovod-"$HOROVOD_VERSION"-*.whl
