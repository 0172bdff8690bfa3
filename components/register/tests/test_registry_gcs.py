"""The registry's guarantees raced for real on gs:// (fake-gcs-server, which enforces
``ifGenerationMatch`` on writes; see tests/conftest.py), in threads and in processes.

Each check is built so that it fails if the guarantee does not hold: with an emulator (or a
store) that ignored preconditions, two writers would take the same version number, and two alias
writers would both replace the same record, which `assert_one_alias_chain` catches.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from components.common import storage
from components.evaluate.saved_model import check_saved_model
from components.register.decision import challenger_wins
from components.register.registry import METADATA_FILE, SAVED_MODEL_PB, STAGING, ModelStore
from components.register.tests.registering import register_run as _register

ACCURACIES = [0.91, 0.97, 0.93, 0.99, 0.92, 0.95, 0.94, 0.96]  # 8 concurrent writers


def _in_threads(jobs: list[tuple[Any, ...]], work: Callable[..., Any]) -> list[Any]:
    """Run ``work(*job)`` for every job at once (released together by a barrier)."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(*jobs[i])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    return results


@pytest.fixture
def alias_writes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every alias record whose compare-and-swap write succeeded (a pass-through spy)."""
    written: list[dict[str, Any]] = []
    lock = threading.Lock()
    real = storage.write_if_unchanged

    def spy(uri: str, data: bytes, token: str) -> bool:
        ok = real(uri, data, token)
        if ok and "/_aliases/" in uri:
            with lock:
                written.append(json.loads(data))
        return ok

    monkeypatch.setattr(storage, "write_if_unchanged", spy)
    return written


def assert_one_alias_chain(writes: list[dict[str, Any]], final: dict[str, Any]) -> None:
    """Each successful alias write replaced exactly the record before it (no lost update), and
    accuracy rose at every step: the alias never moved to a worse (or equal) model."""
    by_previous: dict[Any, dict[str, Any]] = {}
    for record in writes:
        previous = (record.get("previous") or {}).get("version")
        assert previous not in by_previous, f"two alias writes replaced version {previous}"
        by_previous[previous] = record
    chain, current = [], None
    while current in by_previous and len(chain) <= len(writes):
        chain.append(by_previous[current])
        current = chain[-1]["version"]
    assert len(chain) == len(writes) and chain[-1]["version"] == final["version"]
    accuracies = [r["metrics"]["accuracy"] for r in chain]
    assert accuracies == sorted(set(accuracies)), accuracies  # strictly rising


def _expected_files(trained_model: Any) -> set[str]:
    src = Path(trained_model.path)
    return {p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file()} | {METADATA_FILE}


def _files_below(prefix: str) -> set[str]:
    return {uri[len(prefix) + 1 :] for uri in storage.list_files(prefix)}


class Poller:
    """Polls the model store the way a server would while registrations run (in a thread):
    every version that `published_versions` reports must hold the whole SavedModel, byte for
    byte, and pass the loader's checks; the production alias's accuracy must never go down."""

    def __init__(self, store: ModelStore, model_dir: str, workdir: Path) -> None:
        self.store, self.model_dir, self.workdir = store, Path(model_dir), workdir
        self.loaded: set[int] = set()
        self.alias_accuracies: list[float] = []
        self._done = threading.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def poll(self) -> None:
        for version in self.store.published_versions():
            if version not in self.loaded:
                self._load(version)
        alias, _ = self.store.read_alias("production")
        if alias is not None:
            self.alias_accuracies.append(alias["metrics"]["accuracy"])

    def _load(self, version: int) -> None:
        local = storage.download_dir(self.store.version_uri(version), self.workdir / str(version))
        check_saved_model(local)  # raises if saved_model.pb or the variables index is missing
        for src in self.model_dir.rglob("*"):
            if src.is_file():
                rel = src.relative_to(self.model_dir)
                assert (local / rel).read_bytes() == src.read_bytes(), (version, rel)
        self.loaded.add(version)

    def _run(self) -> None:
        try:
            while not self._done.is_set():
                self.poll()
            self.poll()  # once more after the last write
        except BaseException as exc:  # reported by stop()
            self._errors.append(exc)

    def stop(self) -> None:
        """Stop polling; raise what the poller saw go wrong."""
        self._done.set()
        self._thread.join(timeout=600)
        assert not self._errors, self._errors


@pytest.fixture
def poller(gcs_uri: str, trained_model: Any, tmp_path: Path) -> Iterator[Poller]:
    """A `Poller` on ``<gcs_uri>/registry``, started; the test calls ``stop()``."""
    store = ModelStore(f"{gcs_uri}/registry", "mnist-cnn")
    watch = Poller(store, trained_model.path, tmp_path / "poller")
    try:
        yield watch
    finally:
        watch._done.set()
        watch._thread.join(timeout=600)


def test_eight_concurrent_registrations_on_gcs(
    trained_model, summary, gcs_uri: str, alias_writes, poller, tmp_path: Path
) -> None:
    """8 runs in threads: 8 distinct consecutive versions, the alias on the best, and a poller
    that never sees a version it cannot load."""
    root = f"{gcs_uri}/registry"
    jobs = [(trained_model, summary, root, f"run-{i}", a) for i, a in enumerate(ACCURACIES)]
    decisions = _in_threads(jobs, _register)
    store = ModelStore(root, "mnist-cnn")
    versions = [d.version for d in decisions]
    assert sorted(versions) == list(range(1, 9))  # none lost, none shared
    assert store.claimed_versions() == store.published_versions() == list(range(1, 9))
    for i, d in enumerate(decisions):
        meta = store.read_metadata(d.version)
        assert (meta["version"], meta["pipeline_run_id"]) == (d.version, f"run-{i}")
    final = store.read_alias("production")[0]
    assert final["version"] == versions[ACCURACIES.index(max(ACCURACIES))]
    assert decisions[ACCURACIES.index(max(ACCURACIES))].promoted
    assert_one_alias_chain(alias_writes, final)
    assert storage.list_files(f"{root}/mnist-cnn/{STAGING}") == []  # staged copies removed
    poller.stop()  # raises what it saw go wrong
    assert poller.loaded == set(range(1, 9))
    assert poller.alias_accuracies == sorted(poller.alias_accuracies)


def test_four_concurrent_attempts_of_one_run_on_gcs_make_one_version(
    trained_model, summary, gcs_uri: str
) -> None:
    root = f"{gcs_uri}/registry"
    jobs = [(trained_model, summary, root, "same-run", 0.95)] * 4
    decisions = _in_threads(jobs, _register)
    store = ModelStore(root, "mnist-cnn")
    assert store.published_versions() == [decisions[0].version]
    assert {d.version for d in decisions} == {decisions[0].version}
    assert (store.find_run("same-run") or {}).get("version") == decisions[0].version
    assert store.read_alias("production")[0]["version"] == decisions[0].version
    # The losing attempts' claimed numbers stay unused (gaps), never a second version.
    assert 1 <= len(store.claimed_versions()) <= 4


def _candidate(version: int, accuracy: float) -> dict[str, Any]:
    return {"version": version, "metrics": {"accuracy": accuracy, "loss": 0.1}}


@pytest.mark.parametrize(("rival", "ends_on"), [(0.97, 3), (0.92, 2)])
def test_a_writer_that_loses_the_alias_race_decides_again(root: str, rival, ends_on) -> None:
    """Between writer A's read of the alias (version 1) and its write, a rival promotes version
    3. A's write is refused (stale generation), A re-reads and decides against version 3."""
    store = ModelStore(root, "m")
    assert store.move_alias_if("production", _candidate(1, 0.90), challenger_wins)[0]
    seen: list[int] = []

    def wins_with_a_rival_in_between(candidate, current):
        seen.append(current["version"])
        if len(seen) == 1:
            rival_wins = store.move_alias_if("production", _candidate(3, rival), challenger_wins)
            assert rival_wins[0]
        return challenger_wins(candidate, current)

    promoted, reason, _ = store.move_alias_if(
        "production", _candidate(2, 0.95), wins_with_a_rival_in_between
    )
    assert seen == [1, 3]  # decided twice: on what it read, then on what the rival wrote
    alias = store.read_alias("production")[0]
    assert alias["version"] == ends_on and promoted == (ends_on == 2)
    if ends_on == 3:
        assert reason == "accuracy 0.9500 does not beat 0.9700 of version 3"
        assert alias["previous"]["version"] == 1
    else:
        assert alias["previous"]["version"] == 3  # replaced the rival, not the record it first read


WORKER = """
import json, sys
from components.common import storage
from components.register.registry import ModelStore
from components.register import register as rg
from components.register.decision import challenger_wins
root, name, accuracy = sys.argv[1], sys.argv[2], float(sys.argv[3])
written, real = [], storage.write_if_unchanged
def spy(uri, data, token):
    ok = real(uri, data, token)
    if ok:
        written.append(json.loads(data))
    return ok
storage.write_if_unchanged = spy
store = ModelStore(root, "m")
got = [store.claim_next_version({"by": name}) for _ in range(5)]
candidate = {"version": got[-1], "metrics": {"accuracy": accuracy, "loss": 0.1}}
promoted, reason, _ = store.move_alias_if("production", candidate, challenger_wins)
print(json.dumps({"versions": got, "last": got[-1], "promoted": promoted, "written": written}))
"""


def test_concurrent_claims_and_alias_moves_across_processes(root: str) -> None:
    """8 processes race for version numbers (5 each) and for the alias, locally (O_EXCL, flock)
    and on gs:// (ifGenerationMatch)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, root, f"p{i}", str(a)], stdout=subprocess.PIPE, text=True
        )
        for i, a in enumerate(ACCURACIES)
    ]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    claimed = [v for out in outs for v in out["versions"]]
    assert sorted(claimed) == list(range(1, 41))  # 40 claims, no duplicates, no gaps
    final = ModelStore(root, "m").read_alias("production")[0]
    assert final["version"] == outs[ACCURACIES.index(max(ACCURACIES))]["last"]
    assert_one_alias_chain([w for out in outs for w in out["written"]], final)


def test_no_partial_version_is_visible_at_any_step_of_a_gcs_publish(
    trained_model, summary, gcs_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is inspected after every single object write, copy and delete of a
    registration: a reader keyed on saved_model.pb never sees a partial version, and the
    numeric directory (what TF Serving lists) exists incomplete only while the staged copy is
    already whole, i.e. during the server-side copies, never during the upload."""
    from google.cloud.storage.blob import Blob

    root = f"{gcs_uri}/registry"
    store, expected = ModelStore(root, "mnist-cnn"), _expected_files(trained_model)
    states: list[str] = []

    def inspect() -> None:
        for version in store.published_versions():
            assert _files_below(store.version_uri(version)) == expected, version
        visible = _files_below(store.version_uri(1))
        if not visible:
            states.append("absent")
        elif visible == expected:
            states.append("complete")
        else:
            staged = [_files_below(p) for p in _staging_dirs(store)]
            assert expected in staged, f"version 1 partial while staging was not whole: {visible}"
            assert SAVED_MODEL_PB not in visible
            states.append("copying")

    for method in ("upload_from_filename", "rewrite", "delete"):
        real = getattr(Blob, method)

        def spy(self, *args, _real=real, **kwargs):
            out = _real(self, *args, **kwargs)
            inspect()
            return out

        monkeypatch.setattr(Blob, method, spy)
    assert _register(trained_model, summary, root, "run-1", 0.95).version == 1
    n = len(expected)
    assert states[: 2 * n] == ["absent"] * n + ["copying"] * (n - 1) + ["complete"]
    assert set(states[2 * n :]) == {"complete"}  # deleting the staged copy
    assert list(_staging_dirs(store)) == []


def _staging_dirs(store: ModelStore) -> set[str]:
    prefix = storage.join(store.base, STAGING)
    return {uri[: uri.index("/", len(prefix) + 1)] for uri in storage.list_files(prefix)}
