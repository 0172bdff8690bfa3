"""The TrainJob backend of the train component: the same Horovod job as the MPIJob's, run by
Kubeflow Trainer v2 (``trainer.kubeflow.org/v1alpha1``) instead of mpi-operator.

- `manifest`: the pure builders of the project's TrainingRuntime and the run's TrainJob;
- `lifecycle`: `run_trainjob`, which installs the runtime if absent, then creates, follows and
  cancels the TrainJob on a cluster (the shared `components.train.cluster` steps).
"""
