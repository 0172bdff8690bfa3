"""Click options made from declared parameters (`components.common.declare`): one option per
parameter, ``--<name-with-dashes>``, with its type, default, choices and help."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from components.common.declare import Declared

F = TypeVar("F", bound=Callable[..., Any])


def option(p: Declared, default: Any = None) -> Callable[[F], F]:
    """The click option of `p` (`default` overrides the declared one)."""
    value = p.default if default is None else default
    kwargs: dict[str, Any] = {"help": p.help, "show_default": True}
    if p.type is bool:
        return click.option(f"{p.flag}/--no-{p.flag[2:]}", p.name, default=value, **kwargs)
    if p.rule.choices:
        kwargs["type"] = click.Choice(list(p.rule.choices))
    else:
        kwargs["type"] = p.type
    if p.required and default is None:
        return click.option(p.flag, p.name, required=True, **kwargs)
    return click.option(p.flag, p.name, default=value, **kwargs)


def declared_options(
    params: Sequence[Declared], defaults: dict[str, Any] | None = None
) -> Callable[[F], F]:
    """One decorator adding an option per parameter, in the order declared."""

    def apply(func: F) -> F:
        for p in reversed(params):
            func = option(p, (defaults or {}).get(p.name))(func)
        return func

    return apply


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying `decorators` in the order written (the first is outermost)."""

    def apply(func: F) -> F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply
