"""Every ``--flag`` a message of the product code names is a real option of one of its command
lines (or of a program it tells the user to run, `OTHER_PROGRAMS`): a mnist.npz sha256 mismatch
said "pass the right --sha256", a flag that does not exist (it is ``--data-sha256``).

Messages are the string constants of components/ and pipeline/ (not their tests) with words
around the flag (docstrings aside; a command line's own arguments are strings of one flag
alone). The options are read from the real parsers: every click command of the product code
(``python -m pipeline``'s and each program's), and horovodrun's argparse parser, caught as
``python -m components.train.launcher.launch`` parses."""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import re
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
# Flags of programs the messages tell the user to run, which the project does not parse.
OTHER_PROGRAMS = {"--logdir": "tensorboard --logdir"}


def product_files() -> list[Path]:
    found = [*ROOT.glob("components/**/*.py"), *ROOT.glob("pipeline/**/*.py")]
    return sorted(p for p in found if "tests" not in p.relative_to(ROOT).parts)


def named_flags() -> dict[str, list[str]]:
    """flag -> where a message names it (file:line)."""
    named: dict[str, list[str]] = {}
    for path in product_files():
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) in docstrings or " " not in node.value.strip():
                continue
            for flag in FLAG.findall(node.value):
                named.setdefault(flag, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return named


class _Parsed(Exception):
    """Raised instead of parsing: the parser was caught."""


def click_commands() -> list[click.Command]:
    """Every click command the product modules define (a group's commands too)."""
    found: list[click.Command] = []
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in product_files()}
    for module in sorted(m for m in modules if not m.endswith("__main__")):  # those run at import
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, click.Group):
                found += value.commands.values()
            elif isinstance(value, click.Command):
                found.append(value)
    return found


def real_options(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    options: set[str] = set()
    commands = click_commands()
    names = {c.name for c in commands}
    assert {"compile", "run-local", "trainer", "command"} <= names, names  # the scan sees them
    for command in commands:
        for param in command.params:
            if isinstance(param, click.Option):
                options |= {*param.opts, *param.secondary_opts}
    parsers: list[argparse.ArgumentParser] = []

    def caught(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        parsers.append(self)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", caught)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", caught)
    with contextlib.suppress(_Parsed):
        importlib.import_module("components.train.launcher.launch").main([])  # horovodrun's
    assert len(parsers) == 1, [p.prog for p in parsers]
    for parser in parsers:
        for action in parser._actions:
            options |= {o for o in action.option_strings if o.startswith("--")}
    return options


def test_every_flag_a_message_names_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    named = named_flags()
    assert "--data-sha256" in named and "--registry-root" in named  # the scan sees messages
    known = real_options(monkeypatch) | set(OTHER_PROGRAMS)
    assert {"--data-sha256", "--min-np", "--silence-seconds", "--root"} <= known
    unknown = {flag: where for flag, where in named.items() if flag not in known}
    assert unknown == {}, f"messages name flags no command has: {unknown}"
