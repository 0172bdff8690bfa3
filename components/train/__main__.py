"""``python -m components.train``: the trainer every rank runs."""

import sys

from components.train.cli import main

sys.exit(main())
