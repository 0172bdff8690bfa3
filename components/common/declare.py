"""One declaration per parameter (`param`: its name, type, default, help and rule), and the
machinery every process that takes parameters shares: `check`, `Validated`, and click options
(`declared_options`, `run_command`). The declared classes own their rules (`joint_problems`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, get_origin, get_type_hints

import click

from components.common.failure import InputError

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


# The named rules a declared field's ``check=`` may name.


def nonempty_problem(value: object) -> str | None:
    return None if str(value).strip() else "is empty"


JointRules = Callable[[Mapping[str, Any]], list[str]]


def check(
    params: Sequence[Declared],
    values: Mapping[str, Any],
    what: str,
    joint: Sequence[JointRules] = (),
    more: Sequence[str] = (),
) -> None:
    """Raise InputError "invalid `what`: ..." listing every bad value of `values` by name: each
    declared field's rule, then each of the `joint` rules across fields (and the `more`
    problems its caller found)."""
    found = [*field_problems(params, values), *(f for rules in joint for f in rules(values)), *more]
    if found:
        raise InputError(f"invalid {what}: " + "; ".join(found))


class Validated:
    """A mixin for a declared dataclass: making one checks every rule (ValueError "invalid
    <what>: ..." naming each bad value, and what `part_problems` finds across its parts)."""

    what: ClassVar[str] = "parameters"

    @staticmethod
    def joint_problems(values: Mapping[str, Any]) -> list[str]:
        """The rules across this class's fields (and others' in `values`, as the pipeline's
        check passes them all), each checked only when its fields are present."""
        return []

    def part_problems(self) -> list[str]:
        return []

    @classmethod
    def parameters(cls, pipeline_only: bool = False) -> list[Declared]:
        """The class's declared fields, in order (`pipeline_only`: those the pipeline exposes)."""
        return declared(cls, pipeline_only)

    def __post_init__(self) -> None:
        fields = declared(type(self))
        values = {p.name: getattr(self, p.name) for p in fields}
        check(fields, values, self.what, [self.joint_problems], self.part_problems())


def json_value(name: str, text: str, empty: Any = None) -> Any:
    """The value of a ``dict`` or ``list`` parameter given as JSON text on a command line
    (`empty` for blank text or null); InputError naming `name` when it is not JSON."""
    try:
        value = json.loads(text) if text.strip() else None
    except json.JSONDecodeError as exc:
        raise InputError(f"{name} is not JSON ({exc.msg} at char {exc.pos}): {text!r}") from exc
    return empty if value is None else value


class JsonText(click.ParamType):
    """A ``dict`` or ``list`` parameter's value, given as JSON text (its declared rule checks
    its kind; blank text: `kind`'s empty value); text that is not JSON ends the command in one
    line naming the parameter."""

    name = "json"

    def __init__(self, kind: type | None = None) -> None:
        self.kind = kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default
            return value
        return json_value(str(param and param.name), value, self.kind and self.kind())


def declared_options(
    params: Sequence[Declared], overrides: dict[str, Any] | None = None, choices: bool = True
) -> Any:
    """A click decorator: one option per parameter, in the order declared (`overrides`
    replacing the declared defaults by name); a switch ``--x/--no-x`` for a bool. `choices`:
    click refuses a value outside a field's choices (False: the field's rule does, in the
    words every other caller of the rule uses)."""
    overrides = overrides or {}

    def apply(func: Callable[..., Any]) -> Callable[..., Any]:
        for p in reversed(params):
            flag = f"{p.flag}/--no-{p.flag[2:]}" if p.type is bool else p.flag
            listed = choices and p.rule.choices
            kind: Any = click.Choice(list(p.rule.choices)) if listed else p.type
            kind = JsonText(p.type) if p.type in (dict, list) else kind
            default = overrides.get(p.name, p.default)
            if p.required and p.name not in overrides:
                func = click.option(flag, p.name, type=kind, required=True, help=p.help)(func)
            else:
                func = click.option(
                    flag, p.name, type=kind, default=default, help=p.help, show_default=True
                )(func)
        return func

    return apply


def run_command(
    command: click.Command, argv: Sequence[str] | None = None, prog: str | None = None
) -> Any:
    """Run a click command as a program's ``main``: what its callback returns (an exit code, or
    a value); ``--help``, its exit code 0; a bad command line, click's usage and error lines
    on stderr and exit code 2. Not click's standalone mode, which exits even on success."""
    try:
        args = None if argv is None else list(argv)
        return command.main(args=args, prog_name=prog, standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
