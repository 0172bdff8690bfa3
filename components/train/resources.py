"""Did the workers pay? Where each rank's step time goes, measured in every run.

Each rank times its own steps, inside the step's graph: `AllreduceClock` takes a timestamp once
the rank's last gradient is computed and another once every gradient is averaged, so it sees
the part of the allreduce that the backward pass does not hide, its wait for slower ranks
included. The rest of a step is the rank's own work ("compute": the forward and backward pass,
the update, the input pipeline). Each epoch the ranks share their figures (`EpochCost`);
across ranks, the shortest time in the allreduce is the communication itself (the slowest rank
waits for no one), and what a rank spends above that is waiting.

From that split, `resource_use` estimates the job's scaling efficiency (compute's share of a
step: what N ranks deliver against N lone copies with the same compute), names a straggler,
says how busy each rank kept its CPU threads, and gives advice in plain words.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from components.train.summary import RankUse, ResourceUse, Straggler

# A rank whose compute per step exceeds the others' median by more than this is a straggler.
# Identical ranks on a shared 2-core machine differed by up to 6% (bench/README.md).
STRAGGLER_MARGIN = 0.10
# Advice is given when communication and waiting together take more of a step than this.
COMMUNICATION_ADVICE_SHARE = 0.15
# ... or when a rank kept busy less than this share of the cores its threads may use.
LOW_CPU_SHARE = 0.6


class AllreduceClock:
    """Seconds this rank spends in the gradient allreduce that the backward pass does not hide,
    summed in a TensorFlow variable by the step itself (`wrap` the DistributedOptimizer)."""

    def __init__(self, tf: Any) -> None:
        self.tf = tf
        self.total = tf.Variable(0.0, dtype=tf.float64, trainable=False)

    def wrap(self, optimizer: Any) -> Any:
        """Time `optimizer`'s allreduce (Horovod's DistributedOptimizer routes every gradient
        through its ``_allreduce``); the gradients and the arithmetic are unchanged.

        Each gradient is stamped as it is computed, and its allreduce starts only after its
        stamp (so no stamp can run late); the last stamp is the end of the backward pass. One
        stamp after every averaged gradient ends the wait. Gradients still start their
        allreduce as soon as each is ready, overlapping the rest of the backward pass.
        """
        tf, allreduce = self.tf, optimizer._allreduce

        def stamp(g: Any, stamps: list[Any]) -> Any:
            if not isinstance(g, tf.Tensor):  # None, or sparse: passed on as it is
                return g
            g = tf.identity(g)  # a data edge: see `_ready`
            with tf.control_dependencies([g]):
                stamps.append(tf.timestamp())
            with tf.control_dependencies([stamps[-1]]):
                return tf.identity(g)

        def timed(grads: Any, variables: Any) -> Any:
            stamps: list[Any] = []
            stamped = [stamp(g, stamps) for g in grads]
            reduced = _ready(tf, allreduce(stamped, variables))
            with tf.control_dependencies([g for g in reduced if isinstance(g, tf.Tensor)]):
                spent = tf.timestamp() - tf.reduce_max(tf.stack(stamps))
            with tf.control_dependencies([self.total.assign_add(spent)]):
                return _ready(tf, reduced)

        optimizer._allreduce = timed
        return optimizer

    def take(self) -> float:
        """The seconds summed since the last `take`."""
        spent = float(self.total.numpy())
        self.total.assign(0.0)
        return spent


def _ready(tf: Any, tensors: list[Any]) -> list[Any]:
    """`tensors` through an identity each: a control dependency on the outputs of a function
    call (Horovod's allreduce runs inside one) waits only for the function's control outputs,
    not for its results; one on an identity of them waits for the results."""
    return [tf.identity(g) if isinstance(g, tf.Tensor) else g for g in tensors]


@dataclass(frozen=True)
class EpochCost:
    """One rank's epoch: wall seconds, steps, seconds in the allreduce, CPU seconds used."""

    rank: int
    seconds: float
    steps: int
    allreduce_seconds: float
    cpu_seconds: float
    threads: int


class EpochTimer:
    """Wall and CPU time of this rank's epochs (`start`, then `stop` with the allreduce time)."""

    def __init__(self) -> None:
        self._wall = self._cpu = 0.0

    def start(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self, rank: int, steps: int, allreduce_seconds: float, threads: int) -> EpochCost:
        return EpochCost(
            rank=rank,
            seconds=time.perf_counter() - self._wall,
            steps=steps,
            allreduce_seconds=allreduce_seconds,
            cpu_seconds=time.process_time() - self._cpu,
            threads=threads,
        )


def step_split(costs: list[EpochCost]) -> dict[str, float]:
    """One epoch of the whole job (every rank's `EpochCost`): the shares of a step spent on
    compute, communication and waiting (the mean over ranks), and the step in seconds."""
    steps = [max(1, c.steps) for c in costs]
    step = statistics.fmean(c.seconds / n for c, n in zip(costs, steps, strict=True))
    in_allreduce = [c.allreduce_seconds / n for c, n in zip(costs, steps, strict=True)]
    communication = min(in_allreduce)
    waiting = statistics.fmean(t - communication for t in in_allreduce)
    return {
        "step_seconds": step,
        "compute_share": max(0.0, 1 - (communication + waiting) / step) if step else 0.0,
        "communication_share": communication / step if step else 0.0,
        "waiting_share": waiting / step if step else 0.0,
    }


def _per_rank(epochs: list[list[EpochCost]], hosts: dict[int, str]) -> list[RankUse]:
    """Each rank's medians over `epochs`: its step, compute and allreduce milliseconds, and the
    cores it kept busy against the threads it had."""
    rows: list[RankUse] = []
    for rank in sorted({c.rank for costs in epochs for c in costs}):
        mine = [c for costs in epochs for c in costs if c.rank == rank]
        step = statistics.median(c.seconds / max(1, c.steps) for c in mine)
        allreduce = statistics.median(c.allreduce_seconds / max(1, c.steps) for c in mine)
        busy = statistics.median(c.cpu_seconds / c.seconds for c in mine if c.seconds > 0)
        rows.append({
            "rank": rank, "host": hosts.get(rank, "?"), "step_ms": round(step * 1e3, 2),
            "compute_ms": round((step - allreduce) * 1e3, 2),
            "allreduce_ms": round(allreduce * 1e3, 2), "cpu_cores_busy": round(busy, 2),
            "threads": mine[0].threads,
        })  # fmt: skip
    return rows


def straggler(ranks: list[RankUse]) -> Straggler | None:
    """The rank whose compute per step is the most above the other ranks' median, if by more
    than `STRAGGLER_MARGIN`; None otherwise (and for a job of one rank)."""
    if len(ranks) < 2:
        return None
    slowest = max(ranks, key=lambda r: r["compute_ms"])
    others = statistics.median(r["compute_ms"] for r in ranks if r is not slowest)
    slower_by = slowest["compute_ms"] / others - 1 if others > 0 else 0.0
    if slower_by <= STRAGGLER_MARGIN:
        return None
    return {"rank": slowest["rank"], "host": slowest["host"], "slower_by": round(slower_by, 3)}


def resource_use(epochs: list[list[EpochCost]], hosts: dict[int, str]) -> ResourceUse:
    """The run summary's ``resource_use``: the step split (the median over epochs, the first
    left out when there are others: it includes tracing and warm-up), per-rank figures, the
    efficiency estimate, a straggler, and advice."""
    timed = epochs[1:] or epochs
    splits = [step_split(costs) for costs in timed]
    split = {k: round(statistics.median(s[k] for s in splits), 4) for k in splits[0]}
    use: ResourceUse = {
        "step_seconds": split["step_seconds"],
        "compute_share": split["compute_share"],
        "communication_share": split["communication_share"],
        "waiting_share": split["waiting_share"],
        "estimated_efficiency": split["compute_share"],
        "epochs_measured": len(timed),
        "per_rank": (ranks := _per_rank(timed, hosts)),
        "straggler": straggler(ranks),
        "advice": [],
    }
    use["advice"] = advice(use)
    return use


def advice(use: ResourceUse) -> list[str]:
    """What to change, in plain words (or why nothing needs to)."""
    notes = []
    lost = use["communication_share"] + use["waiting_share"]
    if lost > COMMUNICATION_ADVICE_SHARE:
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
        if r["cpu_cores_busy"] < LOW_CPU_SHARE * r["threads"]:
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
