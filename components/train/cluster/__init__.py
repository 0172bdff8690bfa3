"""The train step's cluster backends: one job module (`job`: parameters, names, what a backend
is; `pods`: the launcher's command and the pods' pieces; `crd`: the CRD-schema check), one
module per backend (`mpijob`: mpi-operator's MPIJob; `trainjob`: Kubeflow Trainer v2's TrainJob
and its runtime), and one run (`run`: create or reattach, follow the launcher's log, cancel,
check the outputs). Nothing is imported eagerly: ``kubernetes`` and ``jsonschema`` load only
where a manifest is validated or a job is run.
"""
