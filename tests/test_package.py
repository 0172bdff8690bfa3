"""pyproject.toml declares what the package needs: its core dependencies and the `pipeline` extra
cover every module that compiling the pipeline and its command line import (docs/versions.md),
so ``pip install '.[pipeline]'`` is enough for ``python -m pipeline compile``."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as normalize  # PEP 503

ROOT = Path(__file__).resolve().parent.parent

# Compiles the pipeline and loads every command of `python -m pipeline` (the operations too),
# then prints what that imported (not what the interpreter had loaded before).
IMPORTS_OF_COMPILE = """
import sys
before = set(sys.modules)
import json, tempfile
from pathlib import Path
import pipeline.cli, pipeline.local_run
from pipeline.build import compile_pipeline
with tempfile.TemporaryDirectory() as tmp:
    compile_pipeline(str(Path(tmp) / "pipeline.yaml"), None, None)
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def requires(dist: str) -> list[str]:
    """Normalized names of what the installed `dist` needs (no extras; markers evaluated here)."""
    reqs = (Requirement(spec) for spec in md.requires(dist) or [])
    return [normalize(r.name) for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def declared(*extras: str) -> set[str]:
    """Normalized names of the core dependencies and those of `extras`, with what they need."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [
        s for e in extras for s in project["optional-dependencies"][e]
    ]
    closure: set[str] = set()
    queue = [normalize(Requirement(s).name) for s in specs]
    while queue:
        name = queue.pop()
        if name not in closure:
            closure.add(name)
            queue.extend(requires(name))
    return closure


def test_pipeline_extra_covers_what_compile_imports() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS_OF_COMPILE],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = (*sys.stdlib_module_names, "components", "pipeline")
    modules = [m for m in json.loads(proc.stdout.splitlines()[-1]) if m.split(".")[0] not in ours]
    assert "kfp" in modules, "the compile imported no kfp?"
    assert not [m for m in modules if m.split(".")[0] in ("tensorflow", "tf_keras", "horovod")]
    allowed, shipping = declared("pipeline"), md.packages_distributions()
    # Modules no distribution ships (an extension's runtime-made ones, such as cython_runtime)
    # come with the distribution of the module that made them, which is checked.
    problems = sorted(
        f"{m} ({' or '.join(sorted(dists))})"
        for m in modules
        if (dists := {normalize(d) for d in shipping.get(m.split(".")[0], [])})
        and not dists & allowed
    )
    assert not problems, f"imported by compile, not in pyproject's core or [pipeline]: {problems}"
