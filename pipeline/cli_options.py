"""Click options made from declared parameters (`components.common.declare`): one option per
parameter, ``--<name-with-dashes>``, with its type, default, choices and help."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from components.common.declare import Declared

F = TypeVar("F", bound=Callable[..., Any])


def option(p: Declared, default: Any = None) -> Callable[[F], F]:
    """The click option of `p` (`default` overrides the declared one); a switch for a bool."""
    flag = f"{p.flag}/--no-{p.flag[2:]}" if p.type is bool else p.flag
    kind = click.Choice(list(p.rule.choices)) if p.rule.choices else p.type
    if p.required and default is None:
        return click.option(flag, p.name, type=kind, required=True, help=p.help)
    value = p.default if default is None else default
    return click.option(flag, p.name, type=kind, default=value, help=p.help, show_default=True)


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying `decorators` in the order written (the first is outermost)."""

    def apply(func: F) -> F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


def declared_options(
    params: Sequence[Declared], defaults: dict[str, Any] | None = None
) -> Callable[[F], F]:
    """One decorator adding an option per parameter, in the order declared (`defaults`
    overriding the declared ones by name)."""
    return options(*(option(p, (defaults or {}).get(p.name)) for p in params))
