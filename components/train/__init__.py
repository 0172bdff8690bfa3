"""Horovod training: the program every rank runs, and how the component launches it."""
