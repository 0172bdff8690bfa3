"""Checks of the pipeline's parameters, run before any work starts.

The same function runs in the pipeline's first step (so a run started from the UI or a
schedule fails at once) and in the CLI before a run is submitted.
"""

from __future__ import annotations

import re
from typing import Any

from components.common.defaults import BUNDLED_SOURCE

TRAINING_BACKENDS = ("local", "mpijob")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")
_MODEL_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")


def parameter_problems(params: dict[str, Any]) -> list[str]:
    """Every problem with the pipeline parameters, each naming its parameter."""
    p = params
    problems: list[str] = []

    def at_least(name: str, minimum: float) -> None:
        if name in p and not p[name] >= minimum:
            problems.append(f"{name} must be >= {minimum:g}, got {p[name]!r}")

    for name, minimum in (
        ("workers", 1), ("epochs", 1), ("batch_size_per_worker", 1), ("warmup_epochs", 0),
        ("threads_per_worker", 0), ("slots_per_worker", 1), ("gpus_per_worker", 0),
        ("shard_size", 1), ("data_limit", 0),
    ):  # fmt: skip
        at_least(name, minimum)
    if "learning_rate" in p and not 0 < p["learning_rate"] <= 10:
        problems.append(f"learning_rate must be in (0, 10], got {p['learning_rate']!r}")
    if "min_accuracy" in p and not 0 <= p["min_accuracy"] <= 1:
        problems.append(f"min_accuracy must be in [0, 1], got {p['min_accuracy']!r}")
    backend = p.get("training_backend")
    if backend is not None and backend not in TRAINING_BACKENDS:
        problems.append(
            f"training_backend must be one of {', '.join(TRAINING_BACKENDS)}, got {backend!r}"
        )
    source = p.get("data_source")
    if source is not None and not (
        source in ("bundled", BUNDLED_SOURCE)
        or source.startswith(("gs://", "http://", "https://", "/"))
    ):
        problems.append(
            "data_source must be 'bundled', a gs:// or http(s) URL, or an absolute path; "
            f"got {source!r}"
        )
    sha = p.get("data_sha256")
    if sha is not None and sha.lower() != "none" and not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
        problems.append(f"data_sha256 must be 64 hex digits or 'none', got {sha!r}")
    model_name = p.get("model_name")
    if model_name is not None and not _MODEL_NAME.match(model_name):
        problems.append(
            "model_name must be 1-63 lowercase letters, digits, '.', '_' or '-', "
            f"got {model_name!r}"
        )
    if "registry_root" in p and not p["registry_root"]:
        problems.append("registry_root is empty: give a gs:// URI or a path for the model store")
    for key in ("cpu_per_worker", "memory_per_worker"):
        if key in p and not _QUANTITY.match(str(p[key])):
            problems.append(
                f"{key} must be a Kubernetes quantity like '2', '500m' or '4Gi', got {p[key]!r}"
            )
    return problems


def check_parameters(params: dict[str, Any]) -> None:
    """Raise ValueError listing every bad parameter by name."""
    problems = parameter_problems(params)
    if problems:
        raise ValueError("invalid pipeline parameters: " + "; ".join(problems))
