"""The train step's cluster backends, one module each (`mpijob`, `trainjob`), and what they share
(`job`, `pods`, `schema`, `launcher_log`, `run`); mpijob.md and trainjob.md describe them. Runs
in the train step's pod and, for the ``render-*`` commands, in the pipeline's CLI. Nothing is
imported eagerly.
"""
