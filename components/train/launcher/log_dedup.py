"""The job's log with duplicates across ranks dropped: `RankLines` passes a line every rank prints
alike (a library's warning, the same traceback) on once, as the first rank printed it. Runs in
the launcher (a local job's log) and in the train step's pod (a cluster job's launcher log).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable

# mpirun's ``--tag-output`` (horovodrun's ``[rank]<stdout>:``) names each line's rank; a local job's
# log (`components.train.launcher.launch.run_local_job`) and a cluster job's launcher log
# (`components.train.launcher.cluster.launcher_log`) both go through it.
MPI_TAG = re.compile(r"^\[(?:\d+,)?(\d+)\]<std(?:out|err)>:(.*)$")
EMPTY_TAGS = re.compile(r"(\[(?:\d+,)?\d+\]<std(?:out|err)>:)+$")  # a chunk of just a newline
REMEMBERED = 2048  # distinct lines kept for the cross-rank check


class RankLines:
    """A `log` that passes a line every rank prints alike (a library's warning, the same
    traceback) on once, as the first rank printed it; other lines all pass."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.seen: collections.OrderedDict[str, int] = collections.OrderedDict()

    def __call__(self, line: str) -> None:
        tagged = MPI_TAG.match(line)
        if tagged is None:
            self.log(line)
            return
        rank, text = int(tagged[1]), EMPTY_TAGS.sub("", tagged[2])
        first = self.seen.setdefault(text, rank)
        self.seen.move_to_end(text)
        if len(self.seen) > REMEMBERED:
            self.seen.popitem(last=False)
        if first == rank or not text.strip():
            self.log(EMPTY_TAGS.sub("", line) or line)
