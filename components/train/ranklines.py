"""What a Horovod job's output looks like in the train step's log: each line once.

mpirun's ``--tag-output`` prefixes every chunk a rank writes with ``[job,rank]<stdout>:`` (or
``<stderr>:``; elastic horovodrun: ``[rank]<stdout>:``). A line that every rank prints alike
(a library's warning, a reason all ranks share, the same traceback) is shown once, as the first
rank printed it, tag and all: the same text from another rank is dropped. `RankLines` does that
for the local backend's job (`components.train.launch.run_local_job`) and for the launcher log
the cluster backends stream (`components.train.cluster.lifecycle.LauncherLog`); the job's own
output is unchanged. (The trainer itself has rank 0 alone report what every rank shares:
`components.train.job`.)
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable

# mpirun's tag, and what follows it. mpirun tags each chunk a rank writes, not each line, so a
# line may end with the tag of an empty chunk (the newline written on its own): taken off.
MPI_TAG = re.compile(r"^\[(?:\d+,)?(\d+)\]<std(?:out|err)>:(.*)$")
EMPTY_TAGS = re.compile(r"(\[(?:\d+,)?\d+\]<std(?:out|err)>:)+$")
# How many distinct lines to remember for the cross-rank check (a long job's log is not kept).
REMEMBERED = 2048


class RankLines:
    """A `log` function that passes each line of a job's output on to `log`, once (see the
    module's docstring)."""

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
        if first != rank and text.strip():
            return  # another rank printed this already
        self.log(EMPTY_TAGS.sub("", line) or line)
