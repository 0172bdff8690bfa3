"""The one home of every parameter rule, run before any work starts.

The pipeline's check step, the CLI (``run-local``, ``render-mpijob``), the trainer's
`TrainConfig`, the MPIJob builder and data prep all call these functions, so a rule is written
once and every caller refuses the same values with the same words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components.common.defaults import BUNDLED_SOURCE, MODELS

TRAINING_BACKENDS = ("local", "mpijob")
SOURCE_SCHEMES = ("http", "https", "gs")
COMPRESSIONS = ("none", "fp16")  # the trainer's gradient compression (hvd.Compression.<name>)
# Kubernetes' own quantity grammar (k8s.io/apimachinery/pkg/api/resource), as a regex.
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
QUANTITY_PARAMETERS = ("cpu_per_worker", "memory_per_worker", "launcher_cpu", "launcher_memory")
_MODEL_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_SOURCE_FORMS = "'bundled', a gs:// or http(s) URL, or an absolute path"
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
# A user's model: ``package.module:function`` (dotted module path, one function name).
ENTRY_POINT = re.compile(rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}$")
# The least value of each integer parameter (pipeline parameters and MPIJob run policy).
MINIMUMS: dict[str, int] = {
    "workers": 1, "epochs": 1, "batch_size_per_worker": 1, "warmup_epochs": 0,
    "threads_per_worker": 0, "slots_per_worker": 1, "gpus_per_worker": 0, "seed": 0,
    "shard_size": 1, "data_limit": 0, "stall_shutdown_seconds": 1,
    "ttl_seconds_after_finished": 0, "backoff_limit": 0, "active_deadline_seconds": 1,
    "min_available": 1, "backward_passes_per_step": 1, "inter_op_threads": 0,
    "min_workers": 0,
}  # fmt: skip


def is_positive_quantity(value: object) -> bool:
    """True for a Kubernetes quantity above zero ('2', '500m', '4Gi', '1e3', '.5')."""
    text = str(value)
    if not QUANTITY.match(text) or text.startswith("-"):
        return False
    mantissa = re.match(r"^\+?([0-9.]+)", text)
    return mantissa is not None and float(mantissa.group(1)) > 0


def data_source_problem(source: str) -> str | None:
    """Why `source` is not a data source we can read, or None."""
    if source in ("bundled", BUNDLED_SOURCE):
        return None
    if not source:
        return f"data_source must be {_SOURCE_FORMS}: the data source is empty"
    scheme, sep, _ = source.partition("://")
    if sep and scheme not in SOURCE_SCHEMES:
        return f"data_source must be {_SOURCE_FORMS}: unsupported scheme {scheme!r} in {source!r}"
    if not sep and not source.startswith("/"):
        return f"data_source must be {_SOURCE_FORMS}; got {source!r}"
    return None


def data_sha256_problem(sha256: str) -> str | None:
    """Why `sha256` is neither 64 hex digits nor 'none', or None."""
    if sha256.lower() == "none" or _SHA256.match(sha256):
        return None
    return f"data_sha256 {sha256!r} is not 64 hex digits (or 'none')"


def model_problem(model: object, label: str = "model") -> str | None:
    """Why `model` is neither a built-in model nor a ``package.module:function`` entry point.

    Only the form is checked here: whether the entry point imports and builds a fitting model is
    the trainer's preflight (``components.train.preflight.model_problem``).
    """
    if isinstance(model, str) and (model in MODELS or ENTRY_POINT.match(model)):
        return None
    return (
        f"{label} must be one of the built-in models {', '.join(MODELS)} or a Python entry "
        f"point 'package.module:function' (a function (input_shape, num_classes) -> Keras "
        f"model), got {model!r}"
    )


def _number_problems(p: Mapping[str, Any], label: Mapping[str, str]) -> list[str]:
    problems = []
    for name, minimum in MINIMUMS.items():
        value = p.get(name)
        if value is not None and (isinstance(value, bool) or not value >= minimum):
            problems.append(f"{label.get(name, name)} must be >= {minimum}, got {value!r}")
    if "learning_rate" in p and not 0 < p["learning_rate"] <= 10:
        rate = label.get("learning_rate", "learning_rate")
        problems.append(f"{rate} must be in (0, 10], got {p['learning_rate']!r}")
    if "min_accuracy" in p and not 0 <= p["min_accuracy"] <= 1:
        problems.append(f"min_accuracy must be in [0, 1], got {p['min_accuracy']!r}")
    for name in QUANTITY_PARAMETERS:
        if name in p and not is_positive_quantity(p[name]):
            problems.append(
                f"{label.get(name, name)} must be a positive Kubernetes quantity like '2', "
                f"'500m' or '4Gi', got {p[name]!r}"
            )
    return problems


def _text_problems(p: Mapping[str, Any], label: Mapping[str, str]) -> list[str]:
    problems = []
    backend = p.get("training_backend")
    if backend is not None and backend not in TRAINING_BACKENDS:
        problems.append(
            f"training_backend must be one of {', '.join(TRAINING_BACKENDS)}, got {backend!r}"
        )
    if "data_source" in p:
        problems.append(data_source_problem(p["data_source"]) or "")
    if p.get("data_sha256") is not None:
        problems.append(data_sha256_problem(p["data_sha256"]) or "")
    model_name = p.get("model_name")
    if model_name is not None and not _MODEL_NAME.match(model_name):
        problems.append(
            "model_name must be 1-63 lowercase letters, digits, '.', '_' or '-', "
            f"got {model_name!r}"
        )
    compression = p.get("compression")
    if compression is not None and compression not in COMPRESSIONS:
        rule = label.get("compression", "compression")
        problems.append(f"{rule} must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
    if "registry_root" in p and not p["registry_root"]:
        problems.append(
            "registry_root is empty: set it to the model store the run registers its model in, "
            "a gs:// folder such as gs://my-bucket/kfp-horovod/models (or a local path for a "
            "local run)"
        )
    return [problem for problem in problems if problem]


def parameter_problems(
    params: Mapping[str, Any], labels: Mapping[str, str] | None = None
) -> list[str]:
    """Every problem with `params`, each naming its parameter (as `labels` calls it, if given).

    Only the parameters present are checked; ``None`` means "not set".
    """
    labels = labels or {}
    return (
        _number_problems(params, labels)
        + _text_problems(params, labels)
        + _model_problems(params, labels)
        + _elastic_problems(params, labels)
        + _gpu_problems(params, labels)
    )


def _model_problems(p: Mapping[str, Any], label: Mapping[str, str]) -> list[str]:
    problems = []
    if p.get("model") is not None:
        problems.append(model_problem(p["model"], label.get("model", "model")) or "")
    augment = p.get("augment")
    if augment is not None and not isinstance(augment, bool):
        problems.append(f"{label.get('augment', 'augment')} must be true or false, got {augment!r}")
    if augment is True and p.get("jit_compile") is True:
        problems.append(
            f"{label.get('augment', 'augment')} cannot be combined with "
            f"{label.get('jit_compile', 'jit_compile')}: XLA has no CPU kernel for the "
            "augmentation's image transform (ImageProjectiveTransformV3)"
        )
    return [problem for problem in problems if problem]


def _elastic_problems(p: Mapping[str, Any], label: Mapping[str, str]) -> list[str]:
    """Elastic mode (``min_workers`` > 0): at least that many workers, at most ``workers``."""
    minimum = p.get("min_workers")
    if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum <= 0:
        return []
    name = label.get("min_workers", "min_workers")
    problems = []
    workers = p.get("workers")
    if isinstance(workers, int) and minimum > workers:
        problems.append(
            f"{name} must be <= {label.get('workers', 'workers')} (the most workers an elastic "
            f"job runs with), got {minimum} > {workers}"
        )
    passes = p.get("backward_passes_per_step")
    if isinstance(passes, int) and passes > 1:
        problems.append(
            f"{name} (elastic training) cannot be combined with "
            f"{label.get('backward_passes_per_step', 'backward_passes_per_step')} > 1: the "
            "gradients a rank has summed locally are not part of Horovod's elastic state"
        )
    return problems


def _gpu_problems(p: Mapping[str, Any], label: Mapping[str, str]) -> list[str]:
    """A worker's ranks each need a GPU of their own: ``slots_per_worker <= gpus_per_worker``."""
    gpus, slots = p.get("gpus_per_worker"), p.get("slots_per_worker")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (gpus, slots)):
        return []
    assert isinstance(gpus, int) and isinstance(slots, int)
    if 0 < gpus < slots:
        name = label.get("gpus_per_worker", "gpus_per_worker")
        return [
            f"{name} must be 0 (CPU) or >= {label.get('slots_per_worker', 'slots_per_worker')} "
            f"(each of a worker's ranks trains on a GPU of its own), got {gpus} < {slots}"
        ]
    return []


def check_parameters(params: Mapping[str, Any], labels: Mapping[str, str] | None = None) -> None:
    """Raise ValueError listing every bad parameter by name."""
    problems = parameter_problems(params, labels)
    if problems:
        raise ValueError("invalid pipeline parameters: " + "; ".join(problems))
