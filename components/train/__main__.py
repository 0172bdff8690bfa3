"""``python -m components.train``: the trainer every rank runs. It ends without destroying
its training input (`components.train.held_input`)."""

from components.train.cli import main
from components.train.held_input import exit_process

exit_process(main())
