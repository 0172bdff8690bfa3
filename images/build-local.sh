#!/usr/bin/env bash
# Build images for local use, tagged <registry>/<name>:<tag>, never pushed.
#
#   images/build-local.sh REGISTRY TAG BASE_IMAGE OFFLINE_BASE_IMAGE DIR=NAME [DIR=NAME ...]
#
# DIR is a folder under images/, NAME the image name. images/DIR/Dockerfile builds it if there is
# one; else, for DIR=<X>_gpu, images/<X>/Dockerfile with IMAGE=DIR (trainer_gpu: the trainer's
# Dockerfile) and GRADIENT_ALLREDUCE=nccl if the base has nvcc, host if not (the image's label
# says which); else the shared images/component/Dockerfile with COMPONENT=DIR (data_prep,
# evaluate, register). PUSH=1 pushes each image after building it (make images). The images are built
# on BASE_IMAGE if it is present or can be pulled; otherwise on OFFLINE_BASE_IMAGE, which is
# built from Debian's packages (images/base) when it is missing, and the script says so.
# Docker's layer cache is reused, so a second run rebuilds only what changed. Prints the build
# time and size of each image. (`make images-local` passes the values of
# components/common/defaults.py.)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 5 ] || { echo "usage: $0 REGISTRY TAG BASE_IMAGE OFFLINE_BASE_IMAGE DIR=NAME..." >&2; exit 2; }
registry=$1 tag=$2 base=$3 offline_base=$4
shift 4

# The legacy builder where the buildx plugin is missing (Debian's docker.io has none).
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0

if docker image inspect "$base" >/dev/null 2>&1 || timeout 120 docker pull -q "$base" >/dev/null 2>&1; then
  echo "images: base $base"
else
  echo "images: the base $base cannot be pulled here; using the offline base $offline_base" \
       "(Debian bookworm + Python 3.11 from Debian's packages, see images/README.md)"
  if ! docker image inspect "$offline_base" >/dev/null 2>&1; then
    images/base/build-offline-base.sh "$offline_base"
  fi
  base=$offline_base
fi

# Sets $allreduce, once: nccl if the base has nvcc (a CUDA devel base: Horovod's NCCL operations
# compile CUDA kernels), else host (Horovod's collectives on host memory).
probe_gradient_allreduce() {
  [ -z "${allreduce:-}" ] || return 0
  if docker run --rm --entrypoint sh "$base" -c \
       'command -v nvcc >/dev/null || test -x /usr/local/cuda/bin/nvcc' >/dev/null 2>&1; then
    allreduce=nccl; echo "images: the base has nvcc: the GPU images' Horovod uses NCCL"
  else
    allreduce=host; echo "images: the base has no nvcc: the GPU images' Horovod reduces on the host"
  fi
}

for spec in "$@"; do
  dir=${spec%%=*} name=${spec#*=}
  if [ -f "images/$dir/Dockerfile" ]; then
    build=(-f "images/$dir/Dockerfile")
  elif [[ $dir == *_gpu ]] && [ -f "images/${dir%_gpu}/Dockerfile" ]; then
    probe_gradient_allreduce
    build=(-f "images/${dir%_gpu}/Dockerfile" --build-arg "IMAGE=$dir"
           --build-arg "GRADIENT_ALLREDUCE=$allreduce")
  elif [ -f "images/$dir/requirements.txt" ]; then
    build=(-f images/component/Dockerfile --build-arg "COMPONENT=$dir")
  else
    echo "images: images/$dir has neither a Dockerfile nor a requirements.txt" >&2; exit 2
  fi
  ref="$registry/$name:$tag"
  start=$(date +%s)
  log=$(mktemp)
  if ! docker build --build-arg "BASE_IMAGE=$base" "${build[@]}" -t "$ref" . >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "images: building $ref failed (full log: $log)" >&2
    exit 1
  fi
  rm -f "$log"
  size=$(docker image inspect -f '{{.Size}}' "$ref")
  awk -v r="$ref" -v t=$(( $(date +%s) - start )) -v s="$size" \
    'BEGIN { printf "images: %-48s built in %4d s, %6.0f MB\n", r, t, s / 1e6 }'
  if [ "${PUSH:-0}" = 1 ]; then docker push "$ref"; fi
done
