"""Data prep: MNIST-format source -> validated, sharded dataset with a manifest."""
