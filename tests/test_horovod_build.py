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
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "make" / "horovod"
SOURCE = dict(re.findall(r'^([A-Z_0-9]+)="?([^"\n]*)"?$', (BUILD / "SOURCE").read_text(), re.M))
VERSION = SOURCE["HOROVOD_VERSION"]
SUPPORTED = f"{SOURCE['HOROVOD_TENSORFLOW'].split()[0]}.0"
PATCHES = sorted((BUILD / "patches").glob("*.patch"))
FIRST = PATCHES[0]
FILE = re.findall(r"^\+\+\+ b/(\S+)", FIRST.read_text(), re.M)[0]
SDIST = f"horovod-{VERSION}.tar.gz"


def _pre_images(patches: list[Path]) -> dict[str, str]:
    """For every file the series changes (not those it creates), a file it applies to: the
    hunks' context and removed lines, in order (patch finds each hunk at its offset). A file
    that several patches change holds each patch's hunks in turn: a later patch finds its
    context (lines an earlier patch added included) in its own copy, after the earlier's."""
    found: dict[str, list[str]] = {}
    created: set[str] = set()  # by a patch of the series: later patches change it there
    current: list[str] | None = None
    for patch in patches:
        old, current = "", None  # a patch's header (its lines may start with a space) is no hunk
        for line in patch.read_text().splitlines():
            if line.startswith("--- "):
                old, current = line, None
            elif line.startswith("+++ b/"):
                name = line[6:].split()[0]
                if old.startswith("--- /dev/null"):
                    created.add(name)
                current = None if name in created else found.setdefault(name, [])
            elif line.startswith("diff "):
                current = None
            elif current is not None and line[:1] in (" ", "-"):
                current.append(line[1:])
    return {name: "\n".join(lines) + "\n" for name, lines in found.items()}


PRE_IMAGES = _pre_images(PATCHES)


def _write_sdist(path: Path, files: dict[str, str]) -> str:
    """A ``horovod-VERSION.tar.gz`` of `files` (paths inside the source tree); its sha256."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"horovod-{VERSION}/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return hashlib.sha256(path.read_bytes()).hexdigest()


# name: (the sdist's files, or None for no sdist at all; whether SOURCE pins its hash; the
# TensorFlow version the Python reports; what build.sh's last line must be, a regex in which
# SDIST_SHA256 stands for the sdist's own sha256).
CASES: dict[str, tuple[dict[str, str] | None, bool, str, str]] = {
    "a patch that no longer applies is named with the file": (
        {**PRE_IMAGES, FILE: PRE_IMAGES[FILE].replace("xla_mpi_ops.cc", "xla_ops_v2.cc")}, True,
        SUPPORTED,
        rf"horovod build: patch {FIRST.name} does not apply to .*{FILE} \(Hunk #1 FAILED at .*",
    ),
    "a patch whose file the sdist lacks names that file": (
        {"setup.py": "raise SystemExit(1)\n"}, True, SUPPORTED,
        rf"horovod build: patch {FIRST.name} does not apply to {SDIST}: "
        rf".*{FILE} \(not in the sdist\)",
    ),
    "an sdist with another hash is refused naming both hashes": (
        PRE_IMAGES, False, SUPPORTED,
        rf"horovod build: {SDIST} has sha256 SDIST_SHA256, expected "
        rf"{SOURCE['HOROVOD_SHA256']} \(make/horovod/SOURCE\)",
    ),
    "a tensorflow the series was not made for is refused naming the supported": (
        PRE_IMAGES, True, "2.20.1",
        "horovod build: the patch series in make/horovod/patches was made for TensorFlow "
        + re.escape(f"{SOURCE['HOROVOD_TENSORFLOW']}; {sys.executable} has TensorFlow 2.20.1"),
    ),
    "a missing local sdist is named": (
        None, False, SUPPORTED, r"horovod build: HOROVOD_SDIST=\S+/nowhere\.tar\.gz: no such file"
    ),
    # The control: the doctored runs above stop for their own cause, not for the fakes.
    "with every input right the build gets to compiling": (
        PRE_IMAGES, True, SUPPORTED,
        rf"horovod build: compiling Horovod {VERSION} failed \(above\)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_build_sh_stops_with_one_line_naming_what_is_wrong(tmp_path: Path, case: str) -> None:
    files, pin, tf_version, last = CASES[case]
    build = shutil.copytree(BUILD, tmp_path / "horovod")
    sdist = tmp_path / ("nowhere.tar.gz" if files is None else SDIST)
    if files is not None:
        digest = _write_sdist(sdist, files)
        last = last.replace("SDIST_SHA256", digest)
        if pin:  # as for a real new release
            source = build / "SOURCE"
            text = re.sub(r"^HOROVOD_SHA256=.*$", f"HOROVOD_SHA256={digest}", source.read_text(),
                          flags=re.M)  # fmt: skip
            source.write_text(text)
    # The TensorFlow this Python reports: a dist-info that shadows the installed one.
    meta = tmp_path / "site" / f"tensorflow-{tf_version}.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: tensorflow\nVersion: {tf_version}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(meta.parent), "HOROVOD_SDIST": str(sdist)}
    proc = subprocess.run(
        ["bash", str(build / "build.sh"), sys.executable, str(tmp_path / "cache")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert re.fullmatch(last, proc.stderr.strip().splitlines()[-1]), proc.stderr
    assert list((tmp_path / "cache").rglob("*.whl")) == []
    if case.startswith("with every input right"):
        assert f"Horovod {VERSION} + {len(PATCHES)} patch(es) for TensorFlow {SUPPORTED}" in (
            proc.stderr
        )
