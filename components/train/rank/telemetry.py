"""Telemetry: what a run measures and tells, as one Keras callback beside the checklist. Runs in
each rank; rank 0 logs each epoch and gathers every rank's record into the `RunSummary`.
"""

from __future__ import annotations

import logging
import resource
import socket
import statistics
import time
from dataclasses import dataclass
from typing import Any

from components.common.board import Board
from components.train.config import TrainConfig
from components.train.rank.data import RankPlan, coverage
from components.train.rank.devices import Devices, gpu_usage
from components.train.rank.held_input import InputClock
from components.train.rank.model import weights_fingerprint
from components.train.summary import Record, RunSummary

# Did the workers pay? Each rank times, inside the step's graph (`AllreduceClock`), the part of the
# gradient allreduce that the backward pass does not hide, its wait for slower ranks included, and,
# before each step, its wait for the step's batch (`held_input.InputClock`); the rest of a step is
# the rank's own work ("compute"). Each epoch the ranks share their figures (`EpochCost`): the
# shortest time in the allreduce is the communication itself (the slowest rank waits for no one),
# what a rank spends above that is waiting. From that split, `resource_use` estimates the scaling
# efficiency (compute's share of a step), names a straggler and gives advice (an input-bound job is
# told so, not to communicate less).
#
# A rank whose compute per step exceeds the others' median by more than this is a straggler.
# Identical ranks on a shared 2-core machine differed by up to 6% (bench/README.md).
STRAGGLER_MARGIN = 0.10
# Advice is given when communication and waiting together take more of a step than this.
COMMUNICATION_ADVICE_SHARE = 0.15
# ... or when waiting for the input takes more of a step than this.
INPUT_ADVICE_SHARE = 0.10
# ... or when a rank kept busy less than this share of the cores its threads may use.
LOW_CPU_SHARE = 0.6


class AllreduceClock:
    """Seconds this rank spends in the gradient allreduce that the backward pass does not hide,
    summed in a TensorFlow variable by the step itself (`wrap` the DistributedOptimizer)."""

    def __init__(self, tf: Any) -> None:
        self.tf = tf
        self.total = tf.Variable(0.0, dtype=tf.float64, trainable=False)

    def wrap(self, optimizer: Any) -> Any:
        """Time `optimizer`'s gradient reduction, through the public hook of Horovod's Keras 3
        DistributedOptimizer (``wrap_gradient_reduction``, make/horovod/patches/0003). Each
        gradient's allreduce starts only after its stamp, so the last stamp is the end of the
        backward pass; one stamp after every averaged gradient ends the wait. Gradients still
        overlap the rest of the backward pass, arithmetic unchanged."""
        tf = self.tf

        def stamp(g: Any, stamps: list[Any]) -> Any:
            if not isinstance(g, tf.Tensor):  # None, or sparse: passed on as it is
                return g
            g = tf.identity(g)  # a data edge: see `_ready`
            with tf.control_dependencies([g]):
                stamps.append(tf.timestamp())
            with tf.control_dependencies([stamps[-1]]):
                return tf.identity(g)

        def timed(reduce: Any, grads: Any, variables: Any) -> Any:
            stamps: list[Any] = []
            stamped = [stamp(g, stamps) for g in grads]
            reduced = _ready(tf, reduce(stamped, variables))
            if not stamps:
                return reduced
            with tf.control_dependencies([g for g in reduced if isinstance(g, tf.Tensor)]):
                spent = tf.timestamp() - tf.reduce_max(tf.stack(stamps))
            with tf.control_dependencies([self.total.assign_add(spent)]):
                return _ready(tf, reduced)

        return optimizer.wrap_gradient_reduction(timed)

    def take(self) -> float:
        """The seconds summed since the last `take`."""
        spent = float(self.total.numpy())
        self.total.assign(0.0)
        return spent


def _loss_scale(model: Any) -> dict[str, float]:
    """``{"loss_scale": the scale}`` of a mixed-precision model's LossScaleOptimizer (every rank
    must hold the same: each skips an overflowed step alike), else {}."""
    scale = getattr(getattr(model, "optimizer", None), "dynamic_scale", None)
    return {} if scale is None else {"loss_scale": float(scale.numpy())}


def _ready(tf: Any, tensors: list[Any]) -> list[Any]:
    """`tensors` through an identity each: a control dependency on a function call's outputs
    (Horovod's allreduce runs inside one) waits for its control outputs, not for its results."""
    return [tf.identity(g) if isinstance(g, tf.Tensor) else g for g in tensors]


@dataclass(frozen=True)
class EpochCost:
    """One rank's epoch: wall seconds, steps, seconds in the allreduce, CPU seconds used, its
    own metrics (before Horovod's MetricAverageCallback replaced them by the ranks' mean), and
    seconds waiting for its input."""

    rank: int
    seconds: float
    steps: int
    allreduce_seconds: float
    cpu_seconds: float
    threads: int
    own_metrics: tuple[tuple[str, float], ...] = ()
    input_seconds: float = 0.0


# The logged metrics are the ranks' mean when they match it this closely (float32 allreduce).
AVERAGE_TOLERANCE = 1e-5


def averaged(logs: dict[str, Any], costs: list[EpochCost]) -> bool:
    """Whether `logs`' loss and accuracy are the mean of the ranks' own values of the epoch."""
    own = [dict(c.own_metrics) for c in costs]
    keys = [k for k in ("loss", "accuracy") if k in logs and all(k in m for m in own)]
    return bool(keys) and all(
        abs(float(logs[k]) - statistics.fmean(m[k] for m in own)) <= AVERAGE_TOLERANCE for k in keys
    )


def step_split(costs: list[EpochCost]) -> dict[str, float]:
    """One epoch of the whole job: the shares of a step (mean over ranks) and its seconds."""
    step = statistics.fmean(c.seconds / c.steps for c in costs)
    in_allreduce = [c.allreduce_seconds / c.steps for c in costs]
    communication = min(in_allreduce)
    waiting = statistics.fmean(in_allreduce) - communication
    waiting_for_input = statistics.fmean(c.input_seconds / c.steps for c in costs)
    return {
        "step_seconds": step,
        "compute_share": max(0.0, 1 - (communication + waiting + waiting_for_input) / step),
        "communication_share": communication / step,
        "waiting_share": waiting / step,
        "input_share": waiting_for_input / step,
    }


def _per_rank(epochs: list[list[EpochCost]], hosts: dict[int, str]) -> list[Record]:
    """Each rank's medians over `epochs`."""
    rows: list[Record] = []
    for rank in sorted({c.rank for costs in epochs for c in costs}):
        mine = [c for costs in epochs for c in costs if c.rank == rank]
        step = statistics.median(c.seconds / c.steps for c in mine)
        allreduce = statistics.median(c.allreduce_seconds / c.steps for c in mine)
        waiting_for_input = statistics.median(c.input_seconds / c.steps for c in mine)
        busy = statistics.median(c.cpu_seconds / c.seconds for c in mine if c.seconds > 0)
        rows.append(
            {
                "rank": rank,
                "host": hosts.get(rank, "?"),
                "step_ms": round(step * 1e3, 2),
                "compute_ms": round((step - allreduce - waiting_for_input) * 1e3, 2),
                "allreduce_ms": round(allreduce * 1e3, 2),
                "input_ms": round(waiting_for_input * 1e3, 2),
                "cpu_cores_busy": round(busy, 2),
                "threads": mine[0].threads,
            }
        )
    return rows


def straggler(ranks: list[Record]) -> Record | None:
    """The rank computing most above the others' median, if by more than `STRAGGLER_MARGIN`."""
    if len(ranks) < 2:
        return None
    slowest = max(ranks, key=lambda r: r["compute_ms"])
    others = statistics.median(r["compute_ms"] for r in ranks if r is not slowest)
    slower_by = slowest["compute_ms"] / others - 1 if others > 0 else 0.0
    if slower_by <= STRAGGLER_MARGIN:
        return None
    return {"rank": slowest["rank"], "host": slowest["host"], "slower_by": round(slower_by, 3)}


def resource_use(epochs: list[list[EpochCost]], hosts: dict[int, str]) -> Record:
    """The run summary's ``resource_use``: the median step split over the epochs (the first,
    tracing and warm-up, left out when there are others), per-rank figures, and advice."""
    timed = epochs[1:] or epochs
    splits = [step_split(costs) for costs in timed]
    split = {k: round(statistics.median(s[k] for s in splits), 4) for k in splits[0]}
    ranks = _per_rank(timed, hosts)
    use: Record = {
        **split,
        "estimated_efficiency": split["compute_share"],
        "epochs_measured": len(timed),
        "per_rank": ranks,
        "straggler": straggler(ranks),
    }
    return {**use, "advice": advice(use)}


def advice(use: Record) -> list[str]:
    """What to change, in plain words (or why nothing needs to)."""
    notes = []
    lost = use["communication_share"] + use["waiting_share"]
    input_bound = use.get("input_share", 0.0) > INPUT_ADVICE_SHARE
    if input_bound:
        notes.append(
            f"the ranks wait {use['input_share']:.0%} of a step for their input (reading and "
            "decoding batches), more than for each other: the input is the bottleneck, not "
            "communication: give each worker more CPU threads (threads_per_worker, or its "
            "cpu_per_worker), store smaller images (image_size), or keep the data closer to "
            "the workers"
        )
    elif lost > COMMUNICATION_ADVICE_SHARE:
        notes.append(
            f"communication is {use['communication_share']:.0%} of a step and waiting for slower "
            f"ranks {use['waiting_share']:.0%}: try a larger batch per worker, or fewer, bigger "
            "workers (more threads or GPUs each)"
        )
    if use["straggler"]:
        s = use["straggler"]
        notes.append(
            f"rank {s['rank']} on {s['host']} computes {s['slower_by']:.0%} slower than the "
            "others and the job waits for it every step: check what else runs on its node and "
            "its CPU limit"
        )
    for r in use["per_rank"]:
        if not input_bound and r["cpu_cores_busy"] < LOW_CPU_SHARE * r["threads"]:
            notes.append(
                f"rank {r['rank']} kept {r['cpu_cores_busy']:.1f} cores busy with {r['threads']} "
                "thread(s): it waits on its input, its storage or its CPU limit, not on compute"
            )
    if not notes:
        notes.append(
            f"the workers paid: compute is {use['estimated_efficiency']:.2f} of a step, the "
            "estimated scaling efficiency; nothing to change"
        )
    return notes


class Telemetry:
    """This rank's measurements: the allreduce clock (`wrap` the optimizer with it), every
    rank's `EpochCost` of every epoch, and rank 0's progress line and TensorBoard scalars."""

    def __init__(
        self, hvd: Any, tf: Any, devices: Devices, log: logging.Logger, board: Board | None
    ) -> None:
        self.hvd, self.tf, self.devices, self.log, self.board = hvd, tf, devices, log, board
        self.clock = AllreduceClock(tf)
        self.input_clock = InputClock()
        self.costs: list[list[EpochCost]] = []
        self.samples = 0
        self.own: dict[str, float] = {}
        self.start_fingerprints: list[str] = []
        self.metrics_averaged: list[bool] = []

    def own_metrics_callback(self, keras: Any) -> Any:
        """Put before Horovod's MetricAverageCallback: keeps this rank's own epoch metrics."""
        telemetry = self

        class OwnMetrics(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                telemetry.own = {k: float(v) for k, v in (logs or {}).items()}

        return OwnMetrics()

    def callback(self, keras: Any, shard: RankPlan, epochs: int) -> Any:
        """The callback of one fit over `shard` (an elastic attempt starts afresh), after the
        broadcast and the metric averaging, which it checks from what every rank holds."""
        from horovod.tensorflow import allgather_object

        self.costs, self.samples = [], shard.samples
        telemetry, rank, threads = self, int(self.hvd.rank()), self.devices.threads

        class TelemetryCallback(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
            def on_train_begin(self, logs: Any = None) -> None:
                start = weights_fingerprint(self.model)  # after the broadcast, if any
                telemetry.start_fingerprints = list(allgather_object(start))

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self.wall, self.cpu = time.perf_counter(), time.process_time()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                seconds = time.perf_counter() - self.wall
                cpu = time.process_time() - self.cpu
                own = tuple(sorted(telemetry.own.items()))
                cost = EpochCost(
                    rank,
                    seconds,
                    shard.steps,
                    telemetry.clock.take(),
                    cpu,
                    threads,
                    own,
                    telemetry.input_clock.take(),
                )
                telemetry.costs.append(list(allgather_object(cost)))  # every rank, every epoch
                telemetry.metrics_averaged.append(averaged(logs or {}, telemetry.costs[-1]))
                if rank == 0:
                    lr = float(self.model.optimizer.learning_rate.numpy())
                    telemetry.tell(epoch + 1, epochs, logs or {}, lr)

        return TelemetryCallback()

    def tell(self, epoch: int, epochs: int, logs: dict[str, Any], lr: float) -> None:
        """Rank 0's line and TensorBoard scalars for `epoch` (counted from 1); the job's
        examples/s are every rank's samples over the slowest rank's epoch."""
        costs = self.costs[-1]
        slowest = max(c.seconds for c in costs)
        job = {**step_split(costs), "examples_per_second": self.samples * len(costs) / slowest}
        own = [dict(c.own_metrics).get("loss", float("nan")) for c in costs]
        losses = ", ".join(f"{v:.4f}" for v in own)
        how = (
            f"averaged over {len(costs)} ranks"
            if self.metrics_averaged[-1]
            else f"rank 0's own, NOT averaged: the ranks' losses are {losses}"
        )
        self.log.info(
            "Epoch %d/%d - loss %.4f - accuracy %.4f (%s) - lr %.5f - %.0f examples/s - a step: "
            "compute %.0f%%, communication %.0f%%, waiting %.0f%%, input %.0f%%",
            epoch,
            epochs,
            logs.get("loss", float("nan")),
            logs.get("accuracy", float("nan")),
            how,
            lr,
            job["examples_per_second"],
            100 * job["compute_share"],
            100 * job["communication_share"],
            100 * job["waiting_share"],
            100 * job["input_share"],
        )
        if self.board is not None:
            metrics = {k: float(v) for k, v in logs.items() if k in ("loss", "accuracy")}
            shares = {k: v for k, v in job.items() if k != "step_seconds"}
            self.board.write(epoch, {**metrics, **shares, "learning_rate": lr})

    def run_summary(
        self, config: TrainConfig, shard: RankPlan, model: Any, **outcome: Any
    ) -> RunSummary | None:
        """Every rank shares its record (its block of samples among it); rank 0 gets the
        `RunSummary` (without the SavedModel's digest), the others None. `outcome`: the
        summary's resumed_from_epoch, adam and final_metrics."""
        from horovod.tensorflow import allgather_object

        hvd, devices, rank = self.hvd, self.devices, int(self.hvd.rank())
        mine = [c.seconds for costs in self.costs for c in costs if c.rank == rank]
        timed = mine[1:] or mine  # the first epoch includes tracing and warm-up
        rate = round(self.samples / statistics.median(timed), 1) if timed else 0.0
        record = {
            "rank": rank,
            "local_rank": int(hvd.local_rank()),
            "host": socket.gethostname(),
            "device": devices.device,
            **gpu_usage(self.tf, devices),
            "threads": devices.threads,
            "sample_range": [shard.start, shard.stop],
            "samples_per_epoch": shard.samples,
            "steps_per_epoch": shard.steps,
            "weights_sha256": weights_fingerprint(model),
            "own_metrics": dict(self.own),
            **_loss_scale(model),
            "examples_per_second": rate,
            # the rank process's peak resident memory: bounded by its input's buffers, not by
            # the dataset (bench.input_pipeline measures it against the data's size)
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
        per_rank = sorted(allgather_object(record), key=lambda r: r["rank"])
        if rank != 0:
            return None
        return RunSummary(
            config=config,
            world_size=int(hvd.size()),
            hosts=sorted({r["host"] for r in per_rank}),
            controller="mpi" if hvd.mpi_enabled() else "gloo",
            gradient_allreduce="nccl" if devices.on_gpu and hvd.nccl_built() else "host",
            model_parameters=int(model.count_params()),
            dataset={
                "uri": config.data,
                "manifest_sha256": shard.manifest_sha256,
                "train_samples": shard.total,
                "image": list(shard.image.shape),
                "classes": list(shard.classes),
            },
            per_rank=per_rank,
            coverage=coverage([tuple(r["sample_range"]) for r in per_rank], shard.total),
            weights_identical_across_ranks=len({r["weights_sha256"] for r in per_rank}) == 1,
            start_weights_identical_across_ranks=len(set(self.start_fingerprints)) == 1,
            metrics_averaged_across_ranks=all(self.metrics_averaged or [False]),
            resource_use=resource_use(self.costs, {r["rank"]: r["host"] for r in per_rank})
            if self.costs
            else None,
            **outcome,
        )
