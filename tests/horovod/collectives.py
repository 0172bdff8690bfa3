"""The collectives the project's code runs, each checked on values every rank reports.

Each check returns this rank's inputs and outputs; the tests compute what the outputs must be
from every rank's inputs (a sum, rank 0's value, the ranks' tensors in rank order). Only
float32 is ever allreduced here (the models train in float32, with no mixed precision; the
metrics are float32 scalars), so that is the dtype the allreduce checks use; broadcasts also
carry int64 (the optimizer's ``iterations``) and the object collectives uint8 and int32.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tests.horovod.common import Rank


def _inputs(rank: int) -> dict[str, np.ndarray]:
    """Rank `rank`'s tensors: a scalar (a metric), a matrix and a vector (gradients)."""
    rng = np.random.default_rng(100 + rank)
    return {
        "scalar": np.float32(rng.normal()),
        "matrix": rng.normal(size=(3, 4)).astype(np.float32),
        "vector": rng.normal(size=1000).astype(np.float32),
    }


def ranks(me: Rank) -> dict[str, Any]:
    """``hvd.init()`` and who this rank is (trainer.py; telemetry.py's run summary `controller`)."""
    hvd = me.hvd
    return {
        "rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(), "mpi_enabled": hvd.mpi_enabled(),
        "gloo_enabled": hvd.gloo_enabled(), "mpi_built": hvd.mpi_built(),
        "gloo_built": hvd.gloo_built(), "nccl_built": bool(hvd.nccl_built()),
    }  # fmt: skip


def _allreduce(me: Rank, op_name: str) -> dict[str, Any]:
    """Each input allreduced eagerly (as MetricAverageCallback does) and the matrix also inside
    a tf.function (as DistributedOptimizer does in Keras' train step)."""
    import horovod.tensorflow as hvt

    tf, op = me.tf, getattr(hvt, op_name)
    inputs = _inputs(me.rank)
    outputs = {
        k: hvt.allreduce(tf.constant(v), op=op, name=f"ar.{op_name}.{k}").numpy()
        for k, v in inputs.items()
    }
    graph = tf.function(lambda t: hvt.allreduce(t, op=op, name=f"ar.{op_name}.graph"))
    outputs["matrix_in_tf_function"] = graph(tf.constant(inputs["matrix"])).numpy()
    return {
        "inputs": inputs,
        "outputs": outputs,
        "dtypes": [str(v.dtype) for v in outputs.values()],
    }


def _grouped_allreduce(me: Rank, op_name: str) -> dict[str, Any]:
    """The three inputs as one group (``DistributedOptimizer(groups=N)``, bench/variants.py)."""
    import horovod.tensorflow as hvt

    inputs = _inputs(me.rank)
    tensors = [me.tf.constant(v) for v in inputs.values()]
    out = hvt.grouped_allreduce(tensors, op=getattr(hvt, op_name), name=f"grouped.{op_name}")
    outputs = {k: t.numpy() for k, t in zip(inputs, out, strict=True)}
    return {
        "inputs": inputs,
        "outputs": outputs,
        "dtypes": [str(v.dtype) for v in outputs.values()],
    }


def broadcast_variables(me: Rank) -> dict[str, Any]:
    """Variables set from the root rank (BroadcastGlobalVariablesCallback, KerasState.sync):
    float32 weights and an int64 counter like the optimizer's ``iterations``."""
    import horovod.tensorflow as hvt

    tf, values = me.tf, _inputs(me.rank)
    out: dict[str, Any] = {}
    for root in (0, 1):
        weights = tf.Variable(values["matrix"] + root)
        counter = tf.Variable(np.int64(10 * me.rank + root))
        before = {"weights": weights.numpy(), "counter": counter.numpy()}
        hvt.broadcast_variables([weights, counter], root_rank=root)
        after = {"weights": weights.numpy(), "counter": counter.numpy()}
        out[f"root{root}"] = {"before": before, "after": after, "dtype": counter.dtype.name}
    return out


def broadcast_object(me: Rank) -> dict[str, Any]:
    """Rank 0's object on every rank (trainer.build_or_resume: rank 0's checkpoint marker, or the
    error every rank then stops with, or None)."""
    from horovod.tensorflow import broadcast_object as bcast

    marker = {"epoch": 3, "uri": "gs://bucket/ckpt-3", "metrics": {"loss": 0.25}}
    error = "gs://bucket/ckpt: no usable checkpoint"
    sent = [marker, error, None] if me.rank == 0 else [None, None, "rank 1's own"]
    got = [bcast(obj, root_rank=0) for obj in sent]
    return {"sent": sent, "got": got}


def allgather(me: Rank) -> dict[str, Any]:
    """Tensors of a different length on every rank, in rank order (what allgather_object runs
    on: uint8 bytes and int32 sizes), and float32 rows."""
    import horovod.tensorflow as hvt

    n = me.rank + 2
    inputs = {
        "uint8": np.arange(n, dtype=np.uint8) + 50 * me.rank,
        "int32": np.array([n, 1000 + me.rank], dtype=np.int32),
        "float32": _inputs(me.rank)["matrix"][: me.rank + 1],
    }
    outputs = {
        k: hvt.allgather(me.tf.constant(v), name=f"ag.{k}").numpy() for k, v in inputs.items()
    }
    return {"inputs": inputs, "outputs": outputs}


def allgather_object(me: Rank) -> dict[str, Any]:
    """Every rank's object, in rank order (trainer.agree's errors; telemetry.py's epoch costs,
    the run summary's per-rank records and sample ids)."""
    from horovod.tensorflow import allgather_object as gather

    mine = {
        "rank": me.rank,
        "error": None if me.rank == 0 else f"rank {me.rank}: disk full",
        "ids": np.arange(5 * me.rank, 5 * me.rank + 3 + me.rank),
    }
    return {"sent": mine, "got": list(gather(mine))}


CHECKS = {
    "ranks": ranks,
    "allreduce_average": functools.partial(_allreduce, op_name="Average"),
    "allreduce_sum": functools.partial(_allreduce, op_name="Sum"),
    "grouped_allreduce_average": functools.partial(_grouped_allreduce, op_name="Average"),
    "grouped_allreduce_sum": functools.partial(_grouped_allreduce, op_name="Sum"),
    "broadcast_variables": broadcast_variables,
    "broadcast_object": broadcast_object,
    "allgather": allgather,
    "allgather_object": allgather_object,
}
