"""One rank of the conformance job: ``python -m tests.horovod.worker OUT CONTROLLER``.

Every rank of one launch (`tests.horovod.jobs.launch`) starts as the trainer starts
(`components.train.trainer.run`: Keras 2 selected by `keras_env.keras` before Horovod is
imported, then ``hvd.init()``), runs every check of `CHECKS` in order, and writes what each
returned to ``OUT/<check>.rank<r>.json`` (``{"values": ...}`` or ``{"error": traceback}``, and
the seconds it took) as soon as it is done. The assertions are the tests'
(tests/horovod/test_horovod_conformance.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.horovod import collectives, elastic_checks, keras_checks
from tests.horovod.common import Rank

Check = Callable[[Rank], dict[str, Any]]

# Every check, in the order every rank runs them (each its collectives in the same order).
CHECKS: dict[str, Check] = {
    **collectives.CHECKS,
    **keras_checks.CHECKS,
    **elastic_checks.CHECKS,
}


def _plain(value: Any) -> Any:
    """JSON for numpy values (float32 as the float it is exactly)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"not JSON: {type(value).__name__}")


def run_checks(out: Path, controller: str) -> int:
    """Start as the trainer does, run `CHECKS`, write each result; the number that raised."""
    from components.common import keras_env

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    keras = keras_env.keras()  # first: Keras 2 and the `keras` alias, before Horovod loads
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    me = Rank(hvd=hvd, tf=tf, keras=keras, controller=controller)
    failed = 0
    for name, check in CHECKS.items():
        start = time.monotonic()
        try:
            result: dict[str, Any] = {"values": check(me)}
        except Exception:
            result = {"error": traceback.format_exc()}
            failed += 1
        result["seconds"] = round(time.monotonic() - start, 2)
        path = out / f"{name}.rank{me.rank}.json"
        path.write_text(json.dumps(result, default=_plain))
    return failed


def main(argv: list[str]) -> int:
    out, controller = Path(argv[0]), argv[1]
    out.mkdir(parents=True, exist_ok=True)
    failed = run_checks(out, controller)
    # A check that raised is reported by its own test; the job itself ran to its end.
    print(f"conformance worker: {len(CHECKS)} checks run, {failed} raised", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
