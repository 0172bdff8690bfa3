"""The kfp-horovod pipeline: definition, compilation, local runs and operation on a cluster."""
