"""The collectives the project's code runs, each checked on values against what every rank's
inputs (`tensors`, a function of the rank) make of it: a sum, the root's value, the ranks'
tensors in rank order. Only float32 is ever allreduced here (the weights, and so the gradients,
are float32, under mixed precision too; the metrics are float32 scalars); broadcasts also carry
int64 (the optimizer's ``iterations``) and the object collectives uint8 and int32.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tests.horovod.common import WORLD, Check, Rank, assert_close


def tensors(rank: int) -> dict[str, Any]:
    """Rank `rank`'s tensors: a scalar (a metric), a matrix and a vector (gradients)."""
    rng = np.random.default_rng(100 + rank)
    return {
        "scalar": np.float32(rng.normal()),
        "matrix": rng.normal(size=(3, 4)).astype(np.float32),
        "vector": rng.normal(size=1000).astype(np.float32),
    }


def ranks(me: Rank) -> dict[str, Any]:
    """``hvd.init()`` and who this rank is (trainer.py; telemetry.py's run summary `controller`).
    Static jobs: one host, two local ranks. Elastic: one host name per slot (LocalHosts)."""
    hvd = me.hvd
    assert (hvd.size(), hvd.mpi_built(), hvd.gloo_built()) == (WORLD, True, True)
    enabled = (hvd.mpi_enabled(), hvd.gloo_enabled())
    assert enabled == (me.controller == "mpi", me.controller != "mpi"), f"enabled: {enabled}"
    local = (hvd.local_rank(), hvd.local_size())
    assert local == ((0, 1) if me.controller == "elastic" else (me.rank, WORLD)), local
    return {"same": {"nccl_built": bool(hvd.nccl_built())}}


def allreduce(me: Rank, op_name: str, grouped: bool = False) -> dict[str, Any]:
    """Each tensor allreduced eagerly (as MetricAverageCallback does) and the matrix also inside a
    tf.function (as DistributedOptimizer does in Keras' train step); or, `grouped`, all three as
    one group (``DistributedOptimizer(groups=N)``, bench/variants.py)."""
    import horovod.tensorflow as hvt

    tf, op = me.tf, getattr(hvt, op_name)
    mine = {k: tf.constant(v) for k, v in tensors(me.rank).items()}
    if grouped:
        reduced = hvt.grouped_allreduce(list(mine.values()), op=op, name=f"grouped.{op_name}")
        out = dict(zip(mine, reduced, strict=True))
    else:
        out = {k: hvt.allreduce(t, op=op, name=f"ar.{op_name}.{k}") for k, t in mine.items()}
        graph = tf.function(lambda t: hvt.allreduce(t, op=op, name=f"ar.{op_name}.graph"))
        out["matrix_in_tf_function"] = graph(mine["matrix"])
    reduce = np.mean if op_name == "Average" else np.sum
    for key, value in out.items():
        given = [tensors(r)[key.removesuffix("_in_tf_function")] for r in range(me.size)]
        assert not np.array_equal(given[0], given[1]), "the ranks' inputs must differ"
        assert value.dtype == tf.float32, f"{key}: {value.dtype}"
        want = reduce(np.asarray(given), axis=0)
        assert_close(value.numpy(), want, f"{op_name} {key}")
    return {"same": {k: v.numpy().tolist() for k, v in out.items()}}


def broadcast_variables(me: Rank) -> dict[str, Any]:
    """Variables set from the root rank (BroadcastGlobalVariablesCallback, KerasState.sync):
    float32 weights and an int64 counter like the optimizer's ``iterations``, from either root."""
    import horovod.tensorflow as hvt

    def held(rank: int, root: int) -> list[Any]:
        return [tensors(rank)["matrix"] + root, np.int64(10 * rank + root)]

    got = {}
    for root in (0, 1):
        variables = [me.tf.Variable(v) for v in held(me.rank, root)]
        hvt.broadcast_variables(variables, root_rank=root)
        got[root] = variables
    for root, (weights, counter) in got.items():
        assert not np.array_equal(held(0, root)[0], held(1, root)[0]), "the ranks must differ"
        assert counter.dtype == me.tf.int64, counter.dtype
        np.testing.assert_equal(
            [weights.numpy(), counter.numpy()], held(root, root), err_msg=f"from rank {root}"
        )
    return {}


ROOT_OBJECTS = [
    {"epoch": 3, "uri": "gs://bucket/ckpt-3", "metrics": {"loss": 0.25}},
    "gs://bucket/ckpt: no usable checkpoint",
    None,
]


def broadcast_object(me: Rank) -> dict[str, Any]:
    """Rank 0's object on every rank (trainer.build_or_resume: rank 0's checkpoint marker, or the
    error every rank then stops with, or None)."""
    from horovod.tensorflow import broadcast_object as bcast

    sent = ROOT_OBJECTS if me.rank == 0 else [None, None, "rank 1's own"]
    got = [bcast(obj, root_rank=0) for obj in sent]
    assert got == ROOT_OBJECTS, got
    return {}


def _gathered(rank: int) -> dict[str, np.ndarray]:
    """Rank `rank`'s tensors of its own length: uint8 bytes and int32 sizes (what
    allgather_object runs on), and float32 rows."""
    n = rank + 2
    return {
        "uint8": np.arange(n, dtype=np.uint8) + 50 * rank,
        "int32": np.array([n, 1000 + rank], dtype=np.int32),
        "float32": tensors(rank)["matrix"][: rank + 1],
    }


def allgather(me: Rank) -> dict[str, Any]:
    """Tensors of a different length on every rank, in rank order."""
    import horovod.tensorflow as hvt

    got = {
        k: hvt.allgather(me.tf.constant(v), name=f"ag.{k}").numpy()
        for k, v in _gathered(me.rank).items()
    }
    want = {k: np.concatenate([_gathered(r)[k] for r in range(me.size)]) for k in got}
    np.testing.assert_equal(got, want)
    return {}


def _record(rank: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "error": None if rank == 0 else f"rank {rank}: disk full",
        "ids": np.arange(5 * rank, 5 * rank + 3 + rank),
    }


def allgather_object(me: Rank) -> dict[str, Any]:
    """Every rank's object, in rank order (trainer.agree_to_train's errors; telemetry.py's epoch
    costs, the run summary's per-rank records and sample ids)."""
    from horovod.tensorflow import allgather_object as gather

    got = list(gather(_record(me.rank)))
    np.testing.assert_equal(got, [_record(r) for r in range(me.size)])
    return {}


CHECKS: dict[str, Check] = {
    "ranks": ranks,
    "allreduce_average": functools.partial(allreduce, op_name="Average"),
    "allreduce_sum": functools.partial(allreduce, op_name="Sum"),
    "grouped_allreduce_average": functools.partial(allreduce, op_name="Average", grouped=True),
    "grouped_allreduce_sum": functools.partial(allreduce, op_name="Sum", grouped=True),
    "broadcast_variables": broadcast_variables,
    "broadcast_object": broadcast_object,
    "allgather": allgather,
    "allgather_object": allgather_object,
}
