"""The parameter rules that are more than a bound: the forms of a data source, a digest, a model
and a model name, and the rules that join several parameters.

A declared field (`components.common.declare.param`) names its rule: a bound, a choice, or one
of the ``*_problem`` checks here. `joint_problems` holds the rules across fields. `check` runs
both, wherever values enter: the pipeline's check step, the CLIs, the trainer's `TrainConfig`,
the MPIJob's parameters and data prep, so every caller refuses the same values with the same
words.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from components.common.declare import Declared, declared, field_problems
from components.common.defaults import BUNDLED_SOURCE, MODELS

TRAINING_BACKENDS = ("auto", "local", "mpijob", "trainjob")
SOURCE_SCHEMES = ("http", "https", "gs")
LR_SCALINGS = ("linear", "sqrt", "none")  # components/train/trainer.py
# Malladi's square-root rule sets beta_1 = 1 - k (1 - 0.9): above 9 ranks it is not an Adam.
SQRT_MAX_WORLD_SIZE = 9
_MODEL_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_SOURCE_FORMS = "'bundled', a gs:// or http(s) URL, or an absolute path"
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
# A user's model: ``package.module:function`` (dotted module path, one function name).
ENTRY_POINT = re.compile(rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}$")


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


def model_problem(model: object) -> str | None:
    """Why `model` is neither a built-in model nor a ``package.module:function`` entry point.

    Only the form is checked here: whether the entry point imports and builds a fitting model is
    the trainer's preflight (``components.train.preflight.model_problem``).
    """
    if isinstance(model, str) and (model in MODELS or ENTRY_POINT.match(model)):
        return None
    return (
        f"model must be one of the built-in models {', '.join(MODELS)} or a Python entry "
        f"point 'package.module:function' (a function (input_shape, num_classes) -> Keras "
        f"model), got {model!r}"
    )


def model_name_problem(name: str) -> str | None:
    """Why `name` cannot name a model in the registry, or None."""
    if _MODEL_NAME.match(name):
        return None
    return f"model_name must be 1-63 lowercase letters, digits, '.', '_' or '-', got {name!r}"


def registry_root_problem(root: str) -> str | None:
    """Why `root` cannot be the model store (only: empty), or None."""
    if root:
        return None
    return (
        "registry_root is empty: set it to the model store the run registers its model in, "
        "a gs:// folder such as gs://my-bucket/kfp-horovod/models (or a local path for a "
        "local run)"
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def elastic_backend_problem(backend: str, min_workers: int | None) -> str | None:
    """Why an elastic job (``min_workers`` > 0) cannot run on `backend`, or None: Kubeflow
    Trainer v2 has no host discovery (mpi-operator's ``discover_hosts.sh``)."""
    if backend != "trainjob" or not min_workers:
        return None
    return (
        f"min_workers={min_workers}: elastic training needs mpi-operator's discover_hosts.sh, "
        "which Kubeflow Trainer v2 does not provide; use training_backend 'mpijob' (or "
        "min_workers 0) instead of 'trainjob'"
    )


def joint_problems(p: Mapping[str, Any]) -> list[str]:
    """The rules across parameters (each checked only when its parameters are present):

    - an elastic job (``min_workers`` > 0) needs ``min_workers <= workers``, and a backend
      that can grow and shrink the job (`elastic_backend_problem`);
    - a GPU job needs a GPU per rank: ``slots_per_worker <= gpus_per_worker``;
    - ``lr_scaling`` ``sqrt`` works for at most `SQRT_MAX_WORLD_SIZE` ranks.
    """
    problems = []
    workers, slots = _int(p.get("workers")), _int(p.get("slots_per_worker")) or 1
    minimum, gpus = _int(p.get("min_workers")), _int(p.get("gpus_per_worker"))
    if minimum and workers is not None and minimum > workers:
        problems.append(
            "min_workers must be <= workers (the most workers an elastic job runs with), got "
            f"{minimum} > {workers}"
        )
    if elastic := elastic_backend_problem(p.get("training_backend", ""), minimum):
        problems.append(elastic)
    if gpus and gpus > 0 and gpus < slots:
        problems.append(
            f"gpus_per_worker must be 0 (CPU) or >= slots_per_worker (each of a worker's ranks "
            f"trains on a GPU of its own), got {gpus} < {slots}"
        )
    if p.get("lr_scaling") == "sqrt" and workers and workers * slots > SQRT_MAX_WORLD_SIZE:
        problems.append(
            f"lr_scaling 'sqrt' works for at most {SQRT_MAX_WORLD_SIZE} ranks (it sets Adam's "
            f"beta_1 = 1 - ranks x 0.1), got {workers * slots}"
        )
    return problems


def problems(params: Sequence[Declared], values: Mapping[str, Any]) -> list[str]:
    """Every problem with `values`: each declared field's rule, then the joint rules."""
    return field_problems(params, values) + joint_problems(values)


def check(params: Sequence[Declared], values: Mapping[str, Any], what: str = "parameters") -> None:
    """Raise ValueError listing every bad value of `values` by name."""
    found = problems(params, values)
    if found:
        raise ValueError(f"invalid {what}: " + "; ".join(found))


class Validated:
    """A mixin for a declared dataclass: making one checks every field's rule and the joint
    rules, and raises ValueError naming each bad value."""

    def __post_init__(self) -> None:
        fields = declared(type(self))
        check(fields, {p.name: getattr(self, p.name) for p in fields}, "parameters")
