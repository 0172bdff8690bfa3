"""Horovod training, in rooms by process: ``step/`` (the KFP step's pod), ``launcher/`` (what
starts and watches the ranks) and ``rank/`` (what each rank runs); ``config.py`` and
``summary.py`` are shared by all three.
"""
