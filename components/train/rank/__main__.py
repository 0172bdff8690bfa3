"""``python -m components.train.rank``: the trainer every rank runs. It ends without destroying
its training input (`components.train.rank.held_input`)."""

from components.train.rank.cli import main
from components.train.rank.held_input import exit_process

exit_process(main())
