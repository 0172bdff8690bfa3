"""Borders: ``python -m pipeline`` loads kfp, the Kubernetes client and the schema checker only
for the command that needs them (render-mpijob validates against the CRD; help needs none)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("kfp", "kubernetes", "jsonschema", "kserve", "tensorflow")
PROBE = """
import runpy, sys
sys.argv = ["pipeline", *{args!r}]
try:
    runpy.run_module("pipeline", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print("HEAVY=" + ",".join(m for m in {heavy!r} if m in sys.modules), "EXIT=" + str(code))
"""


@pytest.mark.parametrize(
    ("args", "present", "absent"),
    [
        (["--help"], [], HEAVY),
        (["compile", "--help"], [], HEAVY),
        (["render-mpijob", "--help"], [], HEAVY),
        (["submit", "--help"], [], HEAVY),  # the operations import kfp when they run
        (["render-inferenceservice", "--help"], [], HEAVY),
        (["render-mpijob", "--workers", "2"], ["jsonschema"], ["kfp"]),  # the probe sees them
    ],
)
def test_a_command_loads_only_what_it_needs(args: list[str], present: list, absent: list) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args, heavy=HEAVY)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    heavy, code = (part.split("=", 1)[1] for part in proc.stdout.splitlines()[-1].split())
    assert code == "0", proc.stderr
    assert set(present) <= set(heavy.split(",")) and not set(absent) & set(heavy.split(","))


def test_the_cluster_package_exports_nothing_eagerly() -> None:
    """Nor do the backend modules, the trainer's config and the serve modules load the heavy
    modules on import: KServe and TensorFlow load only in ``python -m components.serve``."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, components.train.launcher.cluster as m; "
         "assert not [n for n in vars(m) if not n.startswith('__')], vars(m); "
         "import components.train.launcher.cluster.mpijob, components.train.config; "
         "import components.serve.inferenceservice, components.serve.server; "
         "heavy = ('kubernetes', 'jsonschema', 'kserve', 'tensorflow'); "
         "assert not [h for h in heavy if h in sys.modules], sys.modules"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
