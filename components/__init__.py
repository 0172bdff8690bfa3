"""kfp-horovod components: data prep, Horovod training, evaluation and registration."""

__version__ = "0.1.0"
