"""The registry's guarantees raced for real on local disk and on gs:// (fake-gcs-server, which
enforces ``ifGenerationMatch``), in threads and in processes: version numbers, the alias, and the
serving folder under concurrent promotions. Were preconditions ignored, two writers would take
one version number, or two alias writers replace one record (`assert_one_alias_chain`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from components.common import model_files, storage
from components.register.registry import STAGING, ModelStore, challenger_wins
from components.register.serving import ServingFolder
from components.register.tests.registering import register_run

ACCURACIES = [0.91, 0.97, 0.93, 0.99, 0.92, 0.95, 0.94, 0.96]  # 8 concurrent writers


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


class Poller:
    """Polls the model store the way servers would while registrations run (in a thread): every
    version that `published_versions` reports must hold the whole SavedModel, byte for byte; the
    production alias's accuracy must never go down; the serving folder's versions are kept."""

    def __init__(self, root: str, model_dir: str, workdir: Path) -> None:
        self.folder = ServingFolder(ModelStore(root, "mnist-cnn"))
        self.model_dir, self.workdir = Path(model_dir), workdir
        workdir.mkdir(parents=True)
        self.store = self.folder.store
        self.loaded: set[int] = set()
        self.alias_accuracies: list[float] = []
        self.serving: list[list[int]] = []
        self._done, self._pool = threading.Event(), ThreadPoolExecutor(1)
        self._polling = self._pool.submit(self._run)

    def poll(self) -> None:
        for version in set(self.store.published_versions()) - self.loaded:
            local = model_files.fetch_model(self.store.version_uri(version), self.workdir)
            for src in self.model_dir.rglob("*"):
                if src.is_file():
                    rel = src.relative_to(self.model_dir)
                    assert (local / rel).read_bytes() == src.read_bytes(), (version, rel)
            self.loaded.add(version)
        alias, _ = self.store.read_alias("production")
        if alias is not None:
            self.alias_accuracies.append(alias["metrics"]["accuracy"])
        self.serving.append(self.folder.versions())

    def _run(self) -> None:
        while not self._done.is_set():
            self.poll()
        self.poll()  # once more after the last write

    def stop(self) -> None:
        """Stop polling; raise what the poller saw go wrong."""
        self._done.set()
        self._polling.result(timeout=600)
        self._pool.shutdown()


def test_concurrent_registrations(
    trained_model, trained_summary, storage_root: str, alias_writes, tmp_path: Path
) -> None:
    """8 runs and 3 attempts of one more run, in threads: distinct consecutive numbers, the
    same run's attempts one version, the alias on the best, the serving folder never empty once
    a version is in it and holding the alias's version at the end, and a poller that never sees
    a version it cannot load."""
    poller = Poller(storage_root, trained_model.path, tmp_path / "poller")
    try:
        jobs = [(f"run-{i}", a) for i, a in enumerate(ACCURACIES)] + [("same-run", 0.9)] * 3
        barrier = threading.Barrier(len(jobs))  # all released at once

        def register(job: tuple[str, float]) -> Any:
            barrier.wait()
            return register_run(trained_model, trained_summary, storage_root, *job)

        with ThreadPoolExecutor(len(jobs)) as pool:
            decisions = list(pool.map(register, jobs))  # raises the first error
    finally:
        poller.stop()  # raises what it saw go wrong
    store = poller.store
    versions = [d.version for d in decisions[: len(ACCURACIES)]]
    same = {d.version for d in decisions[len(ACCURACIES) :]}
    assert len(same) == 1 and len(set(versions) | same) == len(ACCURACIES) + 1
    assert store.published_versions() == sorted(set(versions) | same)
    assert (store.find_run("same-run") or {}).get("version") in same
    claimed = store.claimed_versions()  # the same run's losing attempts leave gaps, no holes
    assert claimed == list(range(1, len(claimed) + 1)) and len(claimed) <= len(jobs)
    for i, version in enumerate(versions):
        meta = store.read_metadata(version)
        assert (meta["version"], meta["pipeline_run_id"]) == (version, f"run-{i}")
    best = ACCURACIES.index(max(ACCURACIES))
    final = store.read_alias("production")[0]
    assert final["version"] == versions[best] and decisions[best].promoted
    assert_one_alias_chain(alias_writes, final)
    assert storage.list_files(storage.join(store.base, STAGING)) == []  # staged copies removed
    assert poller.loaded == set(store.published_versions())
    assert poller.alias_accuracies == sorted(poller.alias_accuracies)
    assert poller.folder.versions() == [versions[best]] and poller.folder.matches(versions[best])
    first = next(i for i, seen in enumerate(poller.serving) if seen)
    assert all(poller.serving[first:]), "the folder was empty after a version had been published"


def _candidate(version: int, accuracy: float) -> dict[str, Any]:
    return {"version": version, "metrics": {"accuracy": accuracy, "loss": 0.1}}


@pytest.mark.parametrize(("rival", "ends_on"), [(0.97, 3), (0.92, 2)])
def test_a_writer_that_loses_the_alias_race_decides_again(storage_root, rival, ends_on) -> None:
    """Between writer A's read of the alias (version 1) and its write, a rival promotes version
    3. A's write is refused (stale token), A re-reads and decides against version 3."""
    store = ModelStore(storage_root, "m")
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
from components.register.registry import ModelStore, challenger_wins
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


def test_concurrent_claims_and_alias_moves_across_processes(storage_root: str) -> None:
    """8 processes race for version numbers (5 each) and for the alias, locally (O_EXCL, flock)
    and on gs:// (ifGenerationMatch)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, storage_root, f"p{i}", str(a)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i, a in enumerate(ACCURACIES)
    ]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    claimed = [v for out in outs for v in out["versions"]]
    assert sorted(claimed) == list(range(1, 41))  # 40 claims, no duplicates, no gaps
    final = ModelStore(storage_root, "m").read_alias("production")[0]
    assert final["version"] == outs[ACCURACIES.index(max(ACCURACIES))]["last"]
    assert_one_alias_chain([w for out in outs for w in out["written"]], final)
