#!/usr/bin/env bash
# Make sure a Docker engine answers: install Debian's docker.io if there is no engine, and start
# dockerd in the background if it is not running (needs root for both; storage driver overlay2).
set -euo pipefail
if docker info >/dev/null 2>&1; then exit 0; fi
if ! command -v dockerd >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "docker: no Docker engine, and installing one needs root" >&2; exit 2; }
  echo "docker: installing Debian's docker.io"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "docker: dockerd is not running, and starting it needs root" >&2; exit 2; }
  echo "docker: starting dockerd (log: /var/log/kfp-horovod-dockerd.log)"
  setsid dockerd >/var/log/kfp-horovod-dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi
docker info >/dev/null 2>&1 || { echo "docker: dockerd did not come up" >&2; exit 1; }
echo "docker: engine $(docker version -f '{{.Server.Version}}') ready"
