"""Borders: ``python -m pipeline`` loads the Kubernetes client and the schema checker only for
the command that needs them (render-mpijob validates against the CRD; nothing else does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import runpy, sys
sys.argv = ["pipeline", *{args!r}]
try:
    runpy.run_module("pipeline", run_name="__main__")
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("kubernetes", "jsonschema") if m in sys.modules)
print("HEAVY=" + ",".join(heavy), "EXIT=" + str(code), file=sys.stderr)
"""


def loaded(*args: str) -> tuple[str, str]:
    """The heavy modules ``python -m pipeline ARGS`` imported, and its exit code."""
    proc = python_c(PROBE.format(args=list(args)))
    last = proc.stderr.strip().splitlines()[-1]
    heavy, code = (part.split("=", 1)[1] for part in last.split())
    return heavy, code


@pytest.mark.parametrize("args", [["--help"], ["compile", "--help"], ["render-mpijob", "--help"]])
def test_help_does_not_import_jsonschema(args: list[str]) -> None:
    heavy, code = loaded(*args)
    assert code == "0"
    assert "jsonschema" not in heavy.split(",")


def test_help_does_not_import_kubernetes() -> None:
    heavy, code = loaded("--help")
    assert code == "0"
    assert "kubernetes" not in heavy.split(",")


def python_c(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter at the project root."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_cli_modules_of_this_project_import_neither() -> None:
    """Everything ``python -m pipeline`` loads at start-up except pipeline/ops*.py."""
    proc = python_c(
        "import sys, pipeline.build_cli, pipeline.render_cli, pipeline.serve_cli, "
        "components.train.cluster, "
        "components.train.cluster.mpijob, components.train.config; "
        "heavy = [m for m in ('kubernetes', 'jsonschema') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    assert proc.returncode == 0, proc.stderr


def test_the_probe_sees_them_when_a_manifest_is_validated() -> None:
    heavy, code = loaded("render-mpijob", "--workers", "2")
    assert code == "0"
    assert "jsonschema" in heavy.split(",")


def test_mpijob_package_exports_nothing_eagerly() -> None:
    proc = python_c(
        "import sys, components.train.cluster as m; "
        "assert not [n for n in vars(m) if not n.startswith('__')], vars(m); "
        "assert 'kubernetes' not in sys.modules and 'jsonschema' not in sys.modules"
    )
    assert proc.returncode == 0, proc.stderr
