"""The sharding arithmetic (disjoint, covering, equal step counts, nothing dropped), and the
records each rank streams: its own block only, every one once per epoch, reshuffled per epoch,
read from the shard files (staged from GCS a few at a time), never loaded whole."""

from __future__ import annotations

import numpy as np
import pytest

from components.common import dataset, keras_env
from components.common.tests.datasets import read_arrays
from components.data_prep.prep import prepare
from components.train.rank.data import (
    batch_bounds,
    make_dataset,
    plan_rank,
    ranks_problem,
    shard_range,
    steps_per_epoch,
)


def test_5000_samples_on_3_ranks_split_evenly() -> None:
    sizes = [stop - start for start, stop in (shard_range(5000, r, 3) for r in range(3))]
    assert sorted(sizes) == [1666, 1667, 1667]
    assert steps_per_epoch(5000, 3, 64) == 27  # ceil(1667 / 64)


@pytest.mark.parametrize("batch", [2, 16, 32, 64])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("total", [7, 10, 33, 65, 100, 1001, 5000])
def test_shards_cover_every_sample_once_in_equal_steps_of_nonempty_batches(
    total: int, size: int, batch: int
) -> None:
    ranges = [shard_range(total, r, size) for r in range(size)]
    seen = np.concatenate([np.arange(start, stop) for start, stop in ranges])
    assert np.array_equal(seen, np.arange(total))  # in order, once each: disjoint and covering
    steps = steps_per_epoch(total, size, batch)
    assert ranks_problem(total, size, batch) is None
    for start, stop in ranges:
        bounds = batch_bounds(stop - start, steps)
        assert len(bounds) == steps  # every rank runs the same number of steps: no deadlock
        assert all(0 < hi - lo <= batch for lo, hi in bounds)  # no empty batch
        covered = np.concatenate([np.arange(lo, hi) for lo, hi in bounds])
        assert np.array_equal(covered, np.arange(stop - start))  # each sample once per epoch


def test_a_shard_too_small_for_the_steps_a_bad_rank_and_a_bad_batch_are_errors() -> None:
    # 10 samples on 3 ranks at batch 1: the 4-sample rank needs 4 steps, a 3-sample rank can't.
    steps = steps_per_epoch(10, 3, 1)
    with pytest.raises(ValueError, match="cannot fill 4 steps"):
        batch_bounds(3, steps)
    assert "too few for 4 steps of at most 1" in str(ranks_problem(10, 3, 1))
    assert "fewer than the job's 3 ranks" in str(ranks_problem(2, 3, 64))
    with pytest.raises(ValueError, match="rank 3 is not in a world of size 3"):
        shard_range(10, 3, 3)
    with pytest.raises(ValueError, match="batch size"):
        steps_per_epoch(10, 2, 0)


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> str:
    """1,000 training digits in shards of 300 (uneven: 300, 300, 300, 100)."""
    out = tmp_path_factory.mktemp("sharding") / "ds"
    prepare("bundled", str(out), shard_size=300, data_limit=1000)
    return str(out)


def _epochs(uri: str, rank: int, size: int, epochs: range):
    """Each epoch's batches of `rank` (images, labels), as the trainer streams them."""
    tf = keras_env.tensorflow()
    plan = plan_rank(dataset.read_manifest(uri), 64, rank, size)
    batches = list(make_dataset(tf, plan, 7, rank, epochs, 1).as_numpy_iterator())
    per_epoch = [batches[k : k + plan.steps] for k in range(0, len(batches), plan.steps)]
    return plan, per_epoch


def _rows(images: np.ndarray, labels: np.ndarray) -> list[bytes]:
    return sorted(
        img.tobytes() + bytes([int(label)]) for img, label in zip(images, labels, strict=True)
    )


@pytest.mark.parametrize("size", [1, 3, 4])
def test_each_rank_streams_exactly_its_own_block(digits: str, size: int) -> None:
    """Rank r's records are the samples [r*N/n, (r+1)*N/n) of the split in the manifest's order:
    no record of another rank, none missing, in the same number of non-empty batches."""
    x, y = read_arrays(digits, "train")
    steps = set()
    for rank in range(size):
        plan, (epoch,) = _epochs(digits, rank, size, range(1))
        images = np.concatenate([b[0] for b in epoch])
        labels = np.concatenate([b[1] for b in epoch])
        assert (plan.start, plan.stop) == shard_range(1000, rank, size)
        assert _rows(images, labels) == _rows(x[plan.start : plan.stop], y[plan.start : plan.stop])
        assert all(0 < len(b[1]) <= 64 for b in epoch) and images.shape[1:] == (28, 28, 1)
        steps.add(len(epoch))
    assert steps == {steps_per_epoch(1000, size, 64)}


def test_each_epoch_serves_the_block_once_in_an_order_of_its_own(digits: str) -> None:
    _, epochs = _epochs(digits, 1, 3, range(3))
    served = [np.concatenate([b[1] for b in epoch]) for epoch in epochs]
    images = [np.concatenate([b[0] for b in epoch]) for epoch in epochs]
    assert _rows(images[0], served[0]) == _rows(images[1], served[1]) == _rows(images[2], served[2])
    assert not np.array_equal(images[0], images[1])


def test_resumed_epochs_are_the_same_batches_as_uninterrupted_ones(digits: str) -> None:
    _, full = _epochs(digits, 0, 2, range(0, 4))
    _, resumed = _epochs(digits, 0, 2, range(2, 4))
    for a, b in zip(full[2:], resumed, strict=True):
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)


def test_a_run_seeded_0_streams_its_block(digits: str) -> None:
    """The trainer seeds every generator with the run's seed before the input is built; seed 0
    (a user's choice) still gives the rank its block, once per epoch."""
    tf = keras_env.tensorflow()
    x, y = read_arrays(digits, "train")
    tf.keras.utils.set_random_seed(0)
    try:
        plan, epochs = _epochs(digits, 1, 3, range(2))
    finally:
        tf.random.set_seed(None)
    for batches in epochs:
        images = np.concatenate([b[0] for b in batches])
        labels = np.concatenate([b[1] for b in batches])
        block = slice(plan.start, plan.stop)
        assert _rows(images, labels) == _rows(x[block], y[block])


def test_the_input_is_streamed_not_loaded_whole(digits: str) -> None:
    """The rank's pipeline holds no copy of its samples: the constants in its graph are a few
    bytes of bookkeeping, where its block's pixels are 333 x 784 bytes."""
    tf = keras_env.tensorflow()
    plan = plan_rank(dataset.read_manifest(digits), 64, 0, 3)
    pipeline = make_dataset(tf, plan, 7, 0, range(2), 1)
    graph = tf.compat.v1.GraphDef.FromString(pipeline._as_serialized_graph().numpy())
    functions = [n for f in graph.library.function for n in f.node_def]
    constant_bytes = sum(
        len(node.attr["value"].tensor.tensor_content) + len(node.attr["value"].tensor.string_val)
        for node in [*graph.node, *functions]
        if node.op == "Const"
    )
    assert plan.samples * plan.image.pixels > 200_000
    assert constant_bytes < 10_000


def test_shards_on_gcs_are_streamed_and_only_the_ranks_own(
    gcs_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank reading from gs:// streams only the shards that hold its block, through the
    storage layer, and serves what a local reader does."""
    from components.common import storage

    out = f"{gcs_uri}/ds"
    prepare("bundled", out, shard_size=100, data_limit=1000)
    opened: list[str] = []
    real_open = storage.open_read

    def open_read(uri: str):
        opened.append(uri.rpartition("/")[2])
        return real_open(uri)

    monkeypatch.setattr(storage, "open_read", open_read)
    plan, (epoch,) = _epochs(out, 1, 2, range(1))
    images = np.concatenate([b[0] for b in epoch])
    labels = np.concatenate([b[1] for b in epoch])
    assert sorted(opened) == sorted(p.uri.rpartition("/")[2] for p in plan.pieces)
    assert len(opened) == 5  # shards 5..9 of 10, once each
    monkeypatch.undo()
    x, y = read_arrays(out, "train")
    assert _rows(images, labels) == _rows(x[500:1000], y[500:1000])


def test_a_corrupt_shard_on_gcs_fails_its_reader(gcs_uri: str) -> None:
    from components.common import storage, tfrecord

    out = f"{gcs_uri}/ds"
    prepare("bundled", out, shard_size=100, data_limit=200)
    manifest = dataset.read_manifest(out)
    first = manifest.uri(manifest.shards("train")[0])
    data = storage.read_bytes(first)
    storage.write_bytes(first, data[:40] + bytes([data[40] ^ 1]) + data[41:])
    with pytest.raises(Exception, match="record 0: fails its checksum"):
        read_arrays(out, "train")
    assert tfrecord.count_records(data) == 100
