"""``python -m components.serve``: see `components.serve.server`."""

import sys

from components.serve.server import main

sys.exit(main())
