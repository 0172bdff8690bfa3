"""The operations' defaults and limits, in a module that imports no ``kfp``: the click layer
reads them when ``python -m pipeline`` starts, and ``--help`` should not import ``kfp`` (which
imports ``kubernetes``)."""

from __future__ import annotations

from pathlib import Path

from components.common import defaults

DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_PACKAGE = Path("build/pipeline.yaml")
DEFAULT_PIPELINE_NAME = defaults.PIPELINE_NAME
DEFAULT_EXPERIMENT = "Default"
# The KFP API's upper bound on a recurring run's max_concurrency.
MAX_CONCURRENCY_LIMIT = 10
