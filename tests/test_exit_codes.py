"""The exit codes: docs/operating.md's table is `ExitCode`, each code with one meaning, and no
module of the project spells a code of its own (a literal where the table's name belongs)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from components.common.failure import SIGNAL_BASE, ExitCode

ROOT = Path(__file__).resolve().parents[1]
CODE = re.compile(r"^\d+( \+ N)?$")  # a code, or a signal's 128 + N
NAME = re.compile(r"^(`[A-Z_]+`)?$")


def documented() -> dict[str, tuple[str, str]]:
    """docs/operating.md's exit-code table: code -> (name, meaning)."""
    text = (ROOT / "docs" / "operating.md").read_text()
    section = text.split("\n### Exit codes\n", 1)[1].split("\n#", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert lines[:2] == ["| exit | name | meaning |", "|---|---|---|"]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert all(len(r) == 3 and CODE.match(r[0]) and NAME.match(r[1]) and r[2] for r in rows), rows
    table = {code: (name.strip("`"), meaning) for code, name, meaning in rows}
    assert len(table) == len(rows)  # no code twice
    return table


def test_the_documented_table_is_the_code_table() -> None:
    table = documented()
    assert {code: name for code, (name, _) in table.items() if name} == {
        str(code.value): code.name for code in ExitCode
    }
    assert table[f"{SIGNAL_BASE} + N"][0] == ""  # ended by a signal: mpirun's own code
    meanings = [meaning for _, meaning in table.values()]
    assert len(set(meanings)) == len(meanings)


def literal_exit_codes(path: Path) -> list[str]:
    """Where `path` gives a process a non-zero exit code as a number: ``main`` returning one,
    ``SystemExit(n)`` or ``sys.exit(n)``, an ``exit_code`` or ``EXIT_*`` assigned one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        numbers: list[ast.AST] = []
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            numbers += [sub.value for sub in ast.walk(node) if isinstance(sub, ast.Return)]
        elif isinstance(node, ast.Call):
            if ast.unparse(node.func) in ("SystemExit", "sys.exit", "exit"):
                numbers += node.args[:1]
            numbers += [kw.value for kw in node.keywords if kw.arg == "exit_code"]
        elif isinstance(node, ast.Assign):
            names = [ast.unparse(target) for target in node.targets]
            if any(n.startswith("EXIT_") or n.endswith("exit_code") for n in names):
                numbers.append(node.value)
        found += [
            f"{path.relative_to(ROOT)}:{number.lineno}: {number.value}"
            for number in numbers
            if isinstance(number, ast.Constant) and type(number.value) is int and number.value
        ]
    return found


def test_no_module_spells_an_exit_code_of_its_own() -> None:
    sources = [
        path
        for folder in ("components", "pipeline")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "tests" not in path.relative_to(ROOT).parts
    ]
    assert len(sources) > 50
    assert [found for path in sources for found in literal_exit_codes(path)] == []
