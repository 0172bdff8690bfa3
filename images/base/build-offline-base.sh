#!/usr/bin/env bash
# Build a stand-in for python:3.11-slim-bookworm without the public image registry:
# Debian bookworm from Debian's own package mirror (debootstrap), Python 3.11 in a venv whose
# `python`, `python3` and `pip` come first on PATH (as in the python image), and the build
# machine's CA bundle for pip (PIP_CERT), for networks that intercept TLS.
#
#   images/base/build-offline-base.sh [IMAGE_TAG]     (default: kfp-horovod-base:bookworm-py311)
#
# Needs root (debootstrap, which it installs from Debian's packages if missing), Docker and
# Debian's mirror. Environment knobs:
#   DEBIAN_MIRROR   the mirror (default: the first deb URI in /etc/apt/sources.list.d/debian.sources,
#                   else http://deb.debian.org/debian)
#   CA_BUNDLE       the CA bundle pip trusts in the image (default /etc/ssl/certs/ca-certificates.crt)
set -euo pipefail

tag=${1:-kfp-horovod-base:bookworm-py311}
here=$(cd "$(dirname "$0")" && pwd)
mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
mirror=${mirror:-http://deb.debian.org/debian}
ca_bundle=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

[ "$(id -u)" = 0 ] || { echo "build-offline-base: debootstrap needs root" >&2; exit 2; }
command -v docker >/dev/null || { echo "build-offline-base: 'docker' is not installed (make docker-ready installs it)" >&2; exit 2; }
[ -r "$ca_bundle" ] || { echo "build-offline-base: CA bundle '$ca_bundle' is not readable" >&2; exit 2; }
# A fresh machine has no debootstrap: install Debian's.
if ! command -v debootstrap >/dev/null; then
  echo "build-offline-base: installing Debian's debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  command -v debootstrap >/dev/null || { echo "build-offline-base: debootstrap is still missing after the install" >&2; exit 1; }
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "build-offline-base: debootstrap bookworm from $mirror"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
# The image's own apt sources use the same mirror (and security updates from it).
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" \
  >"$work/rootfs/etc/apt/sources.list"
rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/archives/"*.deb
tar -C "$work/rootfs" -c . | docker import - kfp-horovod-rootfs:bookworm >/dev/null

mkdir "$work/context"
cp "$ca_bundle" "$work/context/build-ca.crt"
docker build --quiet -t "$tag" -f "$here/Dockerfile" "$work/context" >/dev/null
docker image rm kfp-horovod-rootfs:bookworm >/dev/null
docker run --rm "$tag" python -c "import sys; print('build-offline-base: $tag has Python', sys.version.split()[0])"
