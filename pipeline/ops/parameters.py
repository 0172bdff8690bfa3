"""Typed pipeline parameters: what a compiled spec declares, and ``NAME=VALUE`` parsed to match.

Runs and schedules both take their arguments from here, so a typo or a wrong type stops the
command, naming the parameter, before anything is created.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.ops.errors import ParameterError


def unwrap_spec(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return the PipelineSpec from a version's ``pipeline_spec`` (maybe wrapped with a
    platform spec as ``{"pipeline_spec": ..., "platform_spec": ...}``)."""
    if "root" not in spec and isinstance(spec.get("pipeline_spec"), Mapping):
        return spec["pipeline_spec"]
    return spec


@dataclass(frozen=True)
class ParameterDecl:
    """One declared pipeline input parameter."""

    name: str
    type: str  # STRING, NUMBER_INTEGER, NUMBER_DOUBLE, BOOLEAN, LIST, STRUCT
    required: bool


def declared_parameters(spec: Mapping[str, Any]) -> dict[str, ParameterDecl]:
    """Return the pipeline's input parameters from ``root.inputDefinitions.parameters``."""
    params = unwrap_spec(spec).get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    declared = {}
    for name, decl in (params or {}).items():
        required = not decl.get("isOptional", False) and "defaultValue" not in decl
        declared[name] = ParameterDecl(name, str(decl.get("parameterType", "STRING")), required)
    return declared


_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


def _boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError("expected true or false")


def _json(raw: str, kind: str) -> Any:
    value = json.loads(raw)
    wanted = list if kind == "LIST" else dict
    if not isinstance(value, wanted):
        raise ValueError(f"expected a JSON {'array' if kind == 'LIST' else 'object'}")
    return value


def coerce_parameter(decl: ParameterDecl, raw: str) -> Any:
    """Convert the command-line string `raw` to the Python value `decl` declares."""
    kind = decl.type
    try:
        if kind == "NUMBER_INTEGER":
            return int(raw)
        if kind == "NUMBER_DOUBLE":
            return float(raw)
        if kind == "BOOLEAN":
            return _boolean(raw)
        if kind in ("LIST", "STRUCT"):
            return _json(raw, kind)
    except ValueError as exc:
        raise ParameterError(
            f"parameter {decl.name!r} is declared {kind} but got {raw!r}: {exc}"
        ) from exc
    return raw


def parse_parameters(
    pairs: Sequence[str], declared: Mapping[str, ParameterDecl], *, check_required: bool = True
) -> dict[str, Any]:
    """Parse ``k=v`` strings into typed pipeline arguments, checked against `declared`.

    Unknown names, duplicates, malformed pairs and (with `check_required`) missing required
    parameters are errors that name every offending parameter.
    """
    values: dict[str, Any] = {}
    unknown: list[str] = []
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ParameterError(f"bad parameter {pair!r}: expected NAME=VALUE")
        if name in values:
            raise ParameterError(f"parameter {name!r} is given more than once")
        if name not in declared:
            unknown.append(name)
            values[name] = raw
            continue
        values[name] = coerce_parameter(declared[name], raw)
    if unknown:
        known = ", ".join(sorted(declared)) or "(none)"
        raise ParameterError(
            f"unknown pipeline parameter(s): {', '.join(sorted(unknown))}; "
            f"the pipeline declares: {known}"
        )
    if check_required:
        missing = sorted(n for n, d in declared.items() if d.required and n not in values)
        if missing:
            raise ParameterError(f"missing required pipeline parameter(s): {', '.join(missing)}")
    return values
