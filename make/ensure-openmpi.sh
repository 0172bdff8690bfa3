#!/usr/bin/env bash
# Make sure Debian's Open MPI is installed: `mpirun` for local jobs, and the headers and
# libraries Horovod's MPI controller is built against; and `patch`, which applies the project's
# Horovod patch series (make/horovod/build.sh). Needs root to install.
set -euo pipefail
if command -v mpirun >/dev/null 2>&1 && command -v patch >/dev/null 2>&1 \
   && [ -e /usr/include/x86_64-linux-gnu/openmpi/mpi.h -o -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ]; then
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "openmpi: Open MPI or patch is missing, and installing them needs root: apt-get install openmpi-bin libopenmpi-dev patch" >&2; exit 2; }
echo "openmpi: installing Debian's openmpi-bin, libopenmpi-dev and patch"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev patch >/dev/null
command -v mpirun >/dev/null || { echo "openmpi: mpirun is still missing after the install" >&2; exit 1; }
