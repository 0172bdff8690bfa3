"""``python -m components.train.hvdrun ARGS``: ``horovodrun ARGS``, less one TensorFlow import.

Before it starts a single rank, ``horovodrun --gloo`` asks whether Horovod was built with Gloo
(``horovod.runner.launch.run_controller`` -> ``horovod.common.util.gloo_built``), and finds
out by forking a process that imports ``horovod.tensorflow``, which is all of TensorFlow: a
few seconds of a core on every launch, before any rank starts, in the train step and in every
multi-rank test and benchmark. The answer cannot change between launches: this project builds
Horovod with ``HOROVOD_WITH_GLOO=1`` (the build fails if Gloo cannot be built), ``make install``
and the trainer image run ``hvd.init()`` once built, and a rank's own ``hvd.init()`` still
fails loudly if it were wrong.

So this launcher answers that one question from what the installed Horovod records about its
build (`gloo_in_build`), and otherwise runs horovodrun's own command line, unchanged. The
MPIJob path runs ``mpirun`` and is not affected.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

# Symbols only a Horovod built with a controller contains: Gloo's own rendezvous context class,
# and Horovod's MPI controller class (mangled; compiled only with HAVE_MPI).
GLOO_MARKER = b"gloo::rendezvous::Context"
MPI_MARKER = b"N7horovod6common13MPIControllerE"


class GlooNotBuilt(RuntimeError):
    """The installed Horovod says it was built without Gloo (see `gloo_in_build`)."""


class MPINotBuilt(RuntimeError):
    """The installed Horovod was built without MPI (see `mpi_in_build`)."""


def _in_build(marker: bytes) -> bool:
    """Whether the installed Horovod's TensorFlow extension contains `marker`, read from the
    library the wheel installed, without loading it (that would load TensorFlow's; ~0.1 s to
    scan the 57 MB file)."""
    files = metadata.files("horovod") or []
    libs = [f for f in files if f.name.startswith("mpi_lib") and "tensorflow" in f.parts]
    return any(marker in Path(str(f.locate())).read_bytes() for f in libs)


def gloo_in_build() -> bool:
    """Whether the installed Horovod links Gloo (it contains Gloo's rendezvous context)."""
    return _in_build(GLOO_MARKER)


def mpi_in_build() -> bool:
    """Whether the installed Horovod has its MPI controller (what ``mpirun`` jobs need)."""
    return _in_build(MPI_MARKER)


def require_mpi_build() -> None:
    """Raise MPINotBuilt, naming the fix, unless the installed Horovod has MPI: without it the
    ranks mpirun starts would each be a job of one."""
    if not mpi_in_build():
        raise MPINotBuilt(
            "the installed Horovod has no MPI controller: reinstall it with HOROVOD_WITH_MPI=1 "
            "(make install does, after installing Debian's Open MPI)"
        )


def main(argv: list[str] | None = None) -> int:
    """Run horovodrun's command line with its Gloo check answered (exit code as horovodrun's)."""
    from horovod.runner import launch

    if not gloo_in_build():
        raise GlooNotBuilt(
            "the installed Horovod has no Gloo in its TensorFlow extension: reinstall it with "
            "HOROVOD_WITH_GLOO=1 (make install does)"
        )
    launch.gloo_built = lambda verbose=False: True
    sys.argv = ["horovodrun", *(sys.argv[1:] if argv is None else argv)]
    launch.run_commandline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
