"""``python -m bench.faults``."""

import sys

from bench.faults import main

sys.exit(main())
