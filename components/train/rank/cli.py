"""The trainer's command line, in each rank: ``mpirun -np N python -m components.train.rank
--data ... --workers N`` (its flags: `components.train.config.from_argv`)."""

from __future__ import annotations

from components.common.failure import one_line_failures
from components.train.config import from_argv
from components.train.rank import heartbeat


def main(argv: list[str] | None = None) -> int:
    """Start this rank's heartbeat if the launcher asks for one (before the slow imports of
    TensorFlow and Horovod: see `components.train.rank.heartbeat`), parse arguments, run the rank
    (an elastic job in Horovod's elastic loop)."""
    with one_line_failures():  # the launcher's HEARTBEAT_ENV is not a number of seconds
        heartbeat.start_from_env()
    from components.train.rank import elastic, trainer

    config = from_argv(argv)
    return trainer.run(config, elastic.train_elastic if config.elastic else None)


if __name__ == "__main__":
    from components.train.rank.held_input import exit_process

    exit_process(main())
