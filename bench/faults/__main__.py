"""``python -m bench.faults``."""

from bench.faults import main

raise SystemExit(main())
