"""One declaration per parameter: a dataclass field made with `param` carries its name, type,
default, help and rule; everything else is derived from it.

From the fields of a declared dataclass (`TrainConfig`, the train step's `StepConfig`, the
other steps' configs) come the pipeline's signature, the components' KFP signatures, the check
step, the trainer's command line and its parsing, and the CLIs' options. `field_problems`
checks each field's rule; the rules that join several fields live in
`components.common.params`.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_type_hints

_MISSING: Any = dataclasses.MISSING
# Kubernetes' own quantity grammar (k8s.io/apimachinery/pkg/api/resource), as a regex.
QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


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
    `choices`, a positive Kubernetes `quantity`, or what `check` (value -> why not, or None)
    accepts."""

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


def param(default: Any = _MISSING, help: str = "", *, pipeline: bool = True, **rule: Any) -> Any:
    """A declared field: its default, its help text, whether the pipeline exposes it, and its
    `Rule` (``minimum=``, ``maximum=``, ``above=``, ``choices=``, ``quantity=``,
    ``check=``)."""
    metadata = {"help": help, "pipeline": pipeline, "rule": Rule(**rule)}
    return dataclasses.field(default=default, metadata=metadata)


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
        item = Declared(
            f.name, _base_type(hints[f.name]), f.default, f.metadata["help"],
            f.metadata["pipeline"], f.metadata["rule"],
        )  # fmt: skip
        if item.pipeline or not pipeline_only:
            out.append(item)
    return out


def _base_type(hint: Any) -> type:
    """``int`` for ``int``; ``str`` for ``str | None``."""
    args = [a for a in getattr(hint, "__args__", ()) if a is not type(None)]
    return args[0] if args else hint


def field_problems(params: Sequence[Declared], values: Mapping[str, Any]) -> list[str]:
    """Every per-field rule of `params` that a value present in `values` breaks."""
    problems = []
    for p in params:
        if p.name in values:
            value = values[p.name]
            if p.type is bool and value is not None and not isinstance(value, bool):
                problems.append(f"{p.name} must be true or false, got {value!r}")
                continue
            problem = p.rule.problem(p.name, value)
            if problem:
                problems.append(problem)
    return problems


def add_arguments(parser: argparse.ArgumentParser, params: Sequence[Declared]) -> None:
    """One argparse option per parameter: ``--<name-with-dashes>`` of its type (a switch:
    ``--<name>``/``--no-<name>``), with its default and help."""
    for p in params:
        kwargs: dict[str, Any] = {"help": p.help, "dest": p.name}
        if p.type is bool:
            kwargs.update(action=argparse.BooleanOptionalAction, default=p.default)
        elif p.required:
            kwargs.update(type=p.type, required=True)
        else:
            kwargs.update(type=p.type, default=p.default)
        parser.add_argument(p.flag, **kwargs)
