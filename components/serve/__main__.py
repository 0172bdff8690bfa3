"""``python -m components.serve`` (``make serve``, on the user's machine): see
`components.serve.server`.
"""

import sys

from components.serve.server import main

sys.exit(main())
