"""Root conftest: makes the shared fixtures of ``tests/conftest.py`` (``gcs_bucket``, ``gcs_uri``)
available to the component test folders too."""

pytest_plugins = ["tests.conftest"]
