"""Stand-ins for what cannot run on a development or CI machine, shared by the tests and the
benchmarks (never importing either):

- `fake_gcs`: GCS, the real fake-gcs-server, with a fault-injecting proxy;
- `kmock_cluster` (with `kmock_jobs`): the Kubernetes API (kmock) for the real ``kubernetes``
  client, with mpi-operator's part, or Kubeflow Trainer's and JobSet's, played on it;
- `mpijob_harness`: mpi-operator and the kubelet running an MPIJob manifest in Docker
  containers;
- `trainjob_harness`: Kubeflow Trainer v2.3 (MPI plugin), JobSet and the kubelet running a
  TrainingRuntime and a TrainJob the same way;
- `pods` and `kubelet_volumes`, what both harnesses share: a job's pods as containers on one
  Docker network, and Secret and ConfigMap volumes as the kubelet lays them out;
- `jobs` and `outputs`, not stand-ins but shared the same way: a real job run with each line
  of its output stamped, and what a run left behind (models exported, half-written files).
"""
