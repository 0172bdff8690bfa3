"""The conformance suite's fixture: each launcher's job (`tests.horovod.jobs.launch`), run once."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.horovod.jobs import Launch, launch


@pytest.fixture(scope="session")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Launch]:
    """``launched(controller)``: that launcher's job, run once per session on first use."""
    done: dict[str, Launch] = {}

    def get(controller: str) -> Launch:
        if controller not in done:
            done[controller] = launch(controller, tmp_path_factory.mktemp(controller))
        return done[controller]

    return get
