"""The local launcher's command lines and environment, and both launchers run for real: mpirun
with 2 Horovod ranks, and horovodrun through ``python -m components.train.launcher.launch``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import components
from components.train.launcher import launch
from components.train.launcher.launch import LaunchError
from components.train.launcher.log_dedup import RankLines
from standins.commands import static_command

ROOT = Path(components.__file__).resolve().parent.parent  # the repository
# Each rank: after hvd.init(), the CPUs each of its threads may run on. One write per line, as
# the trainer's logging writes (mpirun tags each chunk a rank writes).
RANK_PROGRAM = """
import glob, json, os, sys, horovod.tensorflow as hvd
hvd.init()
allowed = {line.split()[1] for status in glob.glob('/proc/self/task/*/status')
           for line in open(status) if line.startswith('Cpus_allowed_list:')}
sys.stdout.write("a warning every rank prints\\n")
sys.stdout.write(f"[rank {hvd.rank()}/2] my own line {os.environ['KFP_FORWARDED']}\\n")
sys.stdout.write(f"AFFINITY {hvd.local_rank()} {json.dumps(sorted(allowed))}\\n")
"""
HOROVODRUN_RANK = """
import os, pathlib, sys, time
rank, flag = os.environ["HOROVOD_RANK"], pathlib.Path(sys.argv[1])
print("rank", rank, flush=True)
if rank == "0":
    flag.touch()
while not flag.exists():
    time.sleep(0.05)
sys.exit(3 if rank == "1" else 0)
"""


def test_the_affinity_lists_one_core_per_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 5})
    assert launch.job_environment({}, 3)["HOROVOD_THREAD_AFFINITY"] == "2,5,2"
    assert "HOROVOD_THREAD_AFFINITY" not in launch.job_environment({})  # not a local job
    mine = {"HOROVOD_THREAD_AFFINITY": "7,7"}
    assert launch.job_environment(mine, 2)["HOROVOD_THREAD_AFFINITY"] == "7,7"  # the user's


def test_static_jobs_run_mpirun_and_gloo_or_elastic_ones_horovodrun(tmp_path: Path) -> None:
    mpi = launch.local_command(2, ["--epochs", "1"])
    assert mpi[:6] == ["mpirun", "-np", "2", "--tag-output", "-H", "localhost:2"]
    assert mpi[mpi.index("mpi_yield_when_idle") - 1 :][:3] == ["-mca", "mpi_yield_when_idle", "1"]
    assert mpi[-5:] == [sys.executable, "-m", "components.train.rank", "--epochs", "1"]
    horovodrun = launch.horovodrun_command(["-np", "2"], ["prog"])
    assert horovodrun == [
        sys.executable,
        "-m",
        "components.train.launcher.launch",
        "-np",
        "2",
        "prog",
    ]
    cluster = launch.mpirun_command(4, ["prog"], forward=["PATH", "A=1"], workdir="/app")
    assert "-H" not in cluster
    assert cluster[-7:] == ["-wdir", "/app", "-x", "PATH", "-x", "A=1", "prog"]
    hosts = launch.LocalHosts(tmp_path)
    hosts.offer(3)
    listed = subprocess.run([hosts.script], capture_output=True, text=True, check=True).stdout
    assert listed.split() == ["localhost:1", "127.0.0.1:1", "127.0.1:1"]  # one name per slot
    args = launch.elastic_launcher_args(4, 2, hosts)
    assert args[:6] == ["-np", "3", "--min-np", "2", "--max-np", "4"] and args[-1] == "--gloo"


def horovod_built_with(controllers: list[str], where: Path) -> dict[str, str]:
    """The environment of a Python that imports, instead of the installed Horovod, a copy of
    its Python code whose build record (horovod/metadata.json, make/horovod/patches/0004) lists
    only `controllers`: a stand-in for a Horovod built without the others (a build takes 5-12
    minutes). The copy has no compiled library, which the launcher's checks never load."""
    import horovod

    installed = Path(horovod.__file__).parent
    copy = where / "horovod"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    record = json.loads((installed / "metadata.json").read_text())
    (copy / "metadata.json").write_text(json.dumps({**record, "controllers": controllers}))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), str(ROOT)])}


def test_a_horovod_without_mpi_or_gloo_or_a_missing_mpirun_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The build's record is what the launcher reads: the installed build records both
    controllers, and a build recording one is refused the other, in one line naming the fix
    (horovodrun's refusal: exit 2 before any rank starts)."""
    from horovod.common.util import build_info

    assert sorted(build_info()["controllers"]) == ["gloo", "mpi"]  # make install's build
    launch.require("MPI")
    launch.require("GLOO")
    require_mpi = "from components.train.launcher.launch import require; require('MPI')"
    no_mpi = horovod_built_with(["gloo"], tmp_path / "gloo-only")
    run = subprocess.run([sys.executable, "-c", require_mpi], env=no_mpi, capture_output=True)
    assert b"LaunchError: the installed Horovod has no MPI in" in run.stderr
    assert b"HOROVOD_WITH_MPI=1" in run.stderr
    no_gloo = horovod_built_with(["mpi"], tmp_path / "mpi-only")
    for env, code in ((no_gloo, 2), (no_mpi, 0)):  # the Gloo-only build runs horovodrun
        command = [sys.executable, "-m", "components.train.launcher.launch", "-np", "1", "true"]
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == code, run.stderr
    run = subprocess.run(command, env=no_gloo, capture_output=True, text=True, timeout=120)
    (line,) = run.stderr.splitlines()
    assert line.startswith("FAILED: the installed Horovod has no GLOO") and "GLOO=1" in line
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match="mpirun is not installed"):
        launch.require("MPI")


def test_a_line_every_rank_printed_is_shown_once_with_its_first_ranks_tag() -> None:
    shown: list[str] = []
    once = RankLines(shown.append)
    lines = [
        "[1,1]<stdout>:a warning",
        "[1,0]<stdout>:a warning[1,0]<stdout>:",
        "untagged",
        "",
        "untagged",
        "",
        "[1,0]<stdout>:rank 0's",
        "[1,1]<stdout>:rank 1's",
    ]
    for line in lines:
        once(line)
    assert shown == ["[1,1]<stdout>:a warning", *lines[2:]]


@pytest.mark.horovod
def test_a_static_job_pins_threads_forwards_its_environment_and_shows_shared_lines_once() -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.fail("this test needs 2 cores (the project's machines have 2)")
    program = [sys.executable, "-c", RANK_PROGRAM]
    command = launch.mpirun_command(2, program, hosts="localhost:2", forward=["KFP_FORWARDED=yes"])
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=launch.job_environment(None, 2)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    raw, shown = done.stdout.splitlines(), []
    once = RankLines(shown.append)
    for line in raw:
        once(line)
    assert sum("a warning every rank prints" in line for line in raw) == 2  # mpirun: one a rank
    shared = [line for line in shown if line.endswith("a warning every rank prints")]
    assert len(shared) == 1 and shared[0] in raw
    own = sorted(line for line in shown if "my own line" in line)
    assert own == [f"[1,{r}]<stdout>:[rank {r}/2] my own line yes" for r in range(2)]
    seen = dict(line.split("AFFINITY ")[1].split(" ", 1) for line in shown if "AFFINITY" in line)
    # one thread of rank r (Horovod's background thread) is confined to core r
    assert f'"{cores[0]}"' in seen["0"] and f'"{cores[1]}"' in seen["1"], seen
    assert f'"{cores[1]}"' not in seen["0"] and f'"{cores[0]}"' not in seen["1"], seen


def test_horovodrun_options_and_exit_codes_pass_through(tmp_path: Path) -> None:
    """Rank 0 prints and leaves a flag; rank 1 prints, waits for it, then exits 3."""
    program = [sys.executable, "-c", HOROVODRUN_RANK, str(tmp_path / "flag")]
    done = subprocess.run(
        static_command(2, program, "gloo"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and "exited with non-zero status" in done.stderr, done.stderr
    printed = sorted(line.split(":", 1)[1] for line in done.stdout.splitlines() if "rank" in line)
    assert printed == ["rank 0", "rank 1"], done.stdout


def test_an_elastic_job_bounds_gloos_timeout_unless_it_is_set() -> None:
    """The bound on a lost rank's stall (the survivors' Gloo timeout: 30 s, Horovod's default,
    stalled recovery in 2 of 3 trials) is an elastic job's only; a value given is kept."""
    bound = str(launch.ELASTIC_GLOO_TIMEOUT_S)
    assert launch.job_environment({}, elastic=True)[launch.GLOO_TIMEOUT_ENV] == bound == "5"
    assert launch.GLOO_TIMEOUT_ENV not in launch.job_environment({}, 2)  # static: MPI, no Gloo
    given = {launch.GLOO_TIMEOUT_ENV: "12"}
    assert launch.job_environment(given, elastic=True)[launch.GLOO_TIMEOUT_ENV] == "12"
