"""The train component's rooms match its processes (components/train/README.md): what each rank
runs (``rank/``) imports nothing of the launcher's (``launcher/``) or the KFP step's pod
(``step/``), and the launcher nothing of the step's; ``components/common/`` imports no step.
Every import counts, a function's own (the lazy ones) included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "components" / "train"
STEPS = ("components.data_prep", "components.evaluate", "components.register", "components.serve")


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (``from a import b`` counts a and a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def product_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "tests" not in p.relative_to(ROOT).parts)


@pytest.mark.parametrize(
    ("room", "forbidden"),
    [
        ("rank", ("components.train.launcher", "components.train.step")),
        ("launcher", ("components.train.step",)),
    ],
)
def test_a_room_imports_nothing_of_the_rooms_above_it(
    room: str, forbidden: tuple[str, ...]
) -> None:
    files = product_files(TRAIN / room)
    assert len(files) > 3, files  # the room is there
    wrong = {
        f"{path.relative_to(ROOT)} imports {module}"
        for path in files
        for module in imported_modules(path)
        if module.startswith(forbidden)
    }
    assert wrong == set()


def test_common_imports_no_step() -> None:
    wrong = {
        f"{path.relative_to(ROOT)} imports {module}"
        for path in product_files(ROOT / "components" / "common")
        for module in imported_modules(path)
        if module.startswith(("components.train", *STEPS))
    }
    assert wrong == set()


def test_the_scan_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from components.train.launcher import launch\n")
    assert "components.train.launcher.launch" in imported_modules(module)
