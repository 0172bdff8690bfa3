"""Stand-ins for what cannot run on a development or CI machine, shared by the tests and the
benchmarks (never importing either):

- `fake_gcs`: GCS, the real fake-gcs-server, with a fault-injecting proxy;
- `kmock_cluster` (with `kmock_jobs` and `kmock_api`): the Kubernetes API (kmock) for the real
  ``kubernetes`` client, with the API server's handling of custom resources (pruning, Strict
  field validation, OpenAPI documents) from the CRDs of a chosen Kubeflow Trainer release, and
  mpi-operator's part, or Kubeflow Trainer's and JobSet's, played on it;
- `pods`: the kubelet, running a job's pods in Docker containers on one network, and what
  the two operators' harnesses share (sshd workers, SSH and hostfile volumes, the launcher's
  run, logs, teardown); `mpijob_harness` (mpi-operator) and `trainjob_harness` (Kubeflow
  Trainer v2.3 with its MPI plugin, and JobSet) say how each operator makes the pods;
- `jobs`, `outputs` and `waiting`, not stand-ins but shared the same way: a real job run with
  each line of its output stamped, what a run left behind (models exported, half-written
  files), and the one way to wait for another process or thread (for the event, under a
  ceiling only a hang reaches, failing loudly).
"""
