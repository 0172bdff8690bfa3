"""Where a cluster job's pods run: a node selector and tolerations (`Placement`, declared once for
the pipeline's ``node_selector`` and ``tolerations`` and the render commands' options), and
their rules. Runs in the pipeline's CLI and in the train step's pod.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from components.common.declare import Validated, param

# The pipeline's ``node_selector`` and ``tolerations`` are KFP ``dict`` and ``list`` parameters that
# the pipeline sets on the train task with kfp-kubernetes. `node_selector_problem` and
# `tolerations_problem` are their rules: one line naming the offending key or field.
#
# Checked here, not left to KFP or the kubernetes client: KFP's driver decodes a toleration into
# Kubernetes' type without a check (an unknown field is dropped, ``json.Unmarshal``), a label key is
# refused only when a pod is made, after the job was created, and the CLIs keep the ``kubernetes``
# package and jsonschema out of their imports (tests/test_cli_imports.py).
#
# Kubernetes' qualified name (k8s.io/apimachinery validation): [prefix/]name.
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
TOLERATION_FIELDS = ("key", "operator", "value", "effect", "tolerationSeconds")
OPERATORS = ("Exists", "Equal")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute", "")
NODE_SELECTOR_HELP = (
    "a JSON object of node label -> value every pod that runs a rank must match, e.g. "
    '{"cloud.google.com/gke-accelerator": "nvidia-l4"}; {}: none'
)
TOLERATIONS_HELP = (
    'a JSON list of Kubernetes tolerations for every pod that runs a rank, e.g. [{"key": '
    '"team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]; GPU pods also get '
    "the nvidia.com/gpu toleration"
)


def label_key_problem(key: object) -> str | None:
    if not isinstance(key, str):
        return f"label key {key!r} is not a string"
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (prefix and len(prefix) <= 253 and DNS_SUBDOMAIN.match(prefix)):
        return f"label key {key!r}: its prefix must be a lower-case DNS subdomain of <= 253 chars"
    if not (len(name) <= 63 and _NAME.match(name)):
        return (
            f"label key {key!r}: its name must be <= 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit"
        )
    return None


def label_value_problem(key: str, value: object) -> str | None:
    if not isinstance(value, str) or len(value) > 63 or (value and not _NAME.match(value)):
        return (
            f"label {key!r}: value {value!r} is not a label value (<= 63 letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit)"
        )
    return None


def node_selector_problem(selector: object) -> str | None:
    if not isinstance(selector, dict):
        return f"node_selector must be a JSON object of label -> value, got {selector!r}"
    for key, value in selector.items():
        found = label_key_problem(key) or label_value_problem(key, value)
        if found:
            return f"node_selector: {found}"
    return None


def toleration_problem(toleration: object) -> str | None:
    if not isinstance(toleration, dict):
        return f"{toleration!r} is not an object"
    unknown = sorted(set(toleration) - set(TOLERATION_FIELDS))
    if unknown:
        return f"unknown field {unknown[0]!r} (known: {', '.join(TOLERATION_FIELDS)})"
    operator, key = toleration.get("operator", "Equal"), toleration.get("key", "")
    if operator not in OPERATORS:
        return f"operator {operator!r} is not one of {', '.join(OPERATORS)}"
    if toleration.get("effect", "") not in EFFECTS:
        effects = ", ".join(repr(e) for e in EFFECTS)
        return f"effect {toleration['effect']!r} is not one of {effects}"
    if key and (problem := label_key_problem(key)):
        return f"key: {problem}"
    if not key and operator != "Exists":
        return "an empty key needs operator 'Exists'"
    value = toleration.get("value", "")
    if operator == "Exists" and value:
        return f"operator 'Exists' takes no value, got {value!r}"
    if value and (problem := label_value_problem(str(key), value)):
        return f"value: {problem}"
    seconds = toleration.get("tolerationSeconds")
    if seconds is not None and (not isinstance(seconds, int) or isinstance(seconds, bool)):
        return f"tolerationSeconds must be an integer, got {seconds!r}"
    return None


def tolerations_problem(tolerations: object) -> str | None:
    if not isinstance(tolerations, list):
        return f"tolerations must be a JSON list of tolerations, got {tolerations!r}"
    for i, toleration in enumerate(tolerations):
        if found := toleration_problem(toleration):
            return f"tolerations[{i}]: {found}"
    return None


@dataclass(frozen=True)
class Placement(Validated):
    """The node selector and tolerations of every pod that runs a rank (and of the MPIJob's
    launcher); making one checks both."""

    what = "placement"

    node_selector: dict[str, str] = param({}, NODE_SELECTOR_HELP, check=node_selector_problem)
    tolerations: list[dict[str, Any]] = param([], TOLERATIONS_HELP, check=tolerations_problem)


def merge_tolerations(*groups: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tolerations of `groups`, in order, each once as Kubernetes reads it (operator Equal
    when unset, empty fields dropped)."""
    unique: dict[str, dict[str, Any]] = {}
    for toleration in (t for group in groups for t in group):
        full = {"operator": "Equal", **{k: v for k, v in toleration.items() if v not in ("", None)}}
        unique.setdefault(json.dumps(full, sort_keys=True), dict(toleration))
    return list(unique.values())
