"""What the train step's two cluster backends share: the job's parameters and names, the
launcher's command and the pods' pieces and placement, what the train task's KFP task config
passes through, the CRD-schema check, the API discovery (and ``training_backend=auto``'s
choice), and the lifecycle (create or reattach, follow the launcher's log, cancel, check the
outputs).

The backends themselves say only what differs: `components.train.mpijob` (mpi-operator's
MPIJob) and `components.train.trainjob` (Kubeflow Trainer v2's TrainJob and its runtime).
Nothing here is imported eagerly, so ``kubernetes`` and ``jsonschema`` load only where a
manifest is validated or a job is run.
"""
