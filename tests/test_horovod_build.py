"""make/horovod/build.sh on bad input: the real script, run on doctored copies of its inputs.

Nothing is downloaded or compiled. Each test copies make/horovod to a temporary folder and
doctors one input: the sdist (a small tarball made here, handed over with ``HOROVOD_SDIST``), the
sha256 in SOURCE, or the TensorFlow version the Python reports (a ``tensorflow`` dist-info on
``PYTHONPATH`` that shadows the installed one). The one input that is not doctored is always
right, so each run stops for its own reason; the control run, with every input right, gets as
far as compiling (which fails at once: the tarball holds no Python project).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "make" / "horovod"


def _source() -> dict[str, str]:
    """make/horovod/SOURCE's assignments."""
    pairs = re.findall(r'^([A-Z_0-9]+)="?([^"\n]*)"?$', (BUILD / "SOURCE").read_text(), re.M)
    return dict(pairs)


SOURCE = _source()
VERSION = SOURCE["HOROVOD_VERSION"]
SUPPORTED_TF = SOURCE["HOROVOD_TENSORFLOW"].split()
PATCHES = sorted((BUILD / "patches").glob("*.patch"))
FIRST = PATCHES[0]


def _patched_file(patch: Path) -> str:
    return re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M)[0]


def _before(patch: Path) -> str:
    """A file the first file of `patch` applies to: its hunks' context and removed lines."""
    body = patch.read_text().split("\n+++ ", 1)[1].splitlines()[1:]
    lines: list[str] = []
    for line in body:
        if line.startswith(("--- ", "diff ")):  # the next file's header, or the signature
            break
        if line[:1] in (" ", "-"):
            lines.append(line[1:])
    return "\n".join(lines) + "\n"


@dataclass
class Build:
    """A copy of make/horovod and what a run of its build.sh needs."""

    root: Path

    @property
    def script(self) -> Path:
        return self.root / "horovod" / "build.sh"

    def sdist(self, files: dict[str, str]) -> Path:
        """A ``horovod-VERSION.tar.gz`` of `files` (paths inside the source tree)."""
        out = self.root / f"horovod-{VERSION}.tar.gz"
        with tarfile.open(out, "w:gz") as tar:
            for name, text in files.items():
                data = text.encode()
                info = tarfile.TarInfo(f"horovod-{VERSION}/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return out

    def pin(self, sdist: Path) -> str:
        """Write `sdist`'s sha256 into this copy's SOURCE, as for a real new release."""
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        source = self.root / "horovod" / "SOURCE"
        text = re.sub(r"^HOROVOD_SHA256=.*$", f"HOROVOD_SHA256={digest}",
                      source.read_text(), flags=re.M)  # fmt: skip
        source.write_text(text)
        return digest

    def run(self, tf_version: str, sdist: Path | None = None) -> subprocess.CompletedProcess[str]:
        """build.sh with this Python, reporting TensorFlow `tf_version`."""
        fake = self.root / "site"
        shutil.rmtree(fake, ignore_errors=True)
        meta = fake / f"tensorflow-{tf_version}.dist-info"
        meta.mkdir(parents=True)
        (meta / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: tensorflow\nVersion: {tf_version}\n"
        )
        env = {**os.environ, "PYTHONPATH": str(fake)}
        env.pop("HOROVOD_SDIST", None)
        if sdist is not None:
            env["HOROVOD_SDIST"] = str(sdist)
        return subprocess.run(
            ["bash", str(self.script), sys.executable, str(self.cache)],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    def wheels(self) -> list[Path]:
        return list(self.cache.rglob("*.whl"))


@pytest.fixture
def build(tmp_path: Path) -> Build:
    shutil.copytree(BUILD, tmp_path / "horovod")
    return Build(tmp_path)


SUPPORTED = f"{SUPPORTED_TF[0]}.0"
FILE = _patched_file(FIRST)
SDIST = f"horovod-{VERSION}.tar.gz"
# name: (the sdist's files, or None for no sdist at all; whether SOURCE pins its hash; the
# TensorFlow version the Python reports; what build.sh's last line must be, a regex in which
# SDIST_SHA256 stands for the sdist's own sha256).
CASES: dict[str, tuple[dict[str, str] | None, bool, str, str]] = {
    "a patch that no longer applies is named with the file": (
        {FILE: _before(FIRST).replace("xla_mpi_ops.cc", "xla_ops_v2.cc")}, True, SUPPORTED,
        rf"horovod build: patch {FIRST.name} does not apply to .*{FILE} \(Hunk #1 FAILED at .*",
    ),
    "a patch whose file the sdist lacks names that file": (
        {"setup.py": "raise SystemExit(1)\n"}, True, SUPPORTED,
        rf"horovod build: patch {FIRST.name} does not apply to {SDIST}: "
        rf".*{FILE} \(not in the sdist\)",
    ),
    "an sdist with another hash is refused naming both hashes": (
        {FILE: _before(FIRST)}, False, SUPPORTED,
        rf"horovod build: {SDIST} has sha256 SDIST_SHA256, expected "
        rf"{SOURCE['HOROVOD_SHA256']} \(make/horovod/SOURCE\)",
    ),
    "a tensorflow the series was not made for is refused naming the supported": (
        {FILE: _before(FIRST)}, True, "2.20.1",
        "horovod build: the patch series in make/horovod/patches was made for TensorFlow "
        + re.escape(f"{SOURCE['HOROVOD_TENSORFLOW']}; {sys.executable} has TensorFlow 2.20.1"),
    ),
    "a missing local sdist is named": (
        None, False, SUPPORTED, r"horovod build: HOROVOD_SDIST=\S+/nowhere\.tar\.gz: no such file"
    ),
    # The control: the doctored runs above stop for their own cause, not for the fakes.
    "with every input right the build gets to compiling": (
        {FILE: _before(FIRST)}, True, SUPPORTED,
        rf"horovod build: compiling Horovod {VERSION} failed \(above\)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_build_sh_stops_with_one_line_naming_what_is_wrong(build: Build, case: str) -> None:
    files, pin, tf_version, last = CASES[case]
    sdist = build.root / "nowhere.tar.gz" if files is None else build.sdist(files)
    if pin:
        build.pin(sdist)
    proc = build.run(tf_version, sdist)
    assert proc.returncode == 1, proc.stderr
    if files is not None:
        last = last.replace("SDIST_SHA256", hashlib.sha256(sdist.read_bytes()).hexdigest())
    assert re.fullmatch(last, proc.stderr.strip().splitlines()[-1]), proc.stderr
    assert build.wheels() == []
    if case.startswith("with every input right"):
        assert f"Horovod {VERSION} + {len(PATCHES)} patch(es) for TensorFlow {SUPPORTED}" in (
            proc.stderr
        )
