"""One declaration per parameter, and the rules every caller checks it by.

A dataclass field made with `param` carries its name, type, default, help and rule; from the
fields of a declared dataclass (`TrainConfig`, the steps' configs) come the pipeline's
signature, the components' KFP signatures, the check step, the trainer's command line and the
CLIs' options. `check` runs each field's rule and the rules that join several fields
(`joint_problems`) wherever values enter, so every caller refuses the same values with the same
words.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, get_origin, get_type_hints

from components.common.defaults import BUNDLED_SOURCE, MODELS
from components.common.failure import InputError

_MISSING: Any = dataclasses.MISSING
# Kubernetes' own quantity grammar (k8s.io/apimachinery/pkg/api/resource), as a regex.
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
TRAINING_BACKENDS = ("auto", "local", "mpijob", "trainjob")
LR_SCALINGS = ("linear", "sqrt", "none")  # components/train/rank/trainer.py
# Malladi's square-root rule sets beta_1 = 1 - k (1 - 0.9): above 9 ranks it is not an Adam.
SQRT_MAX_WORLD_SIZE = 9
_MODEL_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_SOURCE_FORMS = "'bundled', a gs:// or http(s) URL, or an absolute path"
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
# A user's model: ``package.module:function`` (dotted module path, one function name).
ENTRY_POINT = re.compile(rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}$")


def is_positive_quantity(value: object) -> bool:
    """True for a Kubernetes quantity above zero ('2', '500m', '4Gi', '1e3', '.5')."""
    text = str(value)
    if not QUANTITY.match(text) or text.startswith("-"):
        return False
    mantissa = re.match(r"^\+?([0-9.]+)", text)
    return mantissa is not None and float(mantissa.group(1)) > 0


@dataclass(frozen=True)
class Rule:
    """What a value must be: at least `minimum`, above `above`, at most `maximum`, one of
    `choices`, a positive Kubernetes `quantity`, or what `check` (value -> why not) accepts."""

    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    choices: tuple[str, ...] = ()
    quantity: bool = False
    check: Callable[[Any], str | None] | None = None

    def problem(self, name: str, value: Any) -> str | None:
        """Why `value` breaks the rule (naming `name`), or None."""
        if value is None:
            return None
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if self.minimum is not None and not (number and value >= self.minimum):
            return f"{name} must be >= {_num(self.minimum)}, got {value!r}"
        if self.above is not None and not (number and value > self.above):
            return f"{name} must be > {_num(self.above)}, got {value!r}"
        if self.maximum is not None and not (number and value <= self.maximum):
            return f"{name} must be <= {_num(self.maximum)}, got {value!r}"
        if self.choices and value not in self.choices:
            return f"{name} must be one of {', '.join(self.choices)}, got {value!r}"
        if self.quantity and not is_positive_quantity(value):
            return (
                f"{name} must be a positive Kubernetes quantity like '2', '500m' or '4Gi', "
                f"got {value!r}"
            )
        found = self.check(value) if self.check else None
        return found if found is None or found.startswith(name) else f"{name} {found}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def param(
    default: Any = _MISSING,
    help: str = "",
    *,
    pipeline: bool = True,
    kw_only: bool = False,
    **rule: Any,
) -> Any:
    """A declared field: its default (a dict or a list: a copy for each instance), its help
    text, whether the pipeline exposes it, its `Rule`'s keywords, and `kw_only` (a required
    field declared after fields with defaults: a keyword argument of the dataclass)."""
    metadata = {"help": help, "pipeline": pipeline, "rule": Rule(**rule)}
    if isinstance(default, dict | list):
        return dataclasses.field(
            default_factory=lambda: copy.deepcopy(default), metadata=metadata, kw_only=kw_only
        )
    return dataclasses.field(default=default, metadata=metadata, kw_only=kw_only)


@dataclass(frozen=True)
class Declared:
    """One declared parameter, as the generators see it."""

    name: str
    type: type
    default: Any
    help: str
    pipeline: bool
    rule: Rule

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def declared(cls: type, pipeline_only: bool = False) -> list[Declared]:
    """The declared fields of dataclass `cls`, in order (`pipeline_only`: those the pipeline
    exposes)."""
    hints = get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if "rule" not in f.metadata:
            continue
        # ``str | None`` declares a ``str``; ``dict[str, str]`` a ``dict``
        made: Any = f.default_factory  # _MISSING, or what makes each default
        hint = hints[f.name]
        args = [a for a in getattr(hint, "__args__", ()) if a is not type(None)]
        kind = get_origin(hint) if get_origin(hint) in (dict, list) else (args or [hint])[0]
        item = Declared(
            f.name,
            kind,
            f.default if made is _MISSING else made(),
            f.metadata["help"],
            f.metadata["pipeline"],
            f.metadata["rule"],
        )
        if item.pipeline or not pipeline_only:
            out.append(item)
    return out


def field_problems(params: Sequence[Declared], values: Mapping[str, Any]) -> list[str]:
    """Every per-field rule of `params` that a value present in `values` breaks."""
    problems = []
    for p in params:
        if p.name in values:
            value = values[p.name]
            if p.type is bool and value is not None and not isinstance(value, bool):
                problems.append(f"{p.name} must be true or false, got {value!r}")
            elif problem := p.rule.problem(p.name, value):
                problems.append(problem)
    return problems


def add_arguments(parser: argparse.ArgumentParser, params: Sequence[Declared]) -> None:
    """One argparse option per parameter (a bool: ``--<name>``/``--no-<name>``)."""
    for p in params:
        kwargs: dict[str, Any] = {"help": p.help, "dest": p.name}
        if p.type is bool:
            kwargs.update(action=argparse.BooleanOptionalAction, default=p.default)
        elif p.required:
            kwargs.update(type=p.type, required=True)
        else:
            kwargs.update(type=p.type, default=p.default)
        parser.add_argument(p.flag, **kwargs)


# The named rules a declared field's ``check=`` may name.


def nonempty_problem(value: object) -> str | None:
    return None if str(value).strip() else "is empty"


def data_source_problem(source: str) -> str | None:
    if source in ("bundled", BUNDLED_SOURCE):
        return None
    if not source:
        return f"data_source must be {_SOURCE_FORMS}: the data source is empty"
    scheme, sep, _ = source.partition("://")
    if sep and scheme not in ("http", "https", "gs"):
        return f"data_source must be {_SOURCE_FORMS}: unsupported scheme {scheme!r} in {source!r}"
    if not sep and not source.startswith("/"):
        return f"data_source must be {_SOURCE_FORMS}; got {source!r}"
    return None


def data_sha256_problem(sha256: str) -> str | None:
    if sha256.lower() == "none" or _SHA256.match(sha256):
        return None
    return f"data_sha256 {sha256!r} is not 64 hex digits (or 'none')"


def model_problem(model: object) -> str | None:
    """Why `model` is neither a built-in model nor a ``package.module:function`` entry point.
    Only the form: whether it builds a fitting model is the trainer's preflight."""
    if isinstance(model, str) and (model in MODELS or ENTRY_POINT.match(model)):
        return None
    return (
        f"model must be one of the built-in models {', '.join(MODELS)} or a Python entry "
        f"point 'package.module:function' (a function (input_shape, num_classes) -> Keras "
        f"model), got {model!r}"
    )


def model_name_problem(name: str) -> str | None:
    if _MODEL_NAME.match(name):
        return None
    return f"model_name must be 1-63 lowercase letters, digits, '.', '_' or '-', got {name!r}"


def registry_root_problem(root: str) -> str | None:
    if root:
        return None
    return (
        "registry_root is empty: set it to the model store the run registers its model in, "
        "a gs:// folder such as gs://my-bucket/kfp-horovod/models (or a local path for a "
        "local run)"
    )


def elastic_backend_problem(backend: str, min_workers: int | None) -> str | None:
    """Why an elastic job cannot run on `backend`: Kubeflow Trainer v2 has no host discovery."""
    if backend != "trainjob" or not min_workers:
        return None
    return (
        f"min_workers={min_workers}: elastic training needs mpi-operator's discover_hosts.sh, "
        "which Kubeflow Trainer v2 does not provide; use training_backend 'mpijob' (or "
        "min_workers 0) instead of 'trainjob'"
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def joint_problems(p: Mapping[str, Any]) -> list[str]:
    """The rules across parameters, each checked only when its parameters are present."""
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


def check(params: Sequence[Declared], values: Mapping[str, Any], what: str, *more: str) -> None:
    """Raise ValueError "invalid `what`: ..." listing every bad value of `values` by name: each
    declared field's rule, then the joint rules (and the `more` problems its caller found)."""
    if found := [*field_problems(params, values), *joint_problems(values), *more]:
        raise InputError(f"invalid {what}: " + "; ".join(found))


class Validated:
    """A mixin for a declared dataclass: making one checks every rule (ValueError "invalid
    <what>: ..." naming each bad value, and what `part_problems` finds across its parts)."""

    what: ClassVar[str] = "parameters"

    def part_problems(self) -> list[str]:
        return []

    def __post_init__(self) -> None:
        fields = declared(type(self))
        values = {p.name: getattr(self, p.name) for p in fields}
        check(fields, values, self.what, *self.part_problems())
