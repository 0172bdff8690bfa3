"""``python audit_writes.py AUDIT_DIR WATCH_DIR -m MODULE ARGS...``: run a module under an audit
hook appending every write-mode ``open``, rename, mkdir or removal under WATCH_DIR to
``AUDIT_DIR/rank-<rank>.txt``. The trainer writes every output file from Python (TensorFlow
only into private temporary folders), so this sees all of them."""

import os
import runpy
import sys

audit_dir, watch_dir = sys.argv[1], os.path.realpath(sys.argv[2])
assert sys.argv[3] == "-m"
module = sys.argv[4]
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "none"))
os.makedirs(audit_dir, exist_ok=True)
record = open(os.path.join(audit_dir, f"rank-{rank}.txt"), "a", buffering=1)  # noqa: SIM115


def _under_watch(path: object) -> bool:
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(watch_dir)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def hook(event: str, args: tuple) -> None:
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        mode = args[1] if len(args) > 1 else "r"
        flags = args[2] if len(args) > 2 else 0
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        )
        if writing and _under_watch(args[0]):
            record.write(f"open {args[0]}\n")
    elif event in ("os.rename", "os.mkdir", "os.link", "os.remove", "shutil.rmtree") and any(
        _under_watch(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))
    ):
        record.write(f"{event} {args[0]}\n")


sys.addaudithook(hook)
sys.argv = [module, *sys.argv[5:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
