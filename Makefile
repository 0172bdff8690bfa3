# kfp-horovod. `make run` and `make test` install what they need on their own.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kfp-horovod-installed
# Versions and defaults are owned by components/common/defaults.py; read them from there.
defaults = $(shell $(PYTHON) -c "from components.common import defaults; print(defaults.$(1))")
HOROVOD_VERSION := $(call defaults,HOROVOD_VERSION)
# Horovod is built from source against the locked TF, with both controllers: MPI (Debian's Open
# MPI, which make/ensure-openmpi.sh installs; local static jobs run on it) and Gloo (elastic
# jobs). Its ops library links against one TF build, so the wheel is keyed on the TF version and
# the controllers: built once into HOROVOD_WHEELS (never from pip's wheel cache, which cannot
# tell TF versions apart) and reinstalled whenever the venv's Horovod was built for another TF
# or without MPI ($(VENV)/.horovod-tf).
TF_VERSION := $(shell sed -n 's/^tensorflow==//p' requirements/lock.txt)
HOROVOD_WHEELS ?= $(HOME)/.cache/kfp-horovod/horovod-$(HOROVOD_VERSION)-tf-$(TF_VERSION)-mpi-gloo
HOROVOD_TF_MARK := $(VENV)/.horovod-tf
# TensorFlow distributions the lock no longer holds that write the same files as its `tensorflow`
# (tensorflow-cpu up to 2.15): removed before the lock installs, or their files would mix.
STALE_TF_DISTS := tensorflow-cpu tensorflow-estimator
HOROVOD_BUILD_ENV := PATH="$(abspath $(VENV))/bin:$$PATH" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 \
	HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
	CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS=-j$$(nproc) PIP_NO_CACHE_DIR=1

WORKERS ?= $(call defaults,WORKERS)
EPOCHS ?= $(call defaults,EPOCHS)
# MODEL: a built-in model (mnist_advanced, small) or package.module:function; AUGMENT=1 augments.
MODEL ?= $(call defaults,MODEL)
AUGMENT ?= $(call defaults,AUGMENT)
AUGMENT_FLAG = $(if $(filter 1 true True yes,$(AUGMENT)),--augment,--no-augment)
# MIN_WORKERS=N > 0: elastic training, going on with as few as N workers (0: static).
MIN_WORKERS ?= 0
REGISTRY ?= $(call defaults,DEFAULT_IMAGE_REGISTRY)
TAG ?= $(call defaults,PACKAGE_VERSION)
LOCAL_REGISTRY ?= $(call defaults,LOCAL_IMAGE_REGISTRY)
LOCAL_TAG ?= $(call defaults,LOCAL_IMAGE_TAG)
BASE_IMAGE ?= $(call defaults,BASE_IMAGE)
OFFLINE_BASE_IMAGE ?= $(call defaults,OFFLINE_BASE_IMAGE)
# images/<dir>=<image name> for images and images-local, from IMAGE_NAMES in defaults.py.
IMAGE_SPECS = $(shell $(PYTHON) -c "from components.common.defaults import IMAGE_NAMES as n; print(' '.join(f'{k}={v}' for k, v in n.items()))")

.PHONY: help install lock lock-cuda run tensorboard test test-bench test-fast test-containers lint typecheck compile images \
	images-local base-image docker-ready gcs-emulator-image crd bench clean

# upload / submit / schedule against a KFP cluster (see docs/operating.md)
include make/ops.mk

help: ## this list (from the '##' comments of the Makefiles)
	@awk -F':.*## ' '/^[a-z][a-z-]*:.*## / {printf "make %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: $(STAMP) ## .venv from requirements/lock.txt, then Horovod built from source for its TF (idempotent)

# The stamp depends on the lock and the project metadata: a second `make install` is a no-op.
$(STAMP): requirements/lock.txt pyproject.toml
	@make/ensure-openmpi.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@stale=$$($(PY) -m pip list --disable-pip-version-check --format=freeze 2>/dev/null \
		| grep -ioE '^($(subst $(eval) ,|,$(STALE_TF_DISTS)))==' | tr -d '='); \
	if [ -n "$$stale" ]; then $(PY) -m pip uninstall --quiet -y $$stale; fi
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/lock.txt
	@if [ "$$(cat $(HOROVOD_TF_MARK) 2>/dev/null)" != "$(HOROVOD_VERSION) tf $(TF_VERSION) mpi gloo" ]; then \
		if ! ls $(HOROVOD_WHEELS)/horovod-$(HOROVOD_VERSION)-*.whl >/dev/null 2>&1; then \
			echo "building Horovod $(HOROVOD_VERSION) for TF $(TF_VERSION) (5-12 minutes on 2 cores)"; \
			$(HOROVOD_BUILD_ENV) $(PY) -m pip wheel --quiet --disable-pip-version-check \
				--no-build-isolation --no-deps --wheel-dir $(HOROVOD_WHEELS) horovod==$(HOROVOD_VERSION) \
				|| exit 1; \
		fi; \
		$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall \
			$(HOROVOD_WHEELS)/horovod-$(HOROVOD_VERSION)-*.whl || exit 1; \
		echo "$(HOROVOD_VERSION) tf $(TF_VERSION) mpi gloo" > $(HOROVOD_TF_MARK); \
	fi
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -m pip check --disable-pip-version-check
	$(PY) -c "import horovod.tensorflow as hvd; assert hvd.mpi_built() and hvd.gloo_built(); hvd.init()"
	$(PY) -c "from components.common.keras_env import keras; keras(); import horovod.tensorflow.keras, kfp, tensorflow as tf; print('env ok: tf', tf.__version__, 'kfp', kfp.__version__)"
	@touch $@

# Re-resolve the project's declared dependencies (pyproject.toml, all extras) and Horovod's build
# tools (requirements/horovod-build.in), and write the lock (needs the network).
LOCK_EXTRAS := pipeline,train,dev
lock: ## re-resolve pyproject.toml's extras into requirements/lock.txt (needs the network)
	rm -rf build/lock-venv && $(PYTHON) -m venv build/lock-venv
	build/lock-venv/bin/pip install --quiet ".[$(LOCK_EXTRAS)]" -r requirements/horovod-build.in
	{ echo "# Generated by 'make lock' from pyproject.toml [$(LOCK_EXTRAS)] and"; \
	  echo "# requirements/horovod-build.in (pip freeze of a working install)."; \
	  echo "# Horovod is built from source by 'make install' and is not listed here."; \
	  build/lock-venv/bin/pip freeze --all | grep -viE "^(pip|horovod|kfp-horovod)( @ |==)|^-e "; \
	} > requirements/lock.txt
	$(MAKE) --no-print-directory lock-cuda

# What tensorflow[and-cuda] adds to the lock (TF's CUDA libraries, nvidia-*-cu12 wheels), resolved
# against it by pip from the wheels' metadata (a dry run: nothing is installed), into
# requirements/lock-cuda.txt. The dev venv never installs it; the GPU trainer image does (then
# rerun images/pin_requirements.py, as after `make lock`).
lock-cuda: ## re-resolve tensorflow[and-cuda] against the lock into requirements/lock-cuda.txt (needs PyPI)
	@test -x build/lock-venv/bin/pip || { rm -rf build/lock-venv && $(PYTHON) -m venv build/lock-venv; }
	build/lock-venv/bin/pip install --quiet --disable-pip-version-check \
		$$(grep -iE '^packaging==' requirements/lock.txt)
	build/lock-venv/bin/pip install --quiet --disable-pip-version-check --dry-run --ignore-installed \
		--report build/lock-cuda-report.json -c requirements/lock.txt "tensorflow[and-cuda]==$(TF_VERSION)"
	build/lock-venv/bin/python images/pin_requirements.py --cuda-lock build/lock-cuda-report.json

run: install ## the whole pipeline on this machine (kfp.local, mpirun -np $WORKERS, local disk)
	$(PY) -m pipeline run-local --workers $(WORKERS) --epochs $(EPOCHS) --model $(MODEL) \
		$(AUGMENT_FLAG) --min-workers $(MIN_WORKERS)

# TensorBoard on the newest local run (make run writes it under runs/); TENSORBOARD_PORT=6006.
TENSORBOARD_PORT ?= 6006
tensorboard: install ## TensorBoard on the last local run's log dir (rank 0's epochs and the test metrics)
	@dir=$$(ls -td runs/pipeline-root/*/train/train-work/tensorboard 2>/dev/null | head -n 1); \
	if [ -z "$$dir" ]; then echo "tensorboard: no local run under runs/ yet: make run first" >&2; exit 2; fi; \
	echo "tensorboard: $$dir at http://localhost:$(TENSORBOARD_PORT)"; \
	exec $(VENV)/bin/tensorboard --logdir "$$dir" --port $(TENSORBOARD_PORT)

test: install ## the test suite, without the benchmarks' and the container tests (installs first)
	$(PY) -m pytest -m "not containers and not bench"

# The benchmarks (bench/) run end to end at tiny sizes: their real jobs and the JSON they write.
# Kept out of `make test` for its 8 minutes; .ci/run runs it.
test-bench: install ## the benchmarks' real jobs at tiny sizes (writes no results)
	$(PY) -m pytest -m bench tests/test_bench_smoke.py

# Docker-based tests (tests/containers): every image built, each pipeline step in its image, the
# MPIJob's launcher and workers run as mpi-operator runs them. Installs and starts Docker first.
# LOCAL_TAG=<tag> builds and tests images of that tag: checkouts of different code tested at once
# on one Docker engine then do not test each other's images.
test-containers: install images-local ## images, containers, the MPIJob as mpi-operator runs it (starts Docker)
	$(MAKE) --no-print-directory gcs-emulator-image
	KFP_HOROVOD_TEST_IMAGE_TAG=$(LOCAL_TAG) $(PY) -m pytest -m containers tests/containers

test-fast: install ## the tests without multi-rank and end-to-end jobs
	$(PY) -m pytest -m "not horovod and not e2e and not containers"

lint: install ## ruff check and format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: install ## mypy
	$(PY) -m mypy components pipeline bench standins

compile: install ## write build/pipeline.yaml (REGISTRY=, TAG= for the images)
	$(PY) -m pipeline compile --output build/pipeline.yaml --image-registry $(REGISTRY) --image-tag $(TAG)

# Builds and pushes one image per component (needs Docker and a registry login).
images: docker-ready ## build and push the five images to $REGISTRY:$TAG (needs a registry login)
	PUSH=1 images/build-local.sh $(REGISTRY) $(TAG) $(BASE_IMAGE) $(OFFLINE_BASE_IMAGE) $(IMAGE_SPECS)

# Make sure a Docker engine runs (installs Debian's docker.io and starts dockerd if needed).
docker-ready: ## make sure a Docker engine runs (installs docker.io, starts dockerd)
	@make/ensure-docker.sh

# The offline stand-in for $(BASE_IMAGE): Debian bookworm + Python 3.11 from Debian's packages.
base-image: docker-ready ## the offline base: Debian bookworm + Python 3.11 from Debian's packages
	images/base/build-offline-base.sh $(OFFLINE_BASE_IMAGE)

# Build the five component images (IMAGE_NAMES) as $(LOCAL_REGISTRY)/<name>:$(LOCAL_TAG), no push; falls back
# to the offline base when $(BASE_IMAGE) cannot be pulled.
images-local: docker-ready ## build the five images for local use (no push; offline base if needed)
	images/build-local.sh $(LOCAL_REGISTRY) $(LOCAL_TAG) $(BASE_IMAGE) $(OFFLINE_BASE_IMAGE) $(IMAGE_SPECS)

gcs-emulator-image: docker-ready ## the container tests' GCS emulator image
	images/build-local.sh $(LOCAL_REGISTRY) $(LOCAL_TAG) $(BASE_IMAGE) $(OFFLINE_BASE_IMAGE) gcs-emulator=gcs-emulator

# The MPIJob CRD the manifests are validated against (deploy/crd/SOURCE.md); the Trainer CRDs are
# copied by hand (deploy/crd/trainer/SOURCE.md). Every CRD's schema is packaged for the image.
MPI_OPERATOR_REF ?= caa3c47
crd: install ## refresh deploy/crd from kubeflow/mpi-operator at MPI_OPERATOR_REF, and the packaged schemas
	curl -fsSL -o deploy/crd/kubeflow.org_mpijobs.yaml \
		https://raw.githubusercontent.com/kubeflow/mpi-operator/$(MPI_OPERATOR_REF)/manifests/base/kubeflow.org_mpijobs.yaml
	$(PY) -c "from components.train.cluster.crd import write_packaged_schema as w; from components.train.mpijob.validate import MPIJOB; from components.train.trainjob.manifest import TRAINJOB, TRAINING_RUNTIME; [w(c) for c in (MPIJOB, TRAINJOB, TRAINING_RUNTIME)]"
	@echo "deploy/crd: now from mpi-operator $(MPI_OPERATOR_REF); write it into deploy/crd/SOURCE.md"

bench: install ## the benchmarks (bench/README.md)
	$(PY) -m bench.run_all

clean: ## remove build outputs, runs and caches
	rm -rf build runs .pytest_cache .mypy_cache .ruff_cache
